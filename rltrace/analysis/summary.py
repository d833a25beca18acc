"""Per-step summaries: read the ones `rltrace compact` stored, compute the rest, cache per connection.

A stored step is used only while it still matches the spans. When the span parts are exactly
those the summary was computed from (a digest of their names, rows and sizes, kept in the
summary's footer), every stored step holds. Otherwise each step's fingerprint must equal the
live one: its own spans (count, first start, last end, summed durations) and every finished span
overlapping its time range, with a step or without (count and summed durations), since those
change its waits too (a reward server that never received the step, an overlapping async step
flushed late). Steps that changed, and runs never compacted, are recomputed from the spans.
Results are cached in temporary tables of the connection (a connection is a snapshot, so they
never go stale).
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from rltrace import _names
from rltrace.analysis import _compute
from rltrace.analysis._steps import Steps, step_filter

_CACHE = "_rltrace_summary"
_CHECKS = "_rltrace_checks"
_WINDOWS = "_rltrace_windows"
BATCH_SPANS = 1_000_000  # spans loaded at once when computing


def _has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0])


def checks(con, steps: Steps = None) -> pd.DataFrame:
    """Per step: step, count (finished spans), start_ns, end_ns, total_ns (summed durations)."""
    if not _has_table(con, _CHECKS):
        con.execute(
            f"""CREATE TEMP TABLE {_CHECKS} AS
            SELECT step, count(*) AS count, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns
            FROM spans WHERE NOT is_open AND step IS NOT NULL GROUP BY step"""
        )
    where, params = step_filter(steps)
    return con.execute(f"SELECT * FROM {_CHECKS} WHERE {where} ORDER BY step", params).df()


def windows(con, steps: pd.DataFrame) -> pd.DataFrame:
    """Per step of `steps` (step, start_ns, end_ns): window_count and window_ns of every finished
    span overlapping [start_ns, end_ns], whatever its step (the step's second fingerprint)."""
    con.register("_rltrace_steps", steps[["step", "start_ns", "end_ns"]])
    try:
        return con.execute(
            """SELECT s.step, count(f.start_ns) AS window_count,
                      CAST(coalesce(sum(f.end_ns - f.start_ns), 0) AS BIGINT) AS window_ns
               FROM _rltrace_steps s
               LEFT JOIN (SELECT start_ns, end_ns FROM spans WHERE NOT is_open) f
                 ON f.end_ns >= s.start_ns AND f.start_ns <= s.end_ns
               GROUP BY s.step ORDER BY s.step"""
        ).df()
    finally:
        con.unregister("_rltrace_steps")


def parts_digest(con) -> str | None:
    """Digest of the span parts this connection reads (stored with a summary by `rltrace compact`)."""
    return _meta(con, "spans_digest")


def _meta(con, key: str) -> str | None:
    if not _has_table(con, "_rltrace_meta"):
        return None
    rows = con.execute("SELECT value FROM _rltrace_meta WHERE key = ?", [key]).fetchall()
    return rows[0][0] if rows else None


def rows(con, steps: Steps = None, kinds: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Summary rows (columns of `rltrace._names.STEP_SUMMARY_SCHEMA`) for the selected steps."""
    _fill(con, steps)
    where, params = step_filter(steps)
    if kinds:
        where += " AND kind IN (" + ", ".join("?" for _ in kinds) + ")"
        params += list(kinds)
    return con.execute(f"SELECT * FROM {_CACHE} WHERE {where} ORDER BY step, kind, seq", params).df()


def table(con) -> pa.Table:
    """Every step's summary as an Arrow table in the `step_summary` schema (what compact stores),
    step rows carrying both fingerprints."""
    _fill(con, None)
    wins = windows(con, checks(con))
    con.register("_rltrace_wins", wins)
    try:
        out = con.sql(
            f"""SELECT c.* REPLACE (
                      CASE WHEN c.kind = 'step' THEN w.window_count END AS window_count,
                      CASE WHEN c.kind = 'step' THEN w.window_ns END AS window_ns)
                FROM {_CACHE} c LEFT JOIN _rltrace_wins w USING (step)
                ORDER BY step, kind, seq"""
        ).to_arrow_table()
    finally:
        con.unregister("_rltrace_wins")
    return out.select(_names.STEP_SUMMARY_SCHEMA.names).cast(_names.STEP_SUMMARY_SCHEMA)


def _fill(con, steps: Steps) -> None:
    if not _has_table(con, _CACHE):
        con.execute(f"CREATE TEMP TABLE {_CACHE} AS SELECT * FROM step_summary LIMIT 0")
    wanted = checks(con, steps)
    done = {r[0] for r in con.execute(f"SELECT DISTINCT step FROM {_CACHE}").fetchall()}
    missing = wanted[~wanted["step"].isin(done)]
    if missing.empty:
        return
    _reuse_stored(con, missing)
    done = {r[0] for r in con.execute(f"SELECT DISTINCT step FROM {_CACHE}").fetchall()}
    for batch in _batches(missing[~missing["step"].isin(done)]):
        spans = _load(con, batch)
        computed = _compute.compute(spans, batch)
        con.register("_rltrace_computed", computed)
        try:
            con.execute(f"INSERT INTO {_CACHE} BY NAME SELECT * FROM _rltrace_computed")
        finally:
            con.unregister("_rltrace_computed")


def _reuse_stored(con, missing: pd.DataFrame) -> None:
    """Copy the stored rows of the `missing` steps that still match the spans into the cache."""
    if not con.execute("SELECT count(*) FROM step_summary WHERE kind = 'step'").fetchall()[0][0]:
        return
    digest = parts_digest(con)
    same_parts = digest is not None and digest == _meta(con, "summary_of")
    candidates = missing
    if not same_parts:  # spans arrived (or parts changed) since compact: check each step's window too
        candidates = missing.merge(windows(con, missing), on="step")
    window_check = "" if same_parts else "AND k.window_count = m.window_count AND k.window_ns = m.window_ns"
    con.register("_rltrace_missing", candidates)
    try:
        con.execute(
            f"""INSERT INTO {_CACHE} BY NAME
            SELECT s.* FROM step_summary s JOIN (
                SELECT k.step FROM step_summary k JOIN _rltrace_missing m
                  ON k.step = m.step AND k.count = m.count AND k.start_ns = m.start_ns
                 AND k.end_ns = m.end_ns AND k.total_ns = m.total_ns {window_check}
                WHERE k.kind = 'step' AND k.version = ?) v USING (step)""",
            [_compute.VERSION],
        )
    finally:
        con.unregister("_rltrace_missing")


def _batches(missing: pd.DataFrame):
    """Consecutive steps cut into groups of about BATCH_SPANS spans."""
    missing = missing.sort_values("step")
    start, total = 0, 0
    for i, n in enumerate(missing["count"].to_numpy()):
        if i > start and total + n > BATCH_SPANS:
            yield missing.iloc[start:i]
            start, total = i, 0
        total += n
    if start < len(missing):
        yield missing.iloc[start:]


def _load(con, batch: pd.DataFrame) -> _compute.Spans:
    """Finished spans overlapping the batch's steps in time (other steps' spans keep processes busy)."""
    lo, hi = int(batch["start_ns"].min()), int(batch["end_ns"].max())
    table = con.sql(
        f"""SELECT span_id, parent_span_id, coalesce(phase, name, '') AS phase, name, step, process_id,
                   thread_id, start_ns, end_ns,
                   CASE WHEN phase = 'wait' THEN attr(attributes, '{_names.WAITING_FOR}') END AS waiting_for,
                   CASE WHEN phase = 'weight_sync'
                        THEN TRY_CAST(attr(attributes, '{_names.SYNC_BYTES}') AS DOUBLE) END AS sync_bytes,
                   CASE WHEN phase = 'weight_sync' THEN attr(attributes, '{_names.SYNC_METHOD}') END AS sync_method
            FROM spans WHERE NOT is_open AND end_ns >= $lo AND start_ns <= $hi""",
        params={"lo": lo, "hi": hi},
    ).to_arrow_table()
    return _compute.Spans.from_arrow(table)
