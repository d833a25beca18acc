"""Store rows, built in one place: process, span, sample and metric rows, in the schemas of
`rltrace._names`, for every producer (the span exporter, `log_metrics`/`log_samples`, the process
heartbeat, `rltrace.testing`, the slime importer).

One odd value never costs its neighbours: every builder converts through
`rltrace.store.convert.convert`, so only rows that cannot be stored are dropped, each counted in
a `Drops` with its table, column and reason. Text is made valid UTF-8 here, at the boundary.
Integers must fit int64; rltrace's own arguments (step, weight_version, rank) are checked where
the caller passes them, a user column value that does not fit drops its row with the reason.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
from opentelemetry.trace import SpanKind, StatusCode

from rltrace import _json, _names
from rltrace.store import ids
from rltrace.store.convert import (  # noqa: F401 - re-exported: producers need only this module
    INT64_MAX,
    INT64_MIN,
    MAX_REASONS,
    Drops,
    Later,
    _diagnose,
    clean,
    concat,
    convert,
    describe,
    dumps,
    fits_int64,
    is_id_column,
    later,
    plain,
    plain_values,
    show,
    text,
    text_column,
)


# --- processes ------------------------------------------------------------------------------------
def process_columns(process, n: int) -> dict[str, pa.Array]:
    """The process columns (`process_id, role, rank, host, pid`) for `n` rows; `process` is a
    `rltrace.store.writer.ProcessInfo` (or anything with those attributes)."""
    return {
        "process_id": pa.array([process.process_id] * n, pa.string()),
        "role": pa.array([process.role] * n, pa.string()),
        "rank": pa.array([process.rank] * n, pa.int64()),
        "host": pa.array([process.host] * n, pa.string()),
        "pid": pa.array([process.pid] * n, pa.int64()),
    }


def who(process) -> dict[str, Any]:
    """The process columns of one row, as a dict."""
    return {"process_id": process.process_id, "role": process.role, "rank": process.rank, "host": process.host, "pid": process.pid}


def process_table(
    process,
    *,
    run_id: str,
    service_name: str,
    started_ns: int,
    heartbeat_ns: int,
    ended_ns: int | None = None,
    spans_written: int = 0,
    spans_dropped: int = 0,
    otlp_spans_dropped: int | None = None,
    rows_written: int = 0,
    rows_dropped: int = 0,
    attributes_dropped: int = 0,
    drop_reasons: str | None = None,
    rltrace_version: str | None = None,
    argv: list | None = None,
    resource: Mapping[str, Any] | None = None,
) -> pa.Table:
    """The one-row `processes` table of a process: who it is, its heartbeat and its counts."""
    if rltrace_version is None:
        from rltrace import __version__ as rltrace_version
    row = {
        **who(process),
        "run_id": run_id,
        "service_name": service_name,
        "started_ns": started_ns,
        "heartbeat_ns": heartbeat_ns,
        "ended_ns": ended_ns,
        "spans_written": spans_written,
        "spans_dropped": spans_dropped,
        "otlp_spans_dropped": otlp_spans_dropped,
        "rows_written": rows_written,
        "rows_dropped": rows_dropped,
        "attributes_dropped": attributes_dropped,
        "drop_reasons": drop_reasons,
        "rltrace_version": rltrace_version,
        "argv": dumps(list(argv or [])),
        "resource": dumps(dict(resource or {})),
    }
    return pa.Table.from_pylist([clean(row)], schema=_names.PROCESSES_SCHEMA)


# --- spans ----------------------------------------------------------------------------------------
def span_row(
    *,
    trace_id: str | int | bytes,
    span_id: str | int,
    name: str,
    start_ns: int,
    end_ns: int | None,
    parent_span_id: str | int | None = None,
    phase: str | None = None,
    step: int | None = None,
    weight_version: int | None = None,
    status: str = "UNSET",
    status_message: str | None = None,
    kind: str = "INTERNAL",
    thread_id: int | None = None,
    thread_name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    events: list | None = None,
    links: list | None = None,
) -> dict[str, Any]:
    """One `spans` row (without process columns) from plain values: for producers that do not
    hold OTel spans (hand-built runs, importers). Ids may be integers, hex text or any text
    (`rltrace.store.ids`); attributes, events and links become JSON."""
    return {
        "trace_id": ids.trace_bytes(trace_id),
        "span_id": ids.span_int(span_id),
        "parent_span_id": ids.span_int(parent_span_id),
        "name": name,
        "phase": phase,
        "step": step,
        "weight_version": weight_version,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "status": status,
        "status_message": status_message,
        "kind": kind,
        "thread_id": thread_id,
        "thread_name": thread_name,
        "attributes": dumps(dict(attributes or {})),
        "events": dumps(events) if events else None,
        "links": dumps(links) if links else None,
    }


def span_rows_table(rows: Sequence[Mapping[str, Any]], process, service_name: str, *, drops: Drops | None = None) -> pa.Table | None:
    """`span_row` dicts of one process as a `spans` table; rows that cannot be stored are counted in `drops`."""

    def build(items, cleaned):
        items = [clean(r) for r in items] if cleaned else items
        cols = {f: [r.get(f) for r in items] for f in _names.SPANS_SCHEMA.names if f not in _PROCESS_NAMES}
        cols.update(process_columns(process, len(items)))
        cols["service_name"] = [service_name] * len(items)
        return pa.table(cols, schema=_names.SPANS_SCHEMA)

    return convert(list(rows), build, table="spans", drops=drops or Drops(), why=lambda r, e: _diagnose(r, _names.SPANS_SCHEMA, e))


def span_columns_table(columns: Mapping[str, Any], n: int, process, service_name: str) -> pa.Table:
    """`n` spans of one process given as whole columns (Arrow arrays or lists), for producers that
    build many at once (`rltrace import metrics`): columns not given are null, `status` and `kind`
    default as in `span_row`, ids may be given as in `span_row`. The caller makes `attributes`
    JSON as `dumps` writes it."""
    defaults = {"status": "UNSET", "kind": "INTERNAL"}
    convert_ids = {"trace_id": ids.trace_column, "span_id": ids.span_ints, "parent_span_id": ids.span_ints}
    cols = {}
    for f in _names.SPANS_SCHEMA:
        if f.name in convert_ids and f.name in columns:
            cols[f.name] = convert_ids[f.name](columns[f.name])
        elif f.name in columns:
            cols[f.name] = columns[f.name]
        elif f.name in defaults:
            cols[f.name] = pa.repeat(pa.scalar(defaults[f.name], f.type), n)
        elif f.name not in _PROCESS_NAMES and f.name != "service_name":
            cols[f.name] = pa.nulls(n, f.type)
    cols.update(process_columns(process, n))
    cols["service_name"] = pa.repeat(pa.scalar(service_name, pa.string()), n)
    return pa.table(cols, schema=_names.SPANS_SCHEMA)


_PROCESS_NAMES = frozenset(("process_id", "role", "rank", "host", "pid"))


def _as_int(value) -> int | None:
    if type(value) is int:
        return value
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _event_json(events) -> str | None:
    if not events:
        return None
    return dumps([{"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in events])


def _links_json(links) -> str | None:
    if not links:
        return None
    return dumps([{"trace_id": f"{l.context.trace_id:032x}", "span_id": f"{l.context.span_id:016x}"} for l in links])


def _span_attributes(span) -> dict:
    """A copy of the span's attributes; a live span may be changing them on another thread."""
    for _ in range(10):
        try:
            return dict(span.attributes or {})
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return {}


