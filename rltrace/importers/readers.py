"""Scalar logs into one long table (step, name, value, logged time): TensorBoard event files, JSONL, CSV.

The table is held as numpy columns with names as codes into a short list of distinct names: a long
run logs millions of values under a few hundred names, and nothing here may cost Python work per
value on the common path.

TensorBoard: records are framed as TFRecords (length, masked CRC-32C of the length, payload, CRC)
and each payload is a `tensorboard.Event` protobuf, parsed by protobuf itself with the descriptor
tensorboard ships. tensorboard's own Python record reader checks CRCs in pure Python (about 15 µs a
record, minutes for a long run), so the records are framed here: one short loop over the lengths,
then every header's CRC checked at once (tensorboard's `masked_crc32c`, once per distinct length).
A file of plain scalars (what `SummaryWriter.add_scalar` writes) is then parsed in one protobuf
call through view messages (see `_merged_class`); any other file is parsed as `tensorboard.Event`s
and walked. Like tensorboard's Rust data server (`--no-checksum`, its default), payload CRCs are
not checked for records that parse. A file that does not parse is handed to tensorboard's own
loader to say why.

JSONL / CSV: one record per step. The step comes from the first of `STEP_KEYS` present (verl's file
logger writes `{"step": N, "data": {...}}`; W&B exports `_step`); a record without one gets its
line number. Values that are not numbers (text, lists) are counted, not stored. JSONL files whose
records hold plain numbers are read by Arrow's JSON reader in blocks; any other file (text values,
nested objects, a line that is not JSON) goes through Python's `json`, record by record, which
also names the line of an error.
"""

from __future__ import annotations

import csv
import json
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from rltrace import _paths
from rltrace._config import RltraceError

STEP_KEYS = ("step", "_step", "global_step", "training/global_step", "rollout/step", "train/global_step")
TIME_KEYS = ("_timestamp", "timestamp", "time", "wall_time")
EVENT_GLOB = "*tfevents*"


class MetricsImportError(RltraceError):
    """A metrics log that cannot be read (the message names the file)."""


def _none(dtype) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class Scalars:
    """Columns of the long table, plus what was skipped and why. `code` indexes `names`."""

    step: np.ndarray = field(default_factory=lambda: _none(np.int64))
    code: np.ndarray = field(default_factory=lambda: _none(np.int32))
    names: list = field(default_factory=list)  # distinct names, in order of first appearance
    value: np.ndarray = field(default_factory=lambda: _none(np.float64))
    time_s: np.ndarray = field(default_factory=lambda: _none(np.float64))  # Unix seconds when logged; NaN: not known
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    @classmethod
    def from_lists(cls, steps: list, names: list, values: list, times: list, skipped: Counter | None = None) -> "Scalars":
        """From one Python list per column (`times`: None where not known): the record-by-record readers."""
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int32, len(names))
        return cls(np.asarray(steps, np.int64).reshape(-1), codes, list(index), np.asarray(values, np.float64).reshape(-1),
                   np.array([np.nan if t is None else t for t in times], np.float64).reshape(-1), skipped or Counter())

    @classmethod
    def concat(cls, parts: list["Scalars"]) -> "Scalars":
        """One table from several (files), names merged in order of first appearance."""
        index: dict[str, int] = {}
        codes = []
        for p in parts:
            lut = np.array([index.setdefault(n, len(index)) for n in p.names] or [0], np.int32)
            codes.append(lut[p.code])
        skipped = Counter()
        for p in parts:
            skipped.update(p.skipped)
        if not parts:
            return cls()
        return cls(np.concatenate([p.step for p in parts]), np.concatenate(codes), list(index),
                   np.concatenate([p.value for p in parts]), np.concatenate([p.time_s for p in parts]), skipped)

    def __len__(self) -> int:
        return len(self.value)


def find_logs(paths) -> list[Path]:
    """Event files (searched recursively in folders), .jsonl/.json and .csv files named or found."""
    # in a folder, a .json is more often a config than a log: name it to import it
    return _paths.expand(paths, lambda x: bool(_kind(x)) and x.suffix != ".json", MetricsImportError,
                         "no TensorBoard event files (*tfevents*), .jsonl or .csv files")


def _kind(path: Path) -> str | None:
    if "tfevents" in path.name:
        return "tensorboard"
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if path.suffix == ".csv":
        return "csv"
    return None


