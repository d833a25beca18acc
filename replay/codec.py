"""One column of a frozen batch <-> one Arrow column, bit-exact, with a JSON spec to undo it.

A column arrives in one of five kinds, recorded in its spec so `load` gives it back the same way:

    torch   torch tensors: one per sample (layout "rows") or one [B, ...] tensor (layout "batched")
    numpy   numpy arrays or scalars, the same two layouts
    list    Python lists of numbers (comes back as lists; ints stay ints, floats are float64)
    scalar  Python bool / int / float / str, one per sample
    json    anything else JSON holds (dicts, lists of strings, nested lists; tuples come back as lists)

Arrays are stored as one list column per row (DuckDB sees INTEGER[], FLOAT[] ...), elements
flattened row-major; a row of more than one dimension keeps its trailing shape in the spec
(`inner`) or, when it varies, in a companion column `_shape_<name>`. Storage keeps every bit:
integers are narrowed to the smallest type that holds the column's range and widened back;
float16 is stored as Parquet FLOAT16; bfloat16 as float32 whose upper 16 bits are the bf16 bits
(exact, and DuckDB sees the true values); any other dtype (float8, complex) as raw bits.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rltrace import _names

ARRAY_KINDS = ("torch", "numpy")
SHAPE_PREFIX = "_shape_"
# Parquet stores 8- and 16-bit integers as 32-bit: narrowing further would save nothing on disk.
_INT_LADDER = {"i": (np.int32, np.int64), "u": (np.uint32, np.uint64)}
_NUMPY_NATIVE = {
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32", "float64",
}
_JSON_CANONICAL = {"reward_components", "sampling_params", "metadata"}


def _torch():
    import torch

    return torch


_GIL_SLICE_S = 0.0005  # the writer thread holds the GIL at most about this long at a time


def _paced(column: Sequence[Any]):
    """Iterate, releasing the GIL every half millisecond: this runs on the writer thread, and the
    training thread must never wait the interpreter's 5 ms switch interval to get the GIL back."""
    last = time.perf_counter()
    for i, value in enumerate(column):
        if i & 31 == 31 and time.perf_counter() - last > _GIL_SLICE_S:
            time.sleep(0)
            last = time.perf_counter()
        yield value


def kind_of(value: Any) -> str | None:
    """The kind of one value (see the module docstring); None for None."""
    if value is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return "torch"
    if isinstance(value, (np.ndarray, np.generic)):
        return "numpy"
    if isinstance(value, (bool, int, float, str)):
        return "scalar"
    if isinstance(value, (list, tuple)) and value and all(type(v) in (int, float, bool) for v in value[:8]):
        return "list"
    return "json"


# --- encode ------------------------------------------------------------------------------------
def _flat_numpy(value: Any, kind: str) -> tuple[np.ndarray, str, str, tuple[int, ...]]:
    """A 1-D CPU numpy array of one value's elements: (array, original dtype, storage, shape)."""
    if kind == "torch":
        torch = _torch()
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        shape = tuple(t.shape)
        flat = t.reshape(-1)
        if t.dtype == torch.bfloat16:
            return flat.view(torch.int16).numpy().view(np.uint16), dtype, "bf16", shape
        if dtype in _NUMPY_NATIVE:
            return flat.numpy(), dtype, "native", shape
        size = t.element_size()
        if size not in (1, 2, 4, 8) or t.is_complex():
            raise TypeError(f"torch dtype {dtype} cannot be frozen (real numbers and bools only)")
        return flat.view(torch.uint8).numpy().view(f"<u{size}"), dtype, "bits", shape
    arr = np.asarray(value)
    if arr.dtype.name in _NUMPY_NATIVE:
        return np.ascontiguousarray(arr).reshape(-1), arr.dtype.str, "native", arr.shape
    if arr.dtype.kind == "V" and arr.dtype.itemsize in (1, 2, 4, 8):  # ml_dtypes bfloat16, float8, ...
        flat = np.ascontiguousarray(arr).reshape(-1)
        return flat.view(f"<u{arr.dtype.itemsize}"), arr.dtype.str, "bits", arr.shape
    raise TypeError(f"numpy dtype {arr.dtype} cannot be frozen (real numbers and bools only)")