def _finished_attributes(span) -> dict:
    """The attributes of a finished span, read in place: an SDK span keeps them in a dict that is
    immutable once it has ended (its `attributes` property wraps it in a proxy whose iteration costs
    microseconds a span); spans of other kinds (received over OTLP) hold a plain dict."""
    inner = getattr(getattr(span, "_attributes", None), "_dict", None)
    return inner if type(inner) is dict else _span_attributes(span)


def _sequence(span, private: str, public: str):
    """A span's events or links, empty ones without the copy its public property makes (SDK spans
    keep a `BoundedList`, whose deque is looked at directly; copied in one step when not empty, as
    a live span may add to it meanwhile); spans of other kinds hold a list."""
    inner = getattr(span, private, None)
    inner = getattr(inner, "_dq", inner)
    if inner is None:
        return getattr(span, public, None)
    return tuple(inner) if inner else None


_STATUS = {code: code.name for code in StatusCode}
_KIND = {kind: kind.name for kind in SpanKind}
_UNSET, _INTERNAL = StatusCode.UNSET, SpanKind.INTERNAL  # most spans: compared by identity (an enum hashes in Python)
_PROMOTED = frozenset((_names.PHASE, _names.STEP, _names.WEIGHT_VERSION, _names.THREAD_ID, _names.THREAD_NAME))
_JSON_CACHE: dict[tuple, str] = {}  # the JSON of attribute sets seen recently (most spans repeat a few)
_JSON_CACHE_MAX = 4096


