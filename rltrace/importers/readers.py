"""Scalar logs into one long table (step, name, value, logged time): TensorBoard event files, JSONL, CSV.

TensorBoard: records are framed as TFRecords (length, masked CRC-32C of the length, payload, CRC)
and each payload is a `tensorboard.Event` protobuf, parsed by protobuf itself with the descriptor
tensorboard ships. tensorboard's own Python record reader checks CRCs in pure Python (about 15 µs a
record, minutes for a long run), so the records are sliced here and all of a file's events are
parsed in one protobuf call, through a wrapper message holding `repeated tensorboard.Event` (and,
for the common file of plain scalars, through view messages that hand over every tag and value as
two lists; see `_view_classes`). Like
tensorboard's Rust data server (`--no-checksum`, its default), payload CRCs are not checked for
records that parse; the first record's length CRC is, so a foreign file is refused at once.
A file that does not parse is handed to tensorboard's own loader to say why.

JSONL / CSV: one record per step. The step comes from the first of `STEP_KEYS` present (verl's file
logger writes `{"step": N, "data": {...}}`; W&B exports `_step`); a record without one gets its
line number. Values that are not numbers (text, lists) are counted, not stored.
"""

from __future__ import annotations

import csv
import json
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rltrace import _paths
from rltrace._config import RltraceError

STEP_KEYS = ("step", "_step", "global_step", "training/global_step", "rollout/step", "train/global_step")
TIME_KEYS = ("_timestamp", "timestamp", "time", "wall_time")
EVENT_GLOB = "*tfevents*"


class MetricsImportError(RltraceError):
    """A metrics log that cannot be read (the message names the file)."""


@dataclass
class Scalars:
    """Columns of the long table, plus what was skipped and why."""

    step: list = field(default_factory=list)
    name: list = field(default_factory=list)
    value: list = field(default_factory=list)
    time_ns: list = field(default_factory=list)  # Unix seconds (float) when logged, None when not known
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def extend(self, other: "Scalars") -> None:
        self.step += other.step
        self.name += other.name
        self.value += other.value
        self.time_ns += other.time_ns
        self.skipped.update(other.skipped)

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


_VIEWS = None


def _view_classes():
    """Views of the same bytes with only what a scalar needs (field numbers of tensorboard's protos).

    `Heads` reads each event's wall time, step and number of summary values. `Merged` reads every
    event of a file as one message: protobuf merges a repeated singular message field, so all
    `Summary.Value`s collapse into one `Values` whose `tag` and `simple_value` lists hold every
    scalar in file order, converted in C instead of one Python object per value.
    """
    global _VIEWS
    if _VIEWS is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        F = descriptor_pb2.FieldDescriptorProto
        pool = descriptor_pool.Default()
        fd = descriptor_pb2.FileDescriptorProto(name="rltrace_tb_views.proto", package="rltrace_tb", syntax="proto3")

        def message(name, *fields):
            msg = fd.message_type.add(name=name)
            for fname, number, typ, label, type_name in fields:
                f = msg.field.add(name=fname, number=number, type=typ, label=label)
                if type_name:
                    f.type_name = ".rltrace_tb." + type_name

        one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
        message("Count")
        message("SummaryCount", ("value", 1, F.TYPE_MESSAGE, many, "Count"))
        message("Head", ("wall_time", 1, F.TYPE_DOUBLE, one, None), ("step", 2, F.TYPE_INT64, one, None),
                ("summary", 5, F.TYPE_MESSAGE, one, "SummaryCount"))
        message("Heads", ("events", 1, F.TYPE_MESSAGE, many, "Head"))
        message("Values", ("tag", 1, F.TYPE_STRING, many, None), ("simple_value", 2, F.TYPE_FLOAT, many, None))
        message("MergedSummary", ("value", 1, F.TYPE_MESSAGE, one, "Values"))
        message("Merged", ("wall_time", 1, F.TYPE_DOUBLE, many, None), ("step", 2, F.TYPE_INT64, many, None),
                ("summary", 5, F.TYPE_MESSAGE, one, "MergedSummary"))
        try:
            pool.FindMessageTypeByName("rltrace_tb.Heads")
        except KeyError:
            pool.Add(fd)
        _VIEWS = tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"rltrace_tb.{n}"))
                       for n in ("Heads", "Merged"))
    return _VIEWS


