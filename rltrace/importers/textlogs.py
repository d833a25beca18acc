"""JSONL and CSV metric logs into the long table (`rltrace.importers.scalars.Scalars`).

One record per step. The step comes from the first of `STEP_KEYS` present (verl's file logger
writes `{"step": N, "data": {...}}`; W&B exports `_step`); a record without one gets its line
number. JSONL files whose records hold plain numbers are read by Arrow's JSON reader in blocks;
any other file (text values, nested objects, a line that is not JSON, a step or time out of
range) goes through Python's `json`, record by record.

What cannot be read costs only itself and is counted with its line and reason: a line that is not
JSON (a cut-off last line from a killed writer included) or not an object, a CSV row whose fields
do not match its header, a record whose step is not a whole number that fits int64 (refused,
never clamped), a value that is not a number, a logged time that is not one (the values stay).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Callable

import numpy as np

from rltrace.importers.scalars import RECORDS, VALUES, MAX_TIME_S, MetricsImportError, Scalars, time_reason
from rltrace.store.convert import fits_int64, show, text
from rltrace.store.imports import Refused

STEP_KEYS = ("step", "_step", "global_step", "training/global_step", "rollout/step", "train/global_step")
TIME_KEYS = ("_timestamp", "timestamp", "time", "wall_time")
_JSON_CHUNK = 8 << 20  # bytes of JSONL handed to Arrow at a time (the progress bar moves per chunk)
_EXACT = 2.0**53  # a float step beyond this may not be the integer that was written
CUT_OFF = "cut off: the file ends in the middle of this line (its writer was killed or is still writing)"


def _number(value) -> float | None | str:
    """A logged value as a float; None when there is none (null, empty text); a reason when it is not a number."""
    if value is None or value == "":
        return None
    if isinstance(value, (bool, float)):
        return float(value)
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return f"{show(value)} does not fit a 64-bit float"
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return f"non-numeric value ({type(value).__name__})"


def _step(value) -> int | str:
    """A step as an exact integer, or why it is not one."""
    if isinstance(value, bool):
        return f"step {value!r} is a bool, not a step number"
    number = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return f"step {show(value)} is not a number"
    if isinstance(number, float):
        if not (math.isfinite(number) and number.is_integer()):
            return f"step {show(value)} is not a whole number"
        number = int(number)
    if not isinstance(number, int):
        return f"step {show(value)} is not a number"
    return number if fits_int64(number) else f"step {show(number)} does not fit int64"


class _Rows:
    """The long table as Python lists, for the record-by-record readers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step, self.name, self.value, self.time, self.refused = [], [], [], [], Refused()

    def scalars(self) -> Scalars:
        return Scalars.from_lists(self.step, self.name, self.value, self.time, self.refused)

    def record(self, rec, line: int, fallback: int) -> None:
        """One step's record: `{"step": N, "data": {...}}` (verl) or flat W&B-style keys; `fallback`:
        its step when it names none."""
        where = ("line", line)
        if not isinstance(rec, dict):
            self.refused.add(RECORDS, self.path, f"a JSON {type(rec).__name__}, not an object (one record per line)", where)
            return
        data = rec["data"] if isinstance(rec.get("data"), dict) else rec
        given = next((k for k in STEP_KEYS if rec.get(k) not in (None, "")), None)
        step = _step(rec[given]) if given else next((_step(data[k]) for k in STEP_KEYS if data.get(k) not in (None, "")), fallback)
        if isinstance(step, str):
            self.refused.add(RECORDS, self.path, step, where)
            return
        t = None
        for key in TIME_KEYS:
            got = _number(rec.get(key))
            if isinstance(got, float):
                t = got
                break
        if t is not None and not abs(t) <= MAX_TIME_S:
            self.refused.add(VALUES, self.path, time_reason(t), where)
            t = None
        for key, value in data.items():
            if data is rec and key in STEP_KEYS + TIME_KEYS:
                continue
            x = _number(value)
            if x is None:
                continue
            if isinstance(x, str):
                self.refused.add(VALUES, self.path, x, where)
                continue
            self.step.append(step)
            self.name.append(text(str(key)))
            self.value.append(x)
            self.time.append(t)


def blocks(path: Path, size: int = _JSON_CHUNK, max_line: int | None = None):
    """The file in blocks of whole lines, about `size` bytes each, read as a stream: (bytes read so
    far, number of the block's first line (0-based), the block, whether its last line ends in a
    newline). A line longer than `max_line` (`MAX_LINE`) is never held: it is passed over and
    yielded as (…, line, None, length), so a 2 GB file of one line costs a read, not 2 GB."""
    max_line = MAX_LINE if max_line is None else max_line
    with open(path, "rb") as f:
        pending, line, done, skipping = b"", 0, 0, 0
        while True:
            chunk = f.read(size)
            done += len(chunk)
            if not chunk:
                if skipping:
                    yield done, line, None, skipping
                elif pending:
                    yield done, line, pending, False
                return
            if skipping:
                cut = chunk.find(b"\n")
                if cut < 0:
                    skipping += len(chunk)
                    continue
                yield done, line, None, skipping + cut
                line, skipping, chunk = line + 1, 0, chunk[cut + 1:]
            data = pending + chunk
            cut = data.rfind(b"\n")
            whole, pending = (data[:cut + 1], data[cut + 1:]) if cut >= 0 else (b"", data)
            if len(whole) <= max_line:  # no line in it can be too long: as it is
                if whole:
                    yield done, line, whole, True
                    line += whole.count(b"\n")
                if len(pending) > max_line:
                    skipping, pending = len(pending), b""
                continue
            lines = whole.split(b"\n")[:-1]
            start = 0  # lines[start:k] are a block still to yield
            for k, piece in enumerate(lines):
                if len(piece) > max_line:  # ended within this chunk, but too long: passed over alone
                    if start < k:
                        yield done, line + start, b"\n".join(lines[start:k]) + b"\n", True
                    yield done, line + k, None, len(piece)
                    start = k + 1
            if start < len(lines):
                yield done, line + start, b"\n".join(lines[start:]) + b"\n", True
            line += len(lines)
            if len(pending) > max_line:
                skipping, pending = len(pending), b""


