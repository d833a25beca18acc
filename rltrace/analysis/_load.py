"""Loading the spans of a batch of steps for their summaries: from each span part's per-part
summary where one is in force (`rltrace.store.digest`: a few rows a step), from its spans where
not (parts still being written, runs of writers that do not merge).

The rows are what `_compute.Spans.from_arrow` takes, each standing for `count` spans of
`total_ns` summed duration. Two cases read spans instead of a summary's union, so the result is
the one the spans give:
- a union of another step that reaches past the batch's time range (its spans outside the range
  would be counted in that step's busy time, which the analysis reads only inside the range);
- a union holding a span that a loaded span names as its parent (a child in another process,
  or one that started after its parent ended): the analysis needs that span itself.
Rows come ordered by (start, span id), so ties are broken the same however the parts are laid out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rltrace import _names
from rltrace.analysis import _compute
from rltrace.store import views

_PARTS = "_rltrace_span_parts"
_RAW = """span_id, parent_span_id, coalesce(phase, name, '') AS phase, name, step, process_id, thread_id, start_ns, end_ns,
          CASE WHEN phase = 'wait' THEN attr(attributes, '{waiting}') END AS waiting_for,
          CASE WHEN phase = 'weight_sync' THEN TRY_CAST(attr(attributes, '{nbytes}') AS DOUBLE) END AS sync_bytes,
          CASE WHEN phase = 'weight_sync' THEN attr(attributes, '{method}') END AS sync_method""".format(
    waiting=_names.WAITING_FOR, nbytes=_names.SYNC_BYTES, method=_names.SYNC_METHOD)
_KEY = ("step", "process_id", "phase", "parent_span_id")  # with same_thread: what a summary's union merges by
_OUT = [f.name for f in _names.SPAN_DIGEST_SCHEMA][:14]  # the analysis columns, count and total_ns


def parts(con) -> tuple[list[views.Part], list[tuple[views.Part, str]]]:
    """(span parts read as spans, (span part, its summary's path) for parts with a summary in force)."""
    raw, summarised = [], []
    for path, rows, size, version, digest in con.execute(
            f"SELECT path, rows, size, version, digest FROM {_PARTS}").fetchall():
        part = views.Part(path=path, rows=rows, size=size, version=version)
        (summarised.append((part, digest)) if digest else raw.append(part))
    return raw, summarised


def _raw_rows(con, found: list[views.Part], where: str, params: dict) -> pa.Table:
    return con.sql(
        f"""SELECT {_RAW}, CAST(1 AS BIGINT) AS count, end_ns - start_ns AS total_ns
            FROM ({views.parts_sql(_names.SPANS, found)}) WHERE {where}""", params=params).to_arrow_table()


def load(con, batch: pd.DataFrame) -> _compute.Spans:
    """Finished spans overlapping the batch's steps in time (other steps' spans keep processes busy)."""
    lo, hi = int(batch["start_ns"].min()), int(batch["end_ns"].max())
    window = {"lo": lo, "hi": hi}
    inside = "end_ns >= $lo AND start_ns <= $hi"
    raw, summarised = parts(con)
    tables = []
    if raw:
        tables.append(_raw_rows(con, raw, inside, window))
    if summarised:
        files = views.sql_paths([p for _, p in summarised])
        rows = con.sql(
            f"""SELECT {', '.join(_OUT)}, same_thread, parent_thread_id, filename AS digest
                FROM read_parquet({files}, filename = true) WHERE {inside}""", params=window).to_arrow_table()
        tables.append(_exact(con, rows, tables[0] if tables else None, batch, window, dict((d, p) for p, d in summarised)))
    if not tables:
        return _compute.Spans.from_arrow(_empty())
    table = pa.concat_tables([t.select(_OUT) for t in tables])
    order = pc.sort_indices(table, sort_keys=[("start_ns", "ascending"), ("span_id", "ascending")])
    return _compute.Spans.from_arrow(table, order=order.to_numpy())  # sorted by index: the text is never moved


def _empty() -> pa.Table:
    return pa.schema([f for f in _names.SPAN_DIGEST_SCHEMA if f.name in _OUT]).empty_table()


def _exact(con, rows: pa.Table, spans: pa.Table | None, batch: pd.DataFrame, window: dict, part_of: dict) -> pa.Table:
    """Summary rows of the batch, with the unions that must be read as spans replaced by their
    spans (`spans`: the rows read as spans from parts without a summary)."""
    merged = rows["span_id"].is_null().to_numpy(zero_copy_only=False)
    if not merged.any():
        return rows
    step = rows["step"].combine_chunks()
    steps = pa.array(batch["step"].to_numpy(np.int64))
    other_step = step.is_valid().to_numpy(zero_copy_only=False) & ~pc.is_in(step, steps).to_numpy(zero_copy_only=False)
    start = rows["start_ns"].to_numpy()
    end = rows["end_ns"].to_numpy()
    crossing = merged & other_step & ((start < window["lo"]) | (end > window["hi"]))
    expand = crossing | _holding_parents(con, rows, spans, merged, window, part_of)
    if not expand.any():
        return rows
    spans = _members(con, rows.filter(pa.array(expand)), rows, part_of, window)
    kept = rows.filter(pa.array(~expand))
    return pa.concat_tables([kept.select(_OUT), spans.select(_OUT)])


def _holding_parents(con, rows: pa.Table, spans: pa.Table | None, merged: np.ndarray, window: dict,
                     part_of: dict) -> np.ndarray:
    """Which merged rows hold a span that a loaded row names as its parent (none, nearly always)."""
    out = np.zeros(len(rows), bool)
    loaded = [rows] if spans is None else [rows.select(["span_id", "parent_span_id"]),
                                           spans.select(["span_id", "parent_span_id"])]

    def column(name: str) -> pa.ChunkedArray:
        return pa.chunked_array([chunk for t in loaded for chunk in t[name].cast(pa.int64()).chunks], pa.int64())

    ids = column("span_id").drop_null()
    wanted = pc.unique(column("parent_span_id").drop_null())
    dangling = pc.filter(wanted, pc.invert(pc.is_in(wanted, pc.unique(ids))))
    if not len(dangling):
        return out
    # the spans named but not loaded: in a union, or not in this range at all (as when reading the spans)
    con.register("_rltrace_dangling", pa.table({"id": dangling}))
    try:
        sql = views.parts_sql(_names.SPANS, list(part_of.values()), ", filename = true")
        hits = con.sql(
            f"""SELECT s.span_id, s.step, s.process_id, coalesce(s.phase, s.name, '') AS phase, s.parent_span_id,
                       s.start_ns, s.end_ns, s.filename AS part
                FROM ({sql}) s SEMI JOIN _rltrace_dangling d ON s.span_id = d.id
                WHERE s.end_ns >= $lo AND s.start_ns <= $hi""", params=window).df()
    finally:
        con.unregister("_rltrace_dangling")
    if hits.empty:
        return out
    frame = rows.select(["step", "process_id", "phase", "parent_span_id", "start_ns", "end_ns", "digest"]).to_pandas()
    frame["part"] = [str(part_of[d].path) if d in part_of else None for d in frame["digest"]]
    for hit in hits.itertuples(index=False):
        same = (merged & (frame["part"].to_numpy(object) == str(hit.part))
                & _equal(frame["step"], hit.step) & (frame["process_id"].to_numpy(object) == hit.process_id)
                & (frame["phase"].to_numpy(object) == hit.phase) & _equal(frame["parent_span_id"], hit.parent_span_id)
                & (frame["start_ns"].to_numpy() <= hit.start_ns) & (frame["end_ns"].to_numpy() >= hit.end_ns))
        out |= same
    return out


def _equal(column: pd.Series, value) -> np.ndarray:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return column.isna().to_numpy()
    return (column == value).fillna(False).to_numpy(bool)


def _members(con, unions: pa.Table, rows: pa.Table, part_of: dict, window: dict) -> pa.Table:
    """The spans of these unions, read from their span parts: the part's spans of the union's key,
    on the union's side of its parent's thread, inside its time, that its summary holds in no row
    of their own."""
    structural = rows.filter(rows["span_id"].is_valid()).select(["span_id", "digest"])
    out = []
    for digest in pc.unique(unions["digest"]).to_pylist():
        mine = unions.filter(pc.equal(unions["digest"], digest))
        con.register("_rltrace_unions", mine.select([*_KEY, "same_thread", "parent_thread_id", "start_ns", "end_ns"]))
        con.register("_rltrace_singles", structural.filter(pc.equal(structural["digest"], digest)).select(["span_id"]))
        try:
            sql = views.parts_sql(_names.SPANS, [part_of[digest]], ", filename = true")
            out.append(con.sql(
                f"""SELECT s.span_id, s.parent_span_id, s.phase, s.name, s.step, s.process_id, s.thread_id, s.start_ns,
                           s.end_ns, s.waiting_for, s.sync_bytes, s.sync_method, s.count, s.total_ns
                    FROM (SELECT {_RAW}, CAST(1 AS BIGINT) AS count, end_ns - start_ns AS total_ns FROM ({sql})) s
                    JOIN _rltrace_unions u
                      ON s.step IS NOT DISTINCT FROM u.step AND s.process_id = u.process_id AND s.phase = u.phase
                     AND s.parent_span_id = u.parent_span_id AND s.start_ns >= u.start_ns AND s.end_ns <= u.end_ns
                     AND (coalesce(s.thread_id, -1) = u.parent_thread_id) = u.same_thread
                    WHERE s.end_ns >= $lo AND s.start_ns <= $hi  -- as the spans are read: those in the range
                      AND s.span_id NOT IN (SELECT span_id FROM _rltrace_singles)""", params=window).to_arrow_table())
        finally:
            con.unregister("_rltrace_unions")
            con.unregister("_rltrace_singles")
    return pa.concat_tables(out) if out else _empty()