def read(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    kind = _kind(path)
    if kind is None:
        kind = "tensorboard" if _looks_like_tfrecord(path) else None
    if kind == "tensorboard":
        return read_events(path, progress)
    if kind == "jsonl":
        return read_jsonl(path, progress)
    if kind == "csv":
        return read_csv(path, progress)
    raise MetricsImportError(f"{path}: not a TensorBoard event file, .jsonl or .csv metrics log")


# --- TensorBoard -------------------------------------------------------------------------------
_EVENTS_CLASS = None


def _events_class():
    """A message `rltrace.Events { repeated tensorboard.Event events = 1; }`, built once."""
    global _EVENTS_CLASS
    if _EVENTS_CLASS is None:
        try:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
            from tensorboard.compat.proto import event_pb2
        except ImportError:
            raise MetricsImportError("reading TensorBoard logs needs the tensorboard package: pip install 'rltrace[import]'") from None
        pool = descriptor_pool.Default()
        try:
            desc = pool.FindMessageTypeByName("rltrace.Events")
        except KeyError:
            fd = descriptor_pb2.FileDescriptorProto(name="rltrace_events.proto", package="rltrace",
                                                    dependency=[event_pb2.DESCRIPTOR.name])
            msg = fd.message_type.add(name="Events")
            msg.field.add(name="events", number=1, label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, type_name=".tensorboard.Event")
            pool.Add(fd)
            desc = pool.FindMessageTypeByName("rltrace.Events")
        _EVENTS_CLASS = message_factory.GetMessageClass(desc)
    return _EVENTS_CLASS


_MERGED = None
_MARK = 0x7FD5A5A5  # a quiet NaN with a payload no writer produces: the value that marks where an event starts
#: written over the 16 bytes in front of each payload (the previous record's CRC, this record's
#: header): step 0 (2 bytes), summary { value { simple_value: _MARK } } (9 bytes), padding field 15 (5 bytes)
_SEPARATOR = b"\x10\x00" + b"\x2a\x07\x0a\x05\x15" + struct.pack("<I", _MARK) + b"\x7a\x03\x00\x00\x00"
_OTHER_VALUES = (3, 4, 5, 6, 8)  # Summary.Value fields that are not plain scalars: old histogram, image, histo, audio, tensor


def _merged_class():
    """A view of a whole file of events as one message (field numbers of tensorboard's protos).

    With `_SEPARATOR` in front of every payload, a file reads as one `Merged` message: protobuf
    appends repeated fields in order and merges every `summary` into one, so every step, wall time,
    tag and value of the file comes out in one list each, in file order, converted in C. Each
    event's steps read [0] or [0, step] (writers never encode a step of 0: proto3 leaves defaults
    out) and each event's values start with `_MARK`. Values of other kinds land in `other*` lists.
    """
    global _MERGED
    if _MERGED is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        F = descriptor_pb2.FieldDescriptorProto
        pool = descriptor_pool.Default()
        fd = descriptor_pb2.FileDescriptorProto(name="rltrace_tb_merged.proto", package="rltrace_tb", syntax="proto3")

        def message(name, *fields):
            msg = fd.message_type.add(name=name)
            for fname, number, typ, label, type_name in fields:
                f = msg.field.add(name=fname, number=number, type=typ, label=label)
                if type_name:
                    f.type_name = ".rltrace_tb." + type_name

        one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
        message("Values", ("tag", 1, F.TYPE_STRING, many, None), ("simple_value", 2, F.TYPE_FLOAT, many, None),
                *((f"other{n}", n, F.TYPE_BYTES, many, None) for n in _OTHER_VALUES))
        message("MergedSummary", ("value", 1, F.TYPE_MESSAGE, one, "Values"))
        message("Merged", ("wall_time", 1, F.TYPE_DOUBLE, many, None), ("step", 2, F.TYPE_INT64, many, None),
                ("summary", 5, F.TYPE_MESSAGE, one, "MergedSummary"), ("padding", 15, F.TYPE_BYTES, one, None))
        try:
            pool.FindMessageTypeByName("rltrace_tb.Merged")
        except KeyError:
            pool.Add(fd)
        _MERGED = message_factory.GetMessageClass(pool.FindMessageTypeByName("rltrace_tb.Merged"))
    return _MERGED


def _at(buf: np.ndarray, dtype) -> np.ndarray:
    """`buf` seen as overlapping `dtype` words, one starting at every byte: index it with byte offsets."""
    return np.ndarray((len(buf) - np.dtype(dtype).itemsize + 1,), dtype, buffer=buf, strides=(1,))


def _looks_like_tfrecord(path: Path) -> bool:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    with open(path, "rb") as f:
        head = f.read(12)
    return len(head) == 12 and struct.unpack("<I", head[8:])[0] == masked_crc32c(head[:8])


def _frames(path: Path, data: memoryview) -> tuple[np.ndarray, np.ndarray, bool]:
    """Start offsets and payload lengths of the whole records, and whether bytes follow them (a cut record).

    Every header's CRC is checked (tensorboard's `masked_crc32c`, once per distinct length), so a
    damaged length is an error naming where it is, never a file silently cut short.
    """
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    unpack = struct.Struct("<Q").unpack_from
    ends, pos, last = [0], 0, len(data) - 12
    add = ends.append
    while pos <= last:  # the one Python step per record: each start follows from the previous length
        pos += 16 + unpack(data, pos)[0]
        add(pos)
    if ends[-1] > len(data):
        ends.pop()
    bounds = np.array(ends, np.int64)
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1] - 16
    if len(starts):
        distinct = np.unique(lengths) if lengths.max() >= 1 << 22 else np.flatnonzero(np.bincount(lengths))
        crcs = np.array([masked_crc32c(struct.pack("<Q", int(n))) for n in distinct], np.uint32)
        bad = np.flatnonzero(_at(np.frombuffer(data, np.uint8), np.uint32)[starts + 8] != crcs[np.searchsorted(distinct, lengths)])
        if len(bad):
            raise MetricsImportError(f"{path}: damaged TensorBoard event file (the record header at byte "
                                     f"{int(starts[bad[0]])} fails its checksum)")
    tail = int(bounds[-1])
    if len(data) - tail >= 12 and struct.unpack_from("<I", data, tail + 8)[0] != masked_crc32c(bytes(data[tail:tail + 8])):
        raise MetricsImportError(f"{path}: damaged TensorBoard event file (the record header at byte {tail} fails its checksum)")
    return starts, lengths, tail < len(data)