def _storage_values(values: np.ndarray, storage: str) -> tuple[pa.Array, str]:
    """Arrow values for a flat array, narrowing integers; returns (array, storage tag)."""
    if storage == "bf16":
        return pa.array((values.astype(np.uint32) << 16).view(np.float32)), "bf16"
    if storage == "native" and values.dtype.kind in "iu" and values.size and values.dtype.itemsize > 4:
        lo, hi = values.min(), values.max()
        for candidate in _INT_LADDER[values.dtype.kind]:
            info = np.iinfo(candidate)
            if info.min <= lo and hi <= info.max:
                if candidate != values.dtype.type:
                    return pa.array(values.astype(candidate)), np.dtype(candidate).name
                break
    return pa.array(values), storage


def _list_array(values: pa.Array, lengths: np.ndarray, nulls: np.ndarray | None) -> pa.Array:
    total = int(lengths.sum())
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64 if total >= 2**31 else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    item = pa.field("item", values.type, nullable=False)
    typ = pa.large_list(item) if offsets.dtype == np.int64 else pa.list_(item)
    cls = pa.LargeListArray if offsets.dtype == np.int64 else pa.ListArray
    mask = None if nulls is None else pa.array(nulls)
    return cls.from_arrays(pa.array(offsets), values, type=typ, mask=mask)


def encode_batched(name: str, value: Any, n: int) -> tuple[dict[str, pa.Array], dict]:
    """Arrow column and spec for one [n, ...] tensor or array holding the whole batch."""
    kind = kind_of(value)
    flat, dtype, storage, shape = _flat_numpy(value, kind)
    if not shape or shape[0] != n:
        raise ValueError(f"column {name!r}: batched array of shape {list(shape)} does not have {n} rows")
    values, storage = _storage_values(flat, storage)
    spec = {"kind": kind, "dtype": dtype, "layout": "batched", "shape": list(shape), "storage": storage}
    if len(shape) == 1:
        values, spec["storage"] = _canonical_scalar(name, values, storage)
        spec["scalar"] = True
        return {name: values}, spec
    row = math.prod(shape[1:])
    return {name: _list_array(values, np.full(n, row, dtype=np.int64), None)}, spec


def _canonical_scalar(name: str, values: pa.Array, storage: str) -> tuple[pa.Array, str]:
    """One number per sample in a column with a fixed type (`reward` DOUBLE, `sample_id` BIGINT, ...):
    stored as that type, so queries read it as a number; the spec's storage then names that type
    (decoding casts back to the dtype given, bf16 included). Raw bits keep their own storage."""
    canonical = _names.BATCH_SAMPLE_COLUMNS.get(name)
    if canonical is None or values.type == canonical or storage == "bits":
        return values, storage
    return values.cast(canonical), canonical.to_pandas_dtype().__name__