def _span_columns(spans, process, service_name: str, still_open: bool, cleaned: bool, local: bool = True) -> pa.Table:
    """The columns of `spans`, field by field: the export thread shares the interpreter lock with
    the training loop, so this is a few list comprehensions and one pass over the attributes."""
    fast = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False).encode  # ASCII: surrogates escaped

    def encode(value):
        try:
            return fast(value)
        except ValueError:  # NaN/inf: null with the spelling kept beside it (strict JSON, rltrace._json)
            return fast(_json.strict(value, keep_text=True))

    n = len(spans)
    read = _span_attributes if still_open else _finished_attributes
    contexts = [s.context for s in spans]
    parents = [s.parent for s in spans]
    roots = np.fromiter((p is None for p in parents), bool, n)
    statuses = [s.status for s in spans]
    phases, steps, versions, thread_ids, thread_names, attributes = [], [], [], [], [], []
    cache = _JSON_CACHE
    for span in spans:
        attrs = read(span)
        get = attrs.get
        phases.append(get(_names.PHASE))
        step = get(_names.STEP)
        steps.append(step if step is None or type(step) is int else _as_int(step))
        version = get(_names.WEIGHT_VERSION)
        versions.append(version if version is None or type(version) is int else _as_int(version))
        thread = get(_names.THREAD_ID)
        thread_ids.append(thread if thread is None or type(thread) is int else _as_int(thread))
        thread_names.append(get(_names.THREAD_NAME))
        rest = {k: v for k, v in attrs.items() if k not in _PROMOTED}
        if not rest:
            attributes.append("{}")
            continue
        try:
            key = tuple(rest.items())
            text_ = cache.get(key)
        except TypeError:  # an unhashable value (a list from a plain dict): encode it every time
            key, text_ = None, None
        if text_ is None:
            text_ = encode(rest)
            if key is not None:
                if len(cache) >= _JSON_CACHE_MAX:
                    cache.clear()
                cache[key] = text_
        attributes.append(text_)
    if not all(thread_names):  # this process's thread names, looked up here, off the hot path
        known = {t.ident: t.name for t in threading.enumerate()} if local else {}  # a remote span's ids are not ours
        thread_names = [name or known.get(tid) for name, tid in zip(thread_names, thread_ids)]
    names = [s.name for s in spans]
    messages = [st.description for st in statuses]
    if cleaned:  # the retry after a failed conversion: every text valid UTF-8, every name a string
        names, phases, messages, thread_names = (
            [None if v is None else text(v if isinstance(v, str) else str(v)) for v in column]
            for column in (names, phases, messages, thread_names)
        )
        service_name = text(str(service_name))
    return pa.table(
        {
            "trace_id": _trace_ids(contexts),
            "span_id": pa.array(np.fromiter((c.span_id for c in contexts), np.uint64, n).view(np.int64)),
            "parent_span_id": pa.array(np.fromiter((0 if p is None else p.span_id for p in parents), np.uint64, n)
                                       .view(np.int64), mask=roots),
            "name": names,
            "phase": phases,
            "step": steps,
            "weight_version": versions,
            "start_ns": [s.start_time for s in spans],
            "end_ns": [None] * n if still_open else [s.end_time for s in spans],
            "status": ["UNSET" if st.status_code is _UNSET else _STATUS[st.status_code] for st in statuses],
            "status_message": messages,
            "kind": ["INTERNAL" if s.kind is _INTERNAL else _KIND[s.kind] for s in spans],
            "thread_id": thread_ids,
            "thread_name": thread_names,
            **process_columns(process, n),
            "service_name": pa.repeat(pa.scalar(service_name, pa.string()), n),
            "attributes": attributes,
            "events": [_event_json(_sequence(s, "_events", "events")) for s in spans],
            "links": [_links_json(_sequence(s, "_links", "links")) for s in spans],
        },
        schema=_names.SPANS_SCHEMA,
    )


