"""TensorBoard event files into the long table (`rltrace.importers.scalars.Scalars`).

Records are framed as TFRecords (length, masked CRC-32C of the length, payload, CRC) and each
payload is a `tensorboard.Event` protobuf, parsed by protobuf itself with the descriptor
tensorboard ships. tensorboard's own Python record reader checks CRCs in pure Python (about 15 µs a
record, minutes for a long run), so the records are framed here: one short loop over the lengths,
then every header's CRC checked at once (tensorboard's `masked_crc32c`, once per distinct length).
A file of plain scalars (what `SummaryWriter.add_scalar` writes) is then parsed in one protobuf
call through view messages (see `_merged_class`); any other file is parsed as `tensorboard.Event`s
and walked. Like tensorboard's Rust data server (`--no-checksum`, its default), payload CRCs are
not checked for records that parse.

Damage costs only what it touches: a record whose header fails its checksum is counted and reading
goes on from the next whole record (found by its header and payload checksums), a record that
does not parse is counted, a record cut off at the end (a writer still running, or killed) is
counted. A file without a TFRecord header or whose first record is not a `file_version` event is
not an event file: a `MetricsImportError`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import numpy as np

from rltrace.importers.scalars import RECORDS, VALUES, MetricsImportError, Scalars, bad_times, time_reason
from rltrace.store.imports import Refused

TRUNCATED = "truncated record at the end of the file"
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


def _crc():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    return masked_crc32c


def looks_like_tfrecord(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(12)
    return len(head) == 12 and struct.unpack("<I", head[8:])[0] == _crc()(head[:8])


def _follow(data: memoryview, pos: int) -> np.ndarray:
    """Record boundaries from `pos`, following each header's length while a header fits."""
    unpack = struct.Struct("<Q").unpack_from
    ends, last = [pos], len(data) - 12
    add = ends.append
    while pos <= last:  # the one Python step per record: each start follows from the previous length
        pos += 16 + unpack(data, pos)[0]
        add(pos)
    if ends[-1] > len(data):
        ends.pop()
    return np.array(ends, np.int64)