def _encode_array_rows(name: str, column: Sequence[Any], kind: str) -> tuple[dict[str, pa.Array], dict]:
    parts, shapes, dtypes, storages = [], [], set(), set()
    for value in _paced(column):
        if value is None:
            parts.append(None)
            shapes.append(None)
            continue
        if kind_of(value) != kind:
            raise TypeError(f"column {name!r}: mixes {kind} and {type(value).__name__} values")
        flat, dtype, storage, shape = _flat_numpy(value, kind)
        parts.append(flat)
        shapes.append(shape)
        dtypes.add(dtype)
        storages.add(storage)
    if len(dtypes) != 1:
        raise TypeError(f"column {name!r}: samples have different dtypes {sorted(dtypes)}; use one dtype per column")
    dtype, storage = dtypes.pop(), storages.pop()
    present = [p for p in parts if p is not None]
    ndims = {len(s) for s in shapes if s is not None}
    nulls = np.array([p is None for p in parts]) if len(present) < len(parts) else None
    spec: dict = {"kind": kind, "dtype": dtype, "layout": "rows"}
    if ndims == {0}:
        filler = np.zeros(1, dtype=present[0].dtype)
        values, storage = _storage_values(np.concatenate([filler if p is None else p for p in parts]), storage)
        arr, storage = _canonical_scalar(name, values, storage)
        spec.update(storage=storage, scalar=True)
        return {name: arr if nulls is None else pa.array(arr.to_numpy(zero_copy_only=False), arr.type, mask=nulls)}, spec
    if 0 in ndims:
        raise ValueError(f"column {name!r}: mixes 0-d and n-d arrays across samples")
    lengths = np.array([0 if p is None else p.size for p in parts], dtype=np.int64)
    values, storage = _storage_values(np.concatenate(present) if present else np.zeros(0, np.int64), storage)
    spec["storage"] = storage
    out = {name: _list_array(values, lengths, nulls)}
    tails = {s[1:] for s in shapes if s is not None and len(s) > 1}
    if ndims != {1}:
        if len(tails) == 1 and ndims == {len(next(iter(tails))) + 1} and math.prod(next(iter(tails))) > 0:
            spec["inner"] = list(next(iter(tails)))
        else:
            spec["shape_column"] = SHAPE_PREFIX + name
            out[SHAPE_PREFIX + name] = pa.array([None if s is None else list(s) for s in shapes], pa.list_(pa.int64()))
    return out, spec


def _encode_lists(name: str, column: Sequence[Any]) -> tuple[dict[str, pa.Array], dict] | None:
    """Python lists of numbers; None if some row holds something else (then the column is JSON)."""
    rows, types = [], set()
    for value in _paced(column):
        if value is None:
            rows.append(None)
            continue
        if not isinstance(value, (list, tuple)):
            return None
        try:
            arr = np.asarray(value)
        except (ValueError, OverflowError):  # ragged nesting, or ints beyond 64 bits
            return None
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "biuf"):
            return None
        if arr.size:
            types.update(type(v) for v in (value if len(value) < 64 else (value[0], value[-1])))
            if arr.dtype.kind == "f":
                types.add(float)
        rows.append(arr)
    dtype = "float" if float in types else "bool" if types == {bool} else "int"
    np_dtype = {"float": np.float64, "bool": np.bool_, "int": np.int64}[dtype]
    present = [r.astype(np_dtype, copy=False) for r in rows if r is not None]
    flat = np.concatenate(present) if present else np.zeros(0, np_dtype)
    nulls = np.array([r is None for r in rows]) if len(present) < len(rows) else None
    lengths = np.array([0 if r is None else r.size for r in rows], dtype=np.int64)
    if name == "weight_versions":
        values, storage = pa.array(flat.astype(np.int64)), "int64"
    else:
        values, storage = _storage_values(flat, "native")
    return {name: _list_array(values, lengths, nulls)}, {"kind": "list", "dtype": dtype, "layout": "rows", "storage": storage}


def _number(value: Any) -> Any:
    """The Python number a 0-d tensor or numpy scalar holds (copied to the host)."""
    return value.item()


def _mixed_numbers(column: Sequence[Any], kinds: set) -> bool:
    """Whether a column holds only single numbers (0-d tensors or arrays, numpy or Python scalars)
    of more than one kind or dtype: such a column is stored as numbers. One kind and dtype of 0-d
    tensors keeps its dtype instead (given back as tensors)."""
    dtypes = set()
    for v in column:
        if v is None or type(v) in (bool, int, float):
            continue
        if isinstance(v, str) or getattr(v, "ndim", None) != 0:
            return False
        dtypes.add(str(v.dtype))
    return len(kinds) > 1 or len(dtypes) > 1