def _trace_ids(contexts) -> pa.Array:
    """16 bytes per span; spans of one trace usually come together, so each trace id is converted once."""
    out, last, last_bytes = [], None, None
    for c in contexts:
        t = c.trace_id
        if t != last:
            last, last_bytes = t, t.to_bytes(16, "big")
        out.append(last_bytes)
    return pa.array(out, ids.TRACE_TYPE)


def _span_why(span, exc: Exception) -> tuple[str | None, str]:
    attrs = _span_attributes(span)
    for key, column in ((_names.STEP, "step"), (_names.WEIGHT_VERSION, "weight_version"), (_names.THREAD_ID, "thread_id")):
        value = _as_int(attrs.get(key))
        if value is not None and not fits_int64(value):
            return column, f"{show(value)} does not fit int64"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None, f"span {text(str(span.name))[:60]!r}: {first[:160]}"


def spans_table(
    spans: Sequence[Any], process, service_name: str, *, still_open: bool = False, drops: Drops | None = None,
    local: bool = True,
) -> pa.Table | None:
    """One row per OTel span in the `spans` schema (see docs/store.md); `still_open` rows get no end;
    `local=False` for spans from another process (received over OTLP).

    Runs on the export thread for every span, so the usual path is one pass over plain lists,
    with no JSON encoding for a span that has no attributes beyond the promoted ones. Spans
    that cannot be stored are counted in `drops` (table "spans"); None when none can.
    """
    return convert(
        list(spans),
        lambda items, cleaned: _span_columns(items, process, service_name, still_open, cleaned, local),
        table="spans",
        drops=drops if drops is not None else Drops(),
        why=_span_why,
    )


# --- metrics --------------------------------------------------------------------------------------
def metrics_table(step: int, values: Mapping[str, Any], time_ns: int, process, *, drops: Drops | None = None) -> pa.Table | None:
    """`log_metrics` scalars of one step as `metrics` rows (long format: one row per name). A value
    may be a `Later` (a device tensor read here, on the writer thread); one that cannot be read is
    dropped and counted."""
    drops = drops if drops is not None else Drops()
    if any(type(v) is Later for v in values.values()):
        values = dict(values)
        for name, value in list(values.items()):
            if type(value) is Later:
                try:
                    values[name] = float(value.read())
                except Exception as exc:  # noqa: BLE001 - the caller is gone: count it
                    del values[name]
                    drops.add("metrics", 1, f"its tensor could not be read ({type(exc).__name__}: {text(str(exc))[:120]})", text(str(name)))

    def build(items, cleaned):
        n = len(items)
        return pa.table(
            {
                "step": pa.array([step] * n, pa.int64()),
                "name": pa.array([text(k) if cleaned else k for k, _ in items], pa.string()),
                "value": pa.array([v for _, v in items], pa.float64()),
                "time_ns": pa.array([time_ns] * n, pa.int64()),
                **process_columns(process, n),
            },
            schema=_names.METRICS_SCHEMA,
        )

    return convert(
        list(values.items()), build, table="metrics", drops=drops,
        why=lambda item, exc: (text(str(item[0])), f"{show(item[1])} cannot be stored as a float"),
    )


# --- samples --------------------------------------------------------------------------------------
def _split_versions(row: Mapping[str, Any]) -> Mapping[str, Any]:
    versions = row.get("weight_version")
    if not isinstance(versions, (list, tuple)):
        return row
    row = dict(row)
    row["weight_versions"] = list(versions)
    row["weight_version"] = min(versions) if versions else None
    return row