def _header_ok(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Whether each header's CRC holds (tensorboard's `masked_crc32c`, once per distinct length)."""
    if not len(starts):
        return np.zeros(0, bool)
    crc = _crc()
    distinct = np.unique(lengths) if lengths.max() >= 1 << 22 else np.flatnonzero(np.bincount(lengths))
    crcs = np.array([crc(struct.pack("<Q", int(n))) for n in distinct], np.uint32)
    return _at(u8, np.uint32)[starts + 8] == crcs[np.searchsorted(distinct, lengths)]


def _resync(data: memoryview, u8: np.ndarray, start: int) -> tuple[int | None, bool]:
    """The first record from `start` whose header checksum holds: (its offset, True) when it is
    whole and its payload checksum holds too, (its offset, False) when it runs past the end of the
    file (a record cut off by a killed writer); (None, False) when there is none."""
    room = len(data) - start - 12  # bytes after a header at `start`
    if room < 0:
        return None, False
    words = _at(u8[start : len(data) - 4], np.uint64)  # the length at each offset where a header fits
    lengths = words[: room + 1]
    plausible = np.flatnonzero(lengths < (1 << 31))
    if not len(plausible):
        return None, False
    sizes = lengths[plausible].astype(np.int64)
    good = _header_ok(u8, plausible + start, sizes)
    crc = _crc()
    for p, size in zip((plausible[good] + start).tolist(), sizes[good].tolist()):
        if p + 16 + size > len(data):
            return p, False
        if struct.unpack_from("<I", data, p + 12 + size)[0] == crc(bytes(data[p + 12 : p + 12 + size])):
            return p, True
    return None, False


def _frames(path: Path, data: memoryview, refused: Refused) -> tuple[np.ndarray, np.ndarray, bool]:
    """Start offsets and payload lengths of the whole records, and whether they follow each other
    without a gap; damaged headers and a cut-off last record are counted in `refused`, and reading
    goes on from the next whole record."""
    u8 = np.frombuffer(data, np.uint8)
    starts_all, lengths_all, pos = [], [], 0
    while pos < len(data):
        bounds = _follow(data, pos)
        starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1] - 16
        ok = _header_ok(u8, starts, lengths)
        bad = int(np.argmin(ok)) if len(ok) and not ok.all() else None
        tail = int(starts[bad]) if bad is not None else int(bounds[-1])
        keep = slice(None, bad)
        starts_all.append(starts[keep])
        lengths_all.append(lengths[keep])
        if tail >= len(data):
            break
        if bad is None and (len(data) - tail < 12 or struct.unpack_from("<I", data, tail + 8)[0] == _crc()(bytes(data[tail:tail + 8]))):
            refused.add(RECORDS, path, TRUNCATED, ("byte", tail))  # a writer still running, or killed
            break
        nxt, whole = _resync(data, u8, tail + 1)
        if nxt is None:
            refused.add(RECORDS, path, f"damaged record header (fails its checksum); the rest of the file "
                                       f"({len(data) - tail:,} bytes) holds no whole record", ("byte", tail))
            break
        refused.add(RECORDS, path, f"damaged record header (fails its checksum); {nxt - tail:,} bytes skipped "
                                   "to the next record", ("byte", tail))
        if not whole:
            refused.add(RECORDS, path, TRUNCATED, ("byte", nxt))
            break
        pos = nxt
    return np.concatenate(starts_all), np.concatenate(lengths_all), len(starts_all) == 1


def read_events(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """Every scalar of one event file (`simple_value`, or a `scalars`-plugin tensor as TF2 writes)."""
    from google.protobuf.message import DecodeError

    _events_class()  # tensorboard is installed
    from tensorboard.compat.proto.event_pb2 import Event

    if not looks_like_tfrecord(path):
        raise MetricsImportError(f"{path}: not a TensorBoard event file (no TFRecord header)")
    buf = bytearray(path.stat().st_size + 4)  # 4 spare bytes in front: the first payload gets a separator too
    with open(path, "rb") as f:
        data = memoryview(buf)[4 : 4 + f.readinto(memoryview(buf)[4:])]
    refused = Refused()
    starts, lengths, contiguous = _frames(path, data, refused)
    if progress:
        progress(len(data))
    try:
        first = Event.FromString(bytes(data[12 : 12 + int(lengths[0])])) if len(starts) and starts[0] == 0 else None
    except DecodeError:
        first = None
    if first is None or not first.file_version.startswith("brain.Event"):
        raise MetricsImportError(f"{path}: not a TensorBoard event file (its first record is not a file_version event)")
    out = None
    if contiguous and len(starts):  # the bulk view reads the bytes between payloads: no damaged gaps
        try:
            out = _plain_scalars(path, buf, starts, lengths)
        except DecodeError:
            out = None
    if out is None:
        out = _walk(path, memoryview(buf)[4 : 4 + len(data)], starts, lengths)
    out.refused.update(refused)
    return out


def _plain_scalars(path: Path, buf: bytearray, starts: np.ndarray, lengths: np.ndarray) -> Scalars | None:
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
    refused = Refused()
    bad = bad_times(times)
    if bad.any():
        per_event = np.bincount(event, minlength=n)
        for k in np.flatnonzero(bad).tolist():
            refused.add(VALUES, path, time_reason(float(times[k])), ("byte", int(starts[k])), count=int(per_event[k]))
        times = np.where(bad, np.nan, times)
    names = list(dict.fromkeys(tags))
    index = {name: i for i, name in enumerate(names)}
    codes = np.fromiter(map(index.__getitem__, tags), np.int32, len(tags))
    return Scalars(event_steps[event], codes, names, values[~marks].astype(np.float64), times[event], refused)


def _walk(path: Path, data: memoryview, starts: np.ndarray, lengths: np.ndarray) -> Scalars:
    """Every event parsed as a `tensorboard.Event` (in one call, through `_events_class`; record by
    record when that fails, so a record that does not parse costs only itself), then walked."""
    from google.protobuf.internal.encoder import _VarintBytes
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.util import tensor_util

    refused = Refused()
    heads, parts = {}, []
    for pos, n in zip(starts.tolist(), lengths.tolist()):
        head = heads.get(n)
        if head is None:
            head = heads[n] = b"\x0a" + _VarintBytes(n)
        parts.append(head)
        parts.append(data[pos + 12 : pos + 12 + n])
    try:
        events = list(zip(starts.tolist(), _events_class().FromString(b"".join(parts)).events))
    except DecodeError:
        events = []
        for pos, n in zip(starts.tolist(), lengths.tolist()):
            try:
                events.append((pos, Event.FromString(bytes(data[pos + 12 : pos + 12 + n]))))
            except DecodeError:
                refused.add(RECORDS, path, "record does not parse as a tensorboard Event (damaged)", ("byte", pos))
    steps, names, values, times = [], [], [], []
    for pos, e in events:
        vs = e.summary.value
        if not vs:
            continue
        step, t = e.step, e.wall_time
        if bad_times(np.array([t]))[0]:
            refused.add(VALUES, path, time_reason(t), ("byte", pos), count=len(vs))
            t = float("nan")
        for v in vs:
            x = v.simple_value
            if x == 0.0 and v.WhichOneof("value") != "simple_value":  # 0.0 is also what an unset field reads
                kind = v.WhichOneof("value")
                if kind == "tensor" and v.metadata.plugin_data.plugin_name == "scalars":
                    try:
                        x = float(tensor_util.make_ndarray(v.tensor).item())
                    except (TypeError, ValueError, OverflowError):
                        refused.add(VALUES, path, "scalars-plugin tensor that is not one number", ("byte", pos))
                        continue
                else:
                    refused.add(VALUES, path, f"non-scalar {kind or 'value'}", ("byte", pos))
                    continue
            steps.append(step)
            names.append(v.tag)
            values.append(x)
            times.append(t)
    return Scalars.from_lists(steps, names, values, times, refused)