def read_events(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """Every scalar of one event file (`simple_value`, or a `scalars`-plugin tensor as TF2 writes)."""
    from google.protobuf.message import DecodeError

    _events_class()  # tensorboard is installed
    from tensorboard.compat.proto.event_pb2 import Event

    if not _looks_like_tfrecord(path):
        raise MetricsImportError(f"{path}: not a TensorBoard event file (no TFRecord header)")
    buf = bytearray(path.stat().st_size + 4)  # 4 spare bytes in front: the first payload gets a separator too
    with open(path, "rb") as f:
        data = memoryview(buf)[4 : 4 + f.readinto(memoryview(buf)[4:])]
    starts, lengths, cut = _frames(path, data)
    if progress:
        progress(int(starts[-1] + 16 + lengths[-1]) if len(starts) else 0)
    try:
        first = Event.FromString(bytes(data[12 : 12 + int(lengths[0])])) if len(starts) else None
        if first is None or not first.file_version.startswith("brain.Event"):
            raise MetricsImportError(f"{path}: not a TensorBoard event file (its first record is not a file_version event)")
        out = _plain_scalars(buf, starts, lengths)
        if out is None:
            out = _walk(data, starts, lengths)
    except DecodeError:
        raise MetricsImportError(f"{path}: damaged TensorBoard event file ({_why(path)})") from None
    if cut:  # a writer still running, or killed mid-record
        out.skipped["truncated record at the end of the file"] += 1
    return out


def _plain_scalars(buf: bytearray, starts: np.ndarray, lengths: np.ndarray) -> Scalars | None:
    """A file whose values are all plain `simple_value`s with a tag (what `add_scalar` writes), in bulk.

    `buf`: the file after 4 spare bytes; its record headers are overwritten (payloads are kept).
    None when the file holds anything else (or counts do not line up): the caller walks its events.
    """
    end = int(starts[-1] + 16 + lengths[-1])  # where the last payload ends in `buf`
    words = _at(np.frombuffer(buf, np.uint8), np.uint64)
    low, high = struct.unpack("<QQ", _SEPARATOR)
    words[starts] = low
    words[starts + 8] = high
    merged = _merged_class().FromString(memoryview(buf)[:end])
    summary = merged.summary.value
    if any(len(getattr(summary, f"other{n}")) for n in _OTHER_VALUES):
        return None
    n = len(starts)
    steps, times = np.asarray(merged.step, np.int64), np.asarray(merged.wall_time, np.float64)
    values = np.asarray(summary.simple_value, np.float32)
    heads, marks = steps == 0, values.view(np.uint32) == _MARK
    if len(times) != n or heads.sum() != n or marks.sum() != n:
        return None
    after = np.flatnonzero(heads) + 1
    logged = after < len(steps)  # an event's step follows its marker, unless it is 0 (not encoded)
    logged[logged] = ~heads[after[logged]]
    event_steps = np.where(logged, steps[np.minimum(after, len(steps) - 1)], 0)
    first_value = np.flatnonzero(marks)
    event = np.repeat(np.arange(n), np.diff(np.append(first_value, len(values))) - 1)  # the event of each value
    tags = list(summary.tag)
    if len(tags) != len(event):
        return None
    names = list(dict.fromkeys(tags))
    index = {name: i for i, name in enumerate(names)}
    codes = np.fromiter(map(index.__getitem__, tags), np.int32, len(tags))
    return Scalars(event_steps[event], codes, names, values[~marks].astype(np.float64), times[event])


def _walk(data: memoryview, starts: np.ndarray, lengths: np.ndarray) -> Scalars:
    """Every event parsed as a `tensorboard.Event` (in one call, through `_events_class`), then walked."""
    from google.protobuf.internal.encoder import _VarintBytes
    from tensorboard.util import tensor_util

    view, heads, parts = data, {}, []
    for pos, n in zip(starts.tolist(), lengths.tolist()):
        head = heads.get(n)
        if head is None:
            head = heads[n] = b"\x0a" + _VarintBytes(n)
        parts.append(head)
        parts.append(view[pos + 12 : pos + 12 + n])
    events = _events_class().FromString(b"".join(parts)).events
    steps, names, values, times, skipped = [], [], [], [], Counter()
    for e in events:
        vs = e.summary.value
        if not vs:
            continue
        step, t = e.step, e.wall_time
        for v in vs:
            x = v.simple_value
            if x == 0.0 and v.WhichOneof("value") != "simple_value":  # 0.0 is also what an unset field reads
                kind = v.WhichOneof("value")
                if kind == "tensor" and v.metadata.plugin_data.plugin_name == "scalars":
                    x = float(tensor_util.make_ndarray(v.tensor).item())
                else:
                    skipped[f"non-scalar {kind or 'value'}"] += 1
                    continue
            steps.append(step)
            names.append(v.tag)
            values.append(x)
            times.append(t)
    return Scalars.from_lists(steps, names, values, times, skipped)


def _why(path: Path) -> str:
    """tensorboard's own reader's account of a file that does not parse."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        for _ in EventFileLoader(str(path)).Load():
            pass
    except Exception as exc:  # its errors (DataLossError, DecodeError) say what is wrong
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return "a record does not parse as a tensorboard Event"


# --- JSONL / CSV ---------------------------------------------------------------------------------
_JSON_CHUNK = 8 << 20  # bytes of JSONL handed to Arrow at a time (the progress bar moves per chunk)


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


class _Rows:
    """The long table as Python lists, for the record-by-record readers."""

    def __init__(self) -> None:
        self.step, self.name, self.value, self.time, self.skipped = [], [], [], [], Counter()

    def scalars(self) -> Scalars:
        return Scalars.from_lists(self.step, self.name, self.value, self.time, self.skipped)


def _record(rec: dict, line: int, out: _Rows, where: str) -> None:
    """One step's record: `{"step": N, "data": {...}}` (verl) or flat W&B-style keys."""
    if not isinstance(rec, dict):
        raise MetricsImportError(f"{where}: expected a JSON object per line, got {type(rec).__name__}")
    data = rec["data"] if isinstance(rec.get("data"), dict) else rec
    step = next((rec[k] for k in STEP_KEYS if _number(rec.get(k)) is not None), None)
    if step is None:
        step = next((data[k] for k in STEP_KEYS if _number(data.get(k)) is not None), line)
    step = int(_number(step))
    t = next((_number(rec[k]) for k in TIME_KEYS if _number(rec.get(k)) is not None), None)
    for key, value in data.items():
        if data is rec and key in STEP_KEYS + TIME_KEYS:
            continue
        x = _number(value)
        if x is None:
            if value not in (None, ""):
                out.skipped[f"non-numeric value ({type(value).__name__})"] += 1
            continue
        out.step.append(step)
        out.name.append(str(key))
        out.value.append(x)
        out.time.append(t)


def read_jsonl(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """Arrow's JSON reader, chunk by chunk, for records of plain numbers; else record by record (`_record`)."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    data, parts, pos = path.read_bytes(), [], 0
    while pos < len(data):
        cut = data.find(b"\n", min(pos + _JSON_CHUNK, len(data)) - 1)
        end = len(data) if cut < 0 else cut + 1
        try:
            table = pa_json.read_json(pa.BufferReader(pa.py_buffer(memoryview(data)[pos:end])))
        except (pa.ArrowException, ValueError):
            table = None
            if not data[pos:end].strip():  # blank lines at the end
                pos = end
                continue
        got = _columns(table) if table is not None else None
        if got is None:  # not only plain numbers, or not JSON: Python's json says exactly what and where
            return _read_jsonl_records(path, progress)
        parts.append(got)
        pos = end
        if progress:
            progress(pos)
    return Scalars.concat(parts)


def _numbers(column) -> tuple[np.ndarray, np.ndarray] | None:
    """(values as float64, which rows hold one) of an Arrow column of numbers or booleans; None for others."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = column.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t)):
        return None
    if pa.types.is_null(t):
        return np.zeros(len(column)), np.zeros(len(column), bool)
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    values = pc.fill_null(column.cast(pa.float64(), safe=False), 0.0).to_numpy(zero_copy_only=False)
    return values, valid


def _columns(table) -> Scalars | None:
    """A table of JSONL records (one column per key) as the long table, as `_record` reads each record.

    None when a record needs `_record`'s own handling: values that are not numbers (text, lists,
    objects), a record without a step, records that mix verl's `data` layout with flat keys.
    """
    import pyarrow as pa

    n = table.num_rows
    top = {name: column.combine_chunks() for name, column in zip(table.column_names, table.columns)}
    nested = "data" in top and pa.types.is_struct(top["data"].type)
    if nested:
        if top["data"].null_count:
            return None
        inner = {field.name: child for field, child in zip(top["data"].type, top["data"].flatten())}
    step, time = np.full(n, np.nan), np.full(n, np.nan)
    for where, keys, into in ((top, STEP_KEYS, step), (inner if nested else {}, STEP_KEYS, step), (top, TIME_KEYS, time)):
        for key in keys:
            if key in where:
                got = _numbers(where[key])
                if got is None:
                    return None
                fill = np.isnan(into) & got[1]
                into[fill] = got[0][fill]
    if np.isnan(step).any() or not np.isfinite(step).all():
        return None
    metrics = inner if nested else {k: c for k, c in top.items() if k not in STEP_KEYS + TIME_KEYS}
    names, values, valid = [], [], []
    for key, column in metrics.items():
        got = _numbers(column)
        if got is None:
            return None
        if got[1].any():
            names.append(str(key))
            values.append(got[0])
            valid.append(got[1])
    if not names:
        return Scalars()
    keep = np.stack(valid, axis=1).ravel()  # record by record, keys in order, as `_record` appends
    width = len(names)
    return Scalars(np.repeat(step.astype(np.int64), width)[keep], np.tile(np.arange(width, dtype=np.int32), n)[keep],
                   names, np.stack(values, axis=1).ravel()[keep], np.repeat(time, width)[keep])


def _read_jsonl_records(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    out, done = _Rows(), 0
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            done += len(line)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise MetricsImportError(f"{path}, line {i + 1}: not JSON ({exc})") from None
            _record(rec, i, out, f"{path}, line {i + 1}")
            if progress and i % 1000 == 0:
                progress(done)
    if progress:
        progress(done)
    return out.scalars()


def read_csv(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    out = _Rows()
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise MetricsImportError(f"{path}: empty CSV file (expected a header row of metric names)")
        for i, row in enumerate(reader):
            rec = {k: v for k, v in row.items() if k is not None}
            _record(rec, i, out, f"{path}, row {i + 2}")
    if progress:
        progress(path.stat().st_size)
    return out.scalars()