def _id_text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return str(int(value)) if value == value and value.is_integer() and abs(value) < 2**63 else str(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if item is not None and getattr(value, "ndim", 0) == 0:
        return _id_text(item())
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def sample_rows(payload: Any) -> list[dict]:
    """The rows of a `log_samples` payload (list of dicts, dict of columns, Arrow table, DataFrame)."""
    if isinstance(payload, pa.Table):
        return payload.to_pylist()
    if isinstance(payload, Mapping):
        names = list(payload)
        return [dict(zip(names, values)) for values in zip(*payload.values())]
    if isinstance(payload, (list, tuple)):
        return [dict(r) for r in payload]
    if hasattr(payload, "to_dict"):
        return payload.to_dict("records")
    return pa.table(payload).to_pylist()


def _user_table(payload: Any) -> pa.Table:
    if isinstance(payload, pa.Table):
        return payload
    if isinstance(payload, Mapping):
        payload = sample_rows(payload)
    if isinstance(payload, (list, tuple)):
        rows = list(payload)
        if any(isinstance(r.get("weight_version"), (list, tuple)) for r in rows):
            rows = [_split_versions(r) for r in rows]
        names = list(dict.fromkeys(k for r in rows for k in r))  # every row's keys, not the first's
        if not names:  # rows without columns are still rows (step, time and process are stored)
            return pa.table({"_": [None] * len(rows)}).drop_columns(["_"])
        return pa.table({str(k): [_id_text(r.get(k)) for r in rows] if is_id_column(str(k)) else [r.get(k) for r in rows] for k in names})
    return pa.table(payload)


def _typed(user: pa.Table) -> dict[str, pa.ChunkedArray | pa.Array]:
    columns = {name: user.column(name) for name in user.column_names}
    versions = columns.get("weight_version")
    if versions is not None and (pa.types.is_list(versions.type) or pa.types.is_large_list(versions.type)):
        columns["weight_versions"] = versions.cast(pa.list_(pa.int64()))
        columns["weight_version"] = pa.array([min(v) if v else None for v in columns["weight_versions"].to_pylist()], pa.int64())
    for name, column in columns.items():
        typ = _names.SAMPLE_COLUMNS.get(name)
        if name in TIME_COLUMNS:
            columns[name] = column = _as_seconds(name, column)
        if is_id_column(name):
            if not pa.types.is_string(column.type):
                columns[name] = text_column(column)
        elif typ is not None and column.type != typ:
            columns[name] = column.cast(typ)
    return columns


#: Sample columns in Unix seconds; a value in ms, µs or ns (`time.time_ns()`) is recognised by its size.
TIME_COLUMNS = ("gen_start", "gen_end")
_UNITS = ((1e17, 1e9, "nanoseconds (time.time_ns())"), (1e14, 1e6, "microseconds"), (1e11, 1e3, "milliseconds"))
_told: set[tuple[str, str]] = set()


def _as_seconds(name: str, column):
    """A time column in Unix seconds: today's Unix time is ~1.7e9 s, so a column whose values reach
    1e11 is in ms, 1e14 µs, 1e17 ns; it is divided (and said once per process), not dropped."""
    import pyarrow.compute as pc

    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        return column
    top = pc.max(pc.abs(column)).as_py()
    for limit, per_second, unit in _UNITS:
        if top is not None and top >= limit:
            if (name, unit) not in _told:
                _told.add((name, unit))
                import logging

                logging.getLogger("rltrace").warning(
                    "rltrace: log_samples column %r looks like Unix %s; stored as seconds (docs/store.md)", name, unit)
            return pc.divide(pc.cast(column, pa.float64(), safe=False), per_second)
    return column


#: Sample columns rltrace sets itself; a user's column of one of these names is refused.
RESERVED_SAMPLE_COLUMNS = frozenset(("step", "logged_ns", "process_id", "role", "rank", "host", "pid"))


#: Why a column named "" is refused: DuckDB would show it as `C<n>`, a name no query can rely on.
UNNAMED = "a column without a name (the empty string) cannot be queried by name; name it (the rest of the row is kept)"
_REFUSED_NAMES = RESERVED_SAMPLE_COLUMNS | {""}


def _checked_rows(rows: Sequence[Any], drops: Drops) -> list[Mapping[str, Any]]:
    """Rows that are dicts, without columns rltrace sets itself or without a name (each refusal counted)."""
    good = [r for r in rows if isinstance(r, Mapping)]
    if len(good) < len(rows):
        drops.add("samples", len(rows) - len(good), "not a dict (log_samples takes one dict per sample)")
    if any(not _REFUSED_NAMES.isdisjoint(r) for r in good):
        for name in _REFUSED_NAMES:
            n = sum(1 for r in good if name in r)
            drops.add("sample values", n, UNNAMED if name == "" else "set by rltrace itself; rename yours (the rest of the row is kept)", name)
        good = [{k: v for k, v in r.items() if k not in _REFUSED_NAMES} for r in good]
    return good


def _named(payload: Any, drops: Drops) -> Any:
    """A dict of columns, an Arrow table or a DataFrame without a column named "" (its values counted)."""
    if isinstance(payload, Mapping):
        names = list(payload)
    elif isinstance(payload, pa.Table):
        names = payload.column_names
    else:
        names = [str(c) for c in getattr(payload, "columns", ())]
    if "" not in names:
        return payload
    if isinstance(payload, Mapping):
        drops.add("sample values", sum(1 for v in payload[""] if v is not None), UNNAMED, "")
        return {k: v for k, v in payload.items() if k != ""}
    if isinstance(payload, pa.Table):
        i = payload.column_names.index("")
        drops.add("sample values", payload.num_rows - payload.column(i).null_count, UNNAMED, "")
        return payload.remove_column(i)
    if hasattr(payload, "drop"):  # a DataFrame
        drops.add("sample values", int(payload[""].notna().sum()), UNNAMED, "")
        return payload.drop(columns=[""])
    return payload


def samples_table(step: int, payload: Any, logged_ns: int, process, *, drops: Drops | None = None) -> pa.Table | None:
    """`log_samples` rows of one step in the `samples` schema: the standard per-sample columns with their
    fixed types (ids as text), other columns as they come. Rows that cannot be stored are
    dropped one by one and counted in `drops` (table "samples") with column and reason."""
    drops = drops if drops is not None else Drops()
    if isinstance(payload, (list, tuple)):  # the caller checked only the first row: check the rest here
        payload = _checked_rows(payload, drops)
    else:
        payload = _named(payload, drops)

    def finish(user: pa.Table) -> pa.Table:
        n = user.num_rows
        columns: dict[str, Any] = {
            "step": pa.array([step] * n, pa.int64()),
            "logged_ns": pa.array([logged_ns] * n, pa.int64()),
            **process_columns(process, n),
        }
        columns.update(_typed(user))
        return pa.table(columns)

    try:
        return finish(_user_table(payload))
    except Exception:  # noqa: BLE001 - converted again row by row below
        pass
    rows = plain_values(sample_rows(payload))  # 0-d tensors and numpy scalars as the numbers they hold, once
    schema = pa.schema([pa.field(n, pa.string() if is_id_column(n) else t) for n, t in _names.SAMPLE_COLUMNS.items()])
    return convert(
        rows,
        lambda items, cleaned: finish(_user_table([clean(r) for r in items] if cleaned else items)),
        table="samples",
        drops=drops,
        why=lambda row, exc: _diagnose(_split_versions(row), schema, exc),
    )


def first_of_each(spans: pa.Table) -> pa.Table:
    """The rows of `spans` with each identity (trace_id, span_id) once: its first row, in order."""
    index = pa.array(np.arange(spans.num_rows, dtype=np.int64))
    keys = pa.table({"t": spans.column("trace_id"), "s": spans.column("span_id"), "i": index})
    first = keys.group_by(["t", "s"], use_threads=False).aggregate([("i", "min")]).column("i_min")
    if len(first) == spans.num_rows:
        return spans
    return spans.take(np.sort(first.to_numpy()))