def _scalars_fast(wrapped: bytes, payloads: bytes, out: Scalars) -> bool:
    """Every value a plain `simple_value` with a tag (what SummaryWriter.add_scalar writes): read in bulk.

    False (nothing added) when some value is anything else; the caller then walks the events.
    """
    import numpy as np

    heads_class, merged_class = _view_classes()
    heads = heads_class.FromString(wrapped).events
    counts = np.fromiter((len(h.summary.value) for h in heads), np.int64, len(heads))
    merged = merged_class.FromString(payloads).summary.value
    total = int(counts.sum())
    if len(merged.tag) != total or len(merged.simple_value) != total:
        return False
    out.step += np.repeat(np.fromiter((h.step for h in heads), np.int64, len(heads)), counts).tolist()
    out.time_ns += np.repeat(np.fromiter((h.wall_time for h in heads), np.float64, len(heads)), counts).tolist()
    out.name += list(merged.tag)
    out.value += np.asarray(merged.simple_value, dtype=np.float64).tolist()
    return True


def _looks_like_tfrecord(path: Path) -> bool:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    with open(path, "rb") as f:
        head = f.read(12)
    return len(head) == 12 and struct.unpack("<I", head[8:])[0] == masked_crc32c(head[:8])


def read_events(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """Every scalar of one event file (`simple_value`, or a `scalars`-plugin tensor as TF2 writes)."""
    from google.protobuf.internal.encoder import _VarintBytes
    from google.protobuf.message import DecodeError
    from tensorboard.util import tensor_util

    events_class = _events_class()
    if not _looks_like_tfrecord(path):
        raise MetricsImportError(f"{path}: not a TensorBoard event file (no TFRecord header)")
    data = path.read_bytes()
    size, pos, heads, parts = len(data), 0, {}, []
    view, unpack = memoryview(data), struct.unpack_from
    out = Scalars()
    while pos + 12 <= size:
        n = unpack("<Q", data, pos)[0]
        if pos + 16 + n > size:
            break
        head = heads.get(n)
        if head is None:
            head = heads[n] = b"\x0a" + _VarintBytes(n)
        parts.append(head)
        parts.append(view[pos + 12 : pos + 12 + n])
        pos += 16 + n
    if pos < size:  # a writer still running, or killed mid-record
        out.skipped["truncated record at the end of the file"] += 1
    if progress:
        progress(pos)
    wrapped = b"".join(parts)
    try:
        first = events_class.FromString(wrapped[: len(parts[0]) + len(parts[1])]).events if parts else []
        if not first or not first[0].file_version.startswith("brain.Event"):
            raise MetricsImportError(f"{path}: not a TensorBoard event file (its first record is not a file_version event)")
        if _scalars_fast(wrapped, b"".join(parts[1::2]), out):
            return out
        events = events_class.FromString(wrapped).events
    except DecodeError:
        raise MetricsImportError(f"{path}: damaged TensorBoard event file ({_why(path)})") from None
    steps, names, values, times = out.step, out.name, out.value, out.time_ns
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
                    out.skipped[f"non-scalar {kind or 'value'}"] += 1
                    continue
            steps.append(step)
            names.append(v.tag)
            values.append(x)
            times.append(t)
    return out


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


def _record(rec: dict, line: int, out: Scalars, where: str) -> None:
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
        out.time_ns.append(t)


def read_jsonl(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    out, done = Scalars(), 0
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
    return out


def read_csv(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    out = Scalars()
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise MetricsImportError(f"{path}: empty CSV file (expected a header row of metric names)")
        for i, row in enumerate(reader):
            rec = {k: v for k, v in row.items() if k is not None}
            _record(rec, i, out, f"{path}, row {i + 2}")
    if progress:
        progress(path.stat().st_size)
    return out

