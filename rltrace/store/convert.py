"""Converting rows to Arrow without losing innocent ones, and counting what is lost.

`convert` turns a batch into one table; if that fails it tries again with text made valid UTF-8,
then in halves down to single rows, so one odd value costs only its own row, which is counted in
`Drops` with its table, column and reason (what `rltrace info` shows). `text` makes a string valid
UTF-8 (a lone surrogate becomes its escape, never lost). Used by `rltrace.store.rows`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from rltrace import _json, _names

logger = logging.getLogger("rltrace")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_REASONS = 32  # distinct drop reasons kept per process; later ones are counted under "other"


# --- values -------------------------------------------------------------------------------------
def text(value: str) -> str:
    """`value` as valid UTF-8: lone surrogates become backslash escapes, every other character stays."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def clean(value: Any) -> Any:
    """`value` with every string in it (dict keys, list items) made valid UTF-8."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


_PLAIN = frozenset((int, float, bool, str, bytes, type(None)))


def plain(value: Any) -> Any:
    """A 0-d tensor or numpy scalar (any dtype, any device, with or without grad) as the Python
    number it holds (`.item()`, which copies a device value to the host); anything else as it is.
    Duck-typed: torch is never imported here."""
    if type(value) in _PLAIN:
        return value
    item = getattr(value, "item", None)
    if item is None or getattr(value, "ndim", None) != 0:
        return value
    try:
        return item()
    except Exception:  # noqa: BLE001 - a tensor without data (meta device): stored or dropped as it is
        return value


class Later:
    """A 0-d CUDA tensor read on the writer thread: a copy taken on the caller's stream (no device
    sync there) and an event recorded after it, which the writer waits for before `.item()`."""

    __slots__ = ("copy", "ready")

    def __init__(self, copy: Any, ready: Any):
        self.copy, self.ready = copy, ready

    def read(self) -> Any:
        self.ready.synchronize()
        return self.copy.item()


def later(value: Any) -> Later | None:
    """A `Later` for a 0-d CUDA tensor (any dtype, with or without grad), so that reading its value
    does not make the training thread wait for the device; None for anything else (read it now)."""
    device = getattr(value, "device", None)
    if getattr(device, "type", None) != "cuda" or getattr(value, "ndim", None) != 0:
        return None
    torch = sys.modules.get("torch")  # loaded: the value is one of its tensors
    try:
        copy = value.detach().clone()  # the caller may change the tensor in place after the call
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(copy.device))
    except Exception:  # noqa: BLE001 - a tensor that cannot be copied this way is read now
        return None
    return Later(copy, ready)


def plain_values(rows: list) -> list:
    """Rows (dicts) with 0-d tensors and numpy scalars turned into numbers (`plain`), at the top
    level and inside lists; rows without any are returned as they are (no copy)."""
    out = []
    for row in rows:
        if isinstance(row, Mapping) and any(type(v) not in _PLAIN for v in row.values()):
            row = {k: [plain(x) for x in v] if isinstance(v, list) else plain(v) for k, v in row.items()}
        out.append(row)
    return out


def fits_int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def show(value: Any) -> str:
    """A short rendering of a value for a drop reason (`2**70`, not 22 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and not fits_int64(value):
        if value > 0 and value & (value - 1) == 0:
            return f"2**{value.bit_length() - 1}"
        return f"{value:.3g}" if abs(value) < 1e300 else "a huge integer"
    out = repr(clean(value))
    return out if len(out) <= 40 else out[:37] + "..."


def dumps(value: Any) -> str:
    """Compact, strict JSON that is always valid UTF-8 (non-ASCII escaped, anything else via str;
    NaN/inf become null with the original spelling kept beside it, see `rltrace._json`)."""
    return _json.dumps(value, keep_text=True, separators=(",", ":"), default=str)


def is_id_column(name: str) -> bool:
    """Id-like sample columns are stored as text, so string ids (verl's UUIDs) and integer ids
    from different processes read as one column."""
    return name in _names.ID_COLUMNS or name.endswith("_id") or name.endswith("_uid")


# --- what was dropped, and why ------------------------------------------------------------------
class Drops:
    """Rows and attributes lost on the write path, counted by (table, column, reason).

    One per process; written into its `processes` row (`drop_reasons`, a JSON list of
    `{table, column, reason, count}`) so `rltrace info` can say why, not just how many.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str | None, str], int] = {}

    def add(self, table: str, count: int, reason: str, column: str | None = None) -> None:
        if count <= 0:
            return
        key = (table, column, reason)
        with self._lock:
            if key not in self._counts and len(self._counts) >= MAX_REASONS:
                key = (table, None, "other reasons (more than %d distinct)" % MAX_REASONS)
            self._counts[key] = self._counts.get(key, 0) + count

    def total(self, table: str | None = None) -> int:
        with self._lock:
            return sum(n for (t, _, _), n in self._counts.items() if table is None or t == table)

    def records(self) -> list[dict]:
        with self._lock:
            return [{"table": t, "column": c, "reason": r, "count": n} for (t, c, r), n in self._counts.items()]

    def to_json(self) -> str | None:
        records = self.records()
        return dumps(records) if records else None

    def reset(self) -> None:
        with self._lock:
            self._counts = {}


def describe(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Sentences for `drop_reasons` records: "1 sample row: response_len 2**70 does not fit int64"."""
    out = []
    for r in records:
        n, table = r.get("count") or 0, r.get("table") or "?"
        unit = _UNITS.get(table, f"{table} row")
        column = f"{r['column']} " if r.get("column") else ""
        out.append(f"{n} {unit}{'' if n == 1 else 's'}: {column}{r.get('reason')}")
    return out


_UNITS = {"sample values": "sample value", "spans": "span", "samples": "sample row", "metrics": "metric row", "attributes": "span attribute", "batches": "frozen sample",
          "requests": "rejected OTLP request", "write errors": "write error", "refused spans": "refused span", "refused requests": "refused OTLP request",
          # left out by `rltrace import` (rltrace.store.imports.Refused)
          "metric log records": "metric log record", "metric log values": "metric log value",
          "slime samples": "slime dump sample", "slime fields": "slime sample field"}


def _diagnose(row: Mapping[str, Any], schema: pa.Schema | None, exc: Exception) -> tuple[str | None, str]:
    """(column, reason) for a row that failed conversion: the first value its column cannot hold."""
    for name, value in row.items():
        if is_id_column(str(name)):
            continue  # ids of any type are stored as text
        typ = schema.field(name).type if schema is not None and name in schema.names else None
        if isinstance(value, bool) and typ is not None and pa.types.is_integer(typ):
            return str(name), f"{show(value)} is a bool, not an integer"
        if isinstance(value, int) and not isinstance(value, bool) and not fits_int64(value):
            return str(name), f"{show(value)} does not fit int64"
        try:
            pa.array([value], typ)
        except Exception as err:  # noqa: BLE001 - any conversion error is the reason
            kind = typ if typ is not None else "a column"
            return str(name), f"{show(value)} cannot be stored as {kind} ({type(err).__name__})"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None, first[:200]


def convert(
    items: Sequence[Any],
    build: Callable[[Sequence[Any], bool], pa.Table],
    *,
    table: str,
    drops: Drops,
    why: Callable[[Any, Exception], tuple[str | None, str]],
) -> pa.Table | None:
    """`build(items, clean)` as one table, keeping every item that converts on its own.

    Tries the batch as given, then with text made valid UTF-8 (`clean=True`), then in halves
    down to single items; an item that still fails is dropped and counted with `why(item,
    exc)` = (column, reason). Returns None when nothing converts.
    """
    if not items:
        return None
    try:
        return build(items, False)
    except Exception:  # noqa: BLE001 - retried below, each failure counted
        pass
    try:
        return build(items, True)
    except Exception:  # noqa: BLE001
        pass
    good: list[pa.Table] = []
    halves = [list(items)]  # bisect: a batch with one bad row costs about 2 log2(n) conversions, not n
    while halves:
        part = halves.pop()
        try:
            good.append(build(part, True))
            continue
        except Exception as exc:  # noqa: BLE001
            if len(part) > 1:
                mid = len(part) // 2
                halves += [part[mid:], part[:mid]]  # first half popped first: row order is kept
                continue
            column, reason = why(part[0], exc)
        drops.add(table, 1, reason, column)
        logger.warning("rltrace: dropped 1 %s row: %s%s", table, f"{column} " if column else "", reason)
    if not good:
        return None
    return concat(good)


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of one store table as one; a user column whose type differs between them is stored as text."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    types: dict[str, set] = {}
    for t in tables:
        for f in t.schema:
            types.setdefault(f.name, set()).add(f.type)
    mixed = {n for n, ts in types.items() if len(ts - {pa.null()}) > 1}
    return pa.concat_tables([_as_text(t, mixed) for t in tables], promote_options="permissive")


def _as_text(table: pa.Table, names: set[str]) -> pa.Table:
    for name in names & set(table.column_names):
        column = table.column(name)
        i = table.column_names.index(name)
        table = table.set_column(i, name, text_column(column))
    return table


def text_column(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as text: strings as they are, integers in decimal, anything else as JSON."""
    typ = column.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return column.cast(pa.string())
    values = column.to_pylist()
    if pa.types.is_floating(typ):
        return pa.array([None if v is None else (str(int(v)) if v == v and v.is_integer() and abs(v) < 2**63 else str(v)) for v in values], pa.string())
    if pa.types.is_integer(typ) or pa.types.is_null(typ):
        return pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.array([None if v is None else (v if isinstance(v, str) else dumps(v)) for v in values], pa.string())