MAX_LINE = 16 << 20  # a JSONL line or CSV row longer than this is no record of scalars: left out, counted


def too_long(length: int) -> str:
    return f"a line of {length:,} bytes, longer than {MAX_LINE >> 20} MB: not a metrics record (left out unread)"


def read_jsonl(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """Arrow's JSON reader, block by block, for records of plain numbers; else record by record
    (that block). Read as a stream: memory holds a block, never the file."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    parts, long_lines = [], Refused()
    for done, first, block, whole in blocks(path):
        if block is None:
            long_lines.add(RECORDS, path, too_long(whole), ("line", first + 1))
            continue
        try:
            table = pa_json.read_json(pa.BufferReader(pa.py_buffer(block)))
        except (pa.ArrowException, ValueError):
            table = None
        got = _columns(table) if table is not None else None
        if got is None:  # not only plain numbers, or not JSON: Python's json says exactly what and where
            if not block.strip():
                continue
            got = _read_jsonl_records(path, block, first=first, cut=not whole)
        parts.append(got)
        if progress:
            progress(done)
    parts.append(Scalars(refused=long_lines))
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
    """A table of JSONL records (one column per key) as the long table, as `_Rows.record` reads each record.

    None when a record needs the record-by-record reader: values that are not numbers (text, lists,
    objects), a record without a step, a step that is not a whole number within 2**53, a logged time
    out of range, records that mix verl's `data` layout with flat keys.
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
                if got is None or pa.types.is_boolean(where[key].type):
                    return None
                fill = np.isnan(into) & got[1]
                into[fill] = got[0][fill]
    if np.isnan(step).any() or not (np.abs(step) < _EXACT).all() or (step != np.floor(step)).any():
        return None
    if (np.abs(time[~np.isnan(time)]) > MAX_TIME_S).any():
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
    keep = np.stack(valid, axis=1).ravel()  # record by record, keys in order, as `_Rows.record` appends
    width = len(names)
    return Scalars(np.repeat(step.astype(np.int64), width)[keep], np.tile(np.arange(width, dtype=np.int32), n)[keep],
                   names, np.stack(values, axis=1).ravel()[keep], np.repeat(time, width)[keep])


def _read_jsonl_records(path: Path, data: bytes, *, first: int = 0, cut: bool = False) -> Scalars:
    """The lines of `data` (lines `first`… of the file) record by record; `cut`: its last line has no newline."""
    out = _Rows(path)
    lines = data.split(b"\n")
    if not cut and lines and lines[-1] == b"":
        lines.pop()
    for k, line in enumerate(lines):
        i = first + k
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            last = cut and k == len(lines) - 1  # the file ends without a newline after it
            why = "nested too deeply" if isinstance(exc, RecursionError) else text(str(exc))[:120]
            out.refused.add(RECORDS, path, CUT_OFF if last else f"not JSON ({why})", ("line", i + 1))
            continue
        out.record(rec, i + 1, i)
    return out.scalars()


def read_csv(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """A CSV export (a header of metric names, one row per step): a row whose fields do not match
    the header is counted and left out, a last row cut off by a killed writer too."""
    out = _Rows(path)
    size, ends_whole = [0], [True]

    def lines():  # streamed; a line too long to be a row is counted and read as an empty one
        for done, first, block, whole in blocks(path):
            size[0] = done
            if block is None:
                out.refused.add(RECORDS, path, too_long(whole), ("line", first + 1))
                yield "\n"
                continue
            ends_whole[0] = block.endswith((b"\n", b"\r"))
            yield from io.StringIO(block.decode("utf-8", "surrogateescape"), newline="")

    reader = csv.reader(lines())
    rows: list[tuple[int, list | str]] = []  # (line, fields or why the row is not one)
    while True:
        try:
            rows.append((reader.line_num + 1, next(reader)))
        except StopIteration:
            break
        except csv.Error as exc:
            rows.append((reader.line_num, f"not a CSV row ({exc})"))
    header = rows[0][1] if rows else None
    if not isinstance(header, list) or not header:
        raise MetricsImportError(f"{path}: empty CSV file (expected a header row of metric names)")
    header = [text(name) for name in header]
    ends_whole = ends_whole[0]
    for k, (line, row) in enumerate(rows[1:]):
        if isinstance(row, str):
            out.refused.add(RECORDS, path, row, ("line", line))
        elif len(row) != len(header) and row:
            last = k == len(rows) - 2 and not ends_whole
            why = CUT_OFF if last and len(row) < len(header) else f"{len(row)} fields, but the header has {len(header)}"
            out.refused.add(RECORDS, path, why, ("line", line))
        elif row:
            out.record(dict(zip(header, row)), line, k)
    if progress:
        progress(size[0])
    return out.scalars()
