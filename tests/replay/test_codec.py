"""Every array column comes back with its dtype, shape and every bit, through a real Parquet file."""

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rltrace.replay import codec
from tests.replay.tiny import same_bits


def through_parquet(tmp_path, arrays: dict) -> pa.Table:
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table(arrays), path)
    return pq.read_table(path)


def round_trip_rows(tmp_path, name, column):
    arrays, spec = codec.encode_rows(name, column)
    table = through_parquet(tmp_path, arrays)
    shapes = table.column(spec["shape_column"]) if spec.get("shape_column") else None
    return codec.decode(table.column(name), spec, shapes), spec


def round_trip_batched(tmp_path, name, value):
    arrays, spec = codec.encode_batched(name, value, value.shape[0])
    table = through_parquet(tmp_path, arrays)
    return codec.decode(table.column(name), spec), spec


def special_floats(dtype: torch.dtype) -> torch.Tensor:
    """NaN with a payload, both infinities, -0.0, the smallest subnormal, extremes."""
    finfo = torch.finfo(dtype)
    values = torch.tensor([0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, finfo.max, finfo.min, finfo.tiny], dtype=torch.float64).to(dtype)
    if dtype.itemsize in (2, 4, 8):
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
        nan = {2: 0x7D01 if dtype == torch.float16 else 0x7F81, 4: 0x7FC01234, 8: 0x7FF8000000001234}[dtype.itemsize]
        subnormal = torch.tensor([1], dtype=bits).view(dtype)
        values = torch.cat([values, torch.tensor([nan], dtype=bits).view(dtype), subnormal])
    return values


FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_tensors_keep_every_bit_per_sample(tmp_path, dtype):
    base = special_floats(dtype) if dtype.itemsize > 1 else torch.randn(9).to(dtype)
    column = [base, torch.randn(3).to(dtype), None, base[:0]]
    out, spec = round_trip_rows(tmp_path, "x", column)
    assert spec["dtype"] == str(dtype).removeprefix("torch.")
    assert out[2] is None
    for a, b in zip(column, out):
        assert a is None or same_bits(a, b)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_tensors_keep_every_bit_including_extremes(tmp_path, dtype):
    if dtype == torch.bool:
        column = [torch.tensor([True, False, True]), torch.tensor([False])]
    else:
        info = torch.iinfo(dtype)
        column = [torch.tensor([info.min, info.max, 0], dtype=dtype), torch.tensor([1, 2], dtype=dtype)]
    out, _ = round_trip_rows(tmp_path, "x", column)
    assert all(same_bits(a, b) for a, b in zip(column, out))


def test_token_ids_are_stored_narrow_and_come_back_int64(tmp_path):
    arrays, spec = codec.encode_rows("tokens", [torch.arange(5), torch.arange(100_000, 100_003)])
    assert arrays["tokens"].type.value_type == pa.int32()
    assert spec["storage"] == "int32" and spec["dtype"] == "int64"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_batched_tensor_comes_back_as_one_tensor_of_the_same_shape(tmp_path, dtype):
    value = torch.randn(4, 3, 2).to(dtype)
    out, spec = round_trip_batched(tmp_path, "x", value)
    assert spec["layout"] == "batched"
    assert same_bits(value, out)


def test_batched_vector_is_one_scalar_per_sample(tmp_path):
    value = torch.tensor([0.5, 1.0, -3.0], dtype=torch.float32)
    arrays, spec = codec.encode_batched("reward", value, 3)
    assert arrays["reward"].type == pa.float64()  # canonical column type; decoded back to float32
    out = codec.decode(through_parquet(tmp_path, arrays).column("reward"), spec)
    assert same_bits(value, out)


def test_multidimensional_rows_keep_their_shape(tmp_path):
    same_tail = [torch.randn(5, 2, 3), torch.randn(1, 2, 3)]
    out, spec = round_trip_rows(tmp_path, "experts", same_tail)
    assert spec["inner"] == [2, 3]
    assert all(same_bits(a, b) for a, b in zip(same_tail, out))
    ragged = [torch.randn(2, 3), torch.randn(3, 2), torch.randn(0, 4)]
    out, spec = round_trip_rows(tmp_path, "topk", ragged)
    assert spec["shape_column"] == "_shape_topk"
    assert all(same_bits(a, b) for a, b in zip(ragged, out))


def test_zero_dim_tensors_and_numpy_values(tmp_path):
    scalars = [torch.tensor(0.5, dtype=torch.bfloat16), None, torch.tensor(-1.0, dtype=torch.bfloat16)]
    out, _ = round_trip_rows(tmp_path, "x", scalars)
    assert out[1] is None and same_bits(scalars[0], out[0]) and same_bits(scalars[2], out[2])
    arrays = [np.array([1, 2], np.int16), np.array([[1.5, 2.5]], np.float32)]
    out, spec = round_trip_rows(tmp_path, "n", [arrays[0], np.array([3], np.int16)])
    assert spec["kind"] == "numpy" and same_bits(arrays[0], out[0])
    out, _ = round_trip_rows(tmp_path, "m", [arrays[1]])
    assert same_bits(arrays[1], out[0])


def test_python_values_come_back_as_python_values(tmp_path):
    assert round_trip_rows(tmp_path, "ids", [[1, 2, 3], None, []])[0] == [[1, 2, 3], None, []]
    floats, _ = round_trip_rows(tmp_path, "lp", [[-0.1, 0.30000000000000004], [1e-300]])
    assert floats == [[-0.1, 0.30000000000000004], [1e-300]]
    assert round_trip_rows(tmp_path, "flags", [[True, False]])[0] == [[True, False]]
    assert round_trip_rows(tmp_path, "reward", [1, 0.5, None])[0] == [1.0, 0.5, None]
    assert round_trip_rows(tmp_path, "seed", [7, 2**62])[0] == [7, 2**62]
    assert round_trip_rows(tmp_path, "finish_reason", ["stop", None])[0] == ["stop", None]
    meta = [{"a": [1, {"b": "x"}]}, None, {"ü": 1.5}]
    assert round_trip_rows(tmp_path, "metadata", meta)[0] == meta
    assert round_trip_rows(tmp_path, "nested", [[[1, 2], [3]], [["a"]]])[0] == [[[1, 2], [3]], [["a"]]]


def test_a_column_with_two_dtypes_is_refused():
    with pytest.raises(TypeError, match="different dtypes"):
        codec.encode_rows("lp", [torch.zeros(2), torch.zeros(2, dtype=torch.float64)])


def test_a_column_mixing_tensors_and_numbers_is_refused():
    with pytest.raises(TypeError, match="mixes"):
        codec.encode_rows("x", [torch.zeros(2), 1.0])


def test_complex_tensors_are_refused_with_the_dtype_named():
    with pytest.raises(TypeError, match="complex64"):
        codec.encode_rows("x", [torch.zeros(2, dtype=torch.complex64)])


def test_tensors_inside_json_are_refused_with_the_sample_named():
    with pytest.raises(TypeError, match="sample 1"):
        codec.encode_rows("metadata", [{"a": 1}, {"t": torch.zeros(2)}])