def json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _encode_json(name: str, column: Sequence[Any]) -> tuple[dict[str, pa.Array], dict]:
    dumps = json.JSONEncoder(separators=(",", ":"), default=json_default).encode
    out = []
    for i, value in enumerate(_paced(column)):
        try:
            out.append(None if value is None else dumps(value))
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"column {name!r}, sample {i}: cannot store {type(value).__name__} as JSON ({exc}); "
                "give arrays and tensors their own column"
            ) from None
    return {name: pa.array(out, pa.string())}, {"kind": "json", "layout": "rows"}


def _encode_scalars(name: str, column: Sequence[Any]) -> tuple[dict[str, pa.Array], dict]:
    types = {type(v) for v in column if v is not None}
    if types <= {str}:
        dtype, typ = "str", pa.string()
    elif types <= {bool}:
        dtype, typ = "bool", pa.bool_()
    elif types <= {int, bool}:
        dtype, typ = "int", pa.int64()
    elif types <= {int, float, bool}:
        dtype, typ = "float", pa.float64()
    else:
        return _encode_json(name, column)
    if dtype != "str" or name not in _names.ID_COLUMNS:  # ids keep their type: a UUID string is an id too
        typ = _names.BATCH_SAMPLE_COLUMNS.get(name, typ)
    try:
        arr = pa.array(list(column), typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise TypeError(f"column {name!r}: values cannot be stored as {typ} ({exc})") from None
    return {name: arr}, {"kind": "scalar", "dtype": dtype, "layout": "rows"}


def encode_rows(name: str, column: Sequence[Any]) -> tuple[dict[str, pa.Array], dict]:
    """Arrow column(s) and spec for one value per sample (None where a sample lacks it)."""
    kinds = {kind_of(v) for v in _paced(column)} - {None}
    if name in _JSON_CANONICAL:
        return _encode_json(name, column)
    if not kinds:
        typ = _names.BATCH_SAMPLE_COLUMNS.get(name, pa.null())
        return {name: pa.nulls(len(column), typ)}, {"kind": "none", "layout": "rows"}
    if kinds != {"scalar"} and kinds <= {"scalar", *ARRAY_KINDS} and _mixed_numbers(column, kinds):
        # numbers given as 0-d tensors or numpy scalars of several kinds or dtypes: a column of numbers
        return _encode_scalars(name, [v if v is None or type(v) in (bool, int, float, str) else _number(v) for v in column])
    if len(kinds) == 1 and kinds <= set(ARRAY_KINDS):
        return _encode_array_rows(name, column, kinds.pop())
    if kinds <= {"list", "json"}:
        encoded = _encode_lists(name, column)
        return encoded if encoded is not None else _encode_json(name, column)
    if kinds == {"scalar"}:
        return _encode_scalars(name, column)
    if kinds <= {"scalar", "json"}:
        return _encode_json(name, column)
    raise TypeError(f"column {name!r}: mixes value kinds {sorted(kinds)} across samples; use one kind per column")


# --- decode ------------------------------------------------------------------------------------
def _check_storage(values: np.ndarray, storage: str) -> None:
    """The stored values must be what the spec says they are (else the part is damaged)."""
    expected = {"bf16": "float32"}.get(storage)
    if storage == "bits":
        ok = values.dtype.kind == "u"
    elif storage == "native":
        ok = True
    else:  # float64: a bf16 or narrowed value cast to its column's fixed type by an earlier rltrace (still exact)
        ok = values.dtype.name in (expected or storage, "float64" if storage == "bf16" else None, "int64" if values.dtype.kind == "i" else None)
    if not ok:
        raise ValueError(f"stored as {values.dtype}, but its codec says {storage}")


def _restore(values: np.ndarray, spec: dict):
    """Flat numpy values as stored -> flat torch tensor / numpy array of the original dtype."""
    storage, dtype = spec["storage"], spec["dtype"]
    _check_storage(values, storage)
    if spec["kind"] == "torch":
        torch = _torch()
        target = getattr(torch, dtype)
        if storage == "bf16":
            bits = (values.astype(np.float32, copy=False).view(np.uint32) >> 16).astype(np.uint16)
            return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        if storage == "bits":
            return torch.from_numpy(np.ascontiguousarray(values).view(np.uint8)).view(target)
        if dtype not in _NUMPY_NATIVE:  # bf16 stored in its column's fixed type: exact, cast back by torch
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(np.ascontiguousarray(values)).to(target)
        if values.dtype.name != dtype:
            values = values.astype(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Arrow memory is ours alone: no copy needed
            return torch.from_numpy(values)
    target = np.dtype(dtype)
    if storage == "bits":
        return np.ascontiguousarray(values).view(target)
    return values if values.dtype == target else values.astype(target)


def _numpy_values(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def decode(column: pa.ChunkedArray, spec: dict, shapes: pa.ChunkedArray | None = None) -> Any:
    """The column as it was given: a [B, ...] tensor/array (batched) or a list with one value per row."""
    if isinstance(column, pa.ChunkedArray):
        arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    else:
        arr = column
    kind = spec["kind"]
    if kind not in ("none", "json", "scalar", "list", *ARRAY_KINDS):
        raise ValueError(f"unknown kind {kind!r} (written by a newer rltrace?)")
    if kind == "none":
        return [None] * len(arr)
    if kind == "json":
        return [None if v is None else json.loads(v) for v in arr.to_pylist()]
    if kind == "scalar":
        values = arr.to_pylist()
        if spec["dtype"] == "int":
            return [None if v is None else int(v) for v in values]
        return values
    if spec.get("scalar"):
        flat = _restore(_numpy_values(arr.fill_null(0) if arr.null_count else arr), spec)
        if spec["layout"] == "batched":
            return flat
        nulls = _numpy_values(arr.is_null())
        return [None if nulls[i] else flat[i] for i in range(len(flat))]
    if arr.offset:
        arr = pa.concat_arrays([arr])
    if spec["layout"] == "batched":  # every row has the same length: the values are the whole tensor
        values = arr.values
        return _restore(values.to_numpy(zero_copy_only=False), spec).reshape(spec["shape"])
    offsets = arr.offsets.to_numpy()
    values = arr.values
    if len(values) != offsets[-1] - offsets[0]:
        values = values.slice(offsets[0], offsets[-1] - offsets[0])
    flat = values.to_numpy(zero_copy_only=False)
    if kind == "list":
        flat = flat.astype({"float": np.float64, "bool": np.bool_, "int": np.int64}[spec["dtype"]], copy=False)
        nulls = _numpy_values(arr.is_null()) if arr.null_count else None
        base = offsets[0]
        rows = [flat[offsets[i] - base : offsets[i + 1] - base].tolist() for i in range(len(arr))]
        return [None if nulls is not None and nulls[i] else r for i, r in enumerate(rows)]
    restored = _restore(flat, spec)
    return _split_rows(restored, offsets - offsets[0], arr, spec, shapes)


def _split_rows(flat, offsets: np.ndarray, arr: pa.Array, spec: dict, shapes: pa.ChunkedArray | None) -> list:
    lengths = np.diff(offsets)
    if spec["kind"] == "torch":
        pieces = list(flat.split(lengths.tolist()))
    else:
        pieces = np.split(flat, offsets[1:-1])
    nulls = _numpy_values(arr.is_null()) if arr.null_count else None
    inner = spec.get("inner")
    row_shapes = shapes.to_pylist() if shapes is not None else None
    out = []
    for i, piece in enumerate(pieces):
        if nulls is not None and nulls[i]:
            out.append(None)
        elif row_shapes is not None:
            out.append(piece.reshape(row_shapes[i]))
        elif inner:
            out.append(piece.reshape((-1, *inner)))
        else:
            out.append(piece)
    return out
