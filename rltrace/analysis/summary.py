"""Per-step summaries: reuse the ones stored or cached that still hold, compute the rest.

A stored step is used only while it still matches the spans. When the span parts are exactly
those the summary was computed from (a digest of their names, rows and sizes, kept in the
summary's footer), every stored step holds. Otherwise each step's fingerprint must equal the
live one: its own spans (count, first start, last end, summed durations) and every finished span
overlapping its time range, with a step or without (count and summed durations), since those
change its waits too (a reward server that never received the step, an overlapping async step
flushed late). Steps that changed, and runs never compacted, are recomputed from the spans.
Results are cached in temporary tables of the connection (a connection is a snapshot, so they
never go stale), and a report over every step leaves them in a local summary cache
(`RLTRACE_SUMMARY_CACHE_DIR`: a Parquet file per run id, plus small additions holding a live
run's newest steps) with the list of span parts they were computed from. The next report reuses every cached step whose own fingerprint still holds and
whose time range no new span part touches, so a report on a live run computes only the new
steps, with no `rltrace compact`. A part merged from parts the cache listed holds no new span
(writers merge their parts all the while); a part merged from others may, so the steps it reaches
are computed again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from rltrace import _names
from rltrace.analysis import _compute, _parts
from rltrace.analysis._load import load as _load_batch
from rltrace.analysis._steps import Steps, step_filter
from rltrace.store import views

_CACHE = "_rltrace_summary"
_CHECKS = "_rltrace_checks"
_FILLED = "_rltrace_filled"  # exists once the connection's cache holds every step
_WINDOWS = "_rltrace_windows"
_PART_STEPS = "_rltrace_part_steps"  # per span part and step (NULL too): count, first start, last end, summed ns
logger = logging.getLogger("rltrace")
BATCH_SPANS = (400_000, 1_000_000)  # rows loaded at once: a quarter of the run, within these bounds


def _order(alias: str = "") -> str:
    """Summary rows in one order whatever order they were computed or cached in: by step, kind
    and critical-path position, then every other column (a "first" pick among ties is then the
    same in every report)."""
    return "ORDER BY " + ", ".join(alias + name for name in _names.STEP_SUMMARY_SCHEMA.names)


def checks(con, steps: Steps = None) -> pd.DataFrame:
    """Per step: step, count (finished spans), start_ns, end_ns, total_ns (summed durations), loaded
    (rows read to compute its summary: fewer than its spans where per-part summaries merged some)."""
    if not _parts.has_table(con, _CHECKS):
        _part_steps(con)
        con.execute(
            f"""CREATE TEMP TABLE {_CHECKS} AS
            SELECT step, CAST(sum(count) AS BIGINT) AS count, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   CAST(sum(total_ns) AS BIGINT) AS total_ns, CAST(sum(loaded) AS BIGINT) AS loaded
            FROM {_PART_STEPS} WHERE step IS NOT NULL GROUP BY step"""
        )
    where, params = step_filter(steps)
    return con.execute(f"SELECT * FROM {_CHECKS} WHERE {where} ORDER BY step", params).df()


def _part_steps(con) -> None:
    """Fill `_PART_STEPS`: each span part's per-step aggregates (`_parts`: computed once per part)."""
    _parts.table(con, "steps", _PART_STEPS_SCHEMA, """
        SELECT filename, step, CAST(sum(count) AS BIGINT) AS count, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
               CAST(sum(total_ns) AS BIGINT) AS total_ns, count(*) AS loaded
        FROM part_spans GROUP BY filename, step""", digests=1)


def first_starts(con) -> dict[str, int]:
    """The first span start (Unix ns) of each process that joined after the run began (its
    `rltrace.init` came after the run's first span): before that span it was starting up
    (spawning, importing, loading), which no step's waits count. A process there from the start
    and idle until its first span was waiting for work, and is not listed. From each part's
    minima (`_parts`: computed once per part) and the process records."""
    name = _parts.table(con, "firsts", _PART_FIRSTS_SCHEMA, """
        SELECT filename, process_id, min(start_ns) AS first_ns FROM part_spans
        WHERE process_id IS NOT NULL GROUP BY filename, process_id""", digests=1)
    return dict(con.execute(
        f"""WITH f AS (SELECT process_id, min(first_ns) AS first_ns FROM {name} GROUP BY process_id),
                p AS (SELECT process_id, min(started_ns) AS started_ns FROM processes GROUP BY process_id)
            SELECT f.process_id, f.first_ns FROM f JOIN p USING (process_id)
            WHERE p.started_ns > (SELECT min(first_ns) FROM f)""").fetchall())


def last_ends(con) -> dict[str, int]:
    """When each process that ended (cleanly, or with its crash recorded) did so, Unix ns, from the
    process records: after it the process waits for nothing, whatever later steps others run (a
    resumed run's restarted processes re-record the steps the first ones had reached)."""
    return dict(con.execute("""SELECT process_id, max(ended_ns) FROM processes
                               WHERE ended_ns IS NOT NULL AND process_id IS NOT NULL GROUP BY process_id""").fetchall())


_PART_FIRSTS_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("size", pa.int64()),
                                 ("process_id", pa.string()), ("first_ns", pa.int64())])
_PART_STEPS_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("size", pa.int64()), ("step", pa.int64()),
                                ("count", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                                ("total_ns", pa.int64()), ("loaded", pa.int64())])


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
    return _parts.meta(con, "spans_digest")


def rows(con, steps: Steps = None, kinds: tuple[str, ...] | None = None,
         columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Summary rows (columns of `rltrace._names.STEP_SUMMARY_SCHEMA`, or only `columns`: the wait
    rows of 100M spans are a million) for the selected steps."""
    _fill(con, steps)
    where, params = step_filter(steps)
    if kinds:
        where += " AND kind IN (" + ", ".join("?" for _ in kinds) + ")"
        params += list(kinds)
    unknown = set(columns or ()) - set(_names.STEP_SUMMARY_SCHEMA.names)
    if unknown:
        raise ValueError(f"no such summary column: {', '.join(sorted(unknown))}")
    select = ", ".join(columns) if columns else "*"
    query = f"SELECT {select} FROM {_CACHE} WHERE {where} {_order()}"
    return frame(con.sql(query, params=params).to_arrow_table())


def frame(table: pa.Table) -> pd.DataFrame:
    """A summary query's Arrow result (integer, float and text columns) as the frame DuckDB's
    `.df()` gives (an integer column holding a null is Int64, a text column without a value is
    object), several times faster: `.df()` makes a Python string of every text cell first."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        if column.null_count and pa.types.is_integer(column.type):
            columns[name] = column.to_pandas(types_mapper={column.type: pd.Int64Dtype()}.get)
        elif column.null_count == len(column) and pa.types.is_string(column.type):
            columns[name] = pd.Series(np.full(len(column), None, object), dtype=object)
        else:
            columns[name] = column.to_pandas()
    return pd.DataFrame(columns)


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
                {_order("c.")}"""
        ).to_arrow_table()
    finally:
        con.unregister("_rltrace_wins")
    return out.select(_names.STEP_SUMMARY_SCHEMA.names).cast(_names.STEP_SUMMARY_SCHEMA)


def _fill(con, steps: Steps) -> None:
    if _parts.has_table(con, _FILLED):  # every step is in the cache already (a connection is a snapshot)
        return
    if not _parts.has_table(con, _CACHE):
        con.execute(f"CREATE TEMP TABLE {_CACHE} AS SELECT * FROM step_summary LIMIT 0")

    def missing_of(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[~frame["step"].isin(_done(con))]

    wanted = checks(con, steps)
    missing = missing_of(wanted)
    if missing.empty:
        _filled(con, steps)
        return
    _reuse_stored(con, missing)
    stored = missing_of(missing)
    cached = _reuse_cached(con, stored) if not stored.empty else _Cached()
    todo = missing_of(stored)
    batches = list(_batches(todo))
    tell = _PROGRESS.get()
    done = 0
    for batch, computed in zip(batches, _computed(con, batches)):
        con.register("_rltrace_computed", computed)
        try:
            con.execute(f"INSERT INTO {_CACHE} BY NAME SELECT * FROM _rltrace_computed")
        finally:
            con.unregister("_rltrace_computed")
        done += len(batch)
        if tell is not None:
            tell(done, len(todo))
    # every step is in the connection's cache: it goes to the run's summary cache, unless the
    # cache files already held exactly these steps of exactly these parts
    if steps is None and not (cached.exact and len(cached.steps) == len(missing)):
        _save_cache(con, cached)
    _filled(con, steps)


def _filled(con, steps: Steps) -> None:
    """Mark a connection whose cache holds every step: later calls skip the check."""
    if steps is None:
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_FILLED} AS SELECT 1 AS filled").fetchall()


_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("rltrace_summary_progress", default=None)


@contextlib.contextmanager
def progress(callback: Callable[[int, int], None]):
    """Within this block, `callback(steps computed, steps to compute)` is called after each batch
    of summaries computed from spans: the first report on a big run spends most of its time there."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _done(con) -> set:
    return {r[0] for r in con.execute(f"SELECT DISTINCT step FROM {_CACHE}").fetchall()}


def _computed(con, batches: list[pd.DataFrame]):
    """Summary rows of each batch, two batches at a time on threads of their own (DuckDB and
    numpy's sorts run without the interpreter lock, so loading one batch overlaps computing another)."""
    firsts = first_starts(con) if batches else {}
    lasts = last_ends(con) if batches else {}
    if len(batches) < 2:
        for batch in batches:
            yield _compute.compute(_load_batch(con, batch), batch, firsts, lasts)
        return
    from concurrent.futures import ThreadPoolExecutor

    def work(batch):
        return _compute.compute(_load_batch(con.cursor(), batch), batch, firsts, lasts)

    with ThreadPoolExecutor(max_workers=2) as pool:
        yield from pool.map(work, batches)


@dataclass
class _Cached:
    """What the run's summary cache files gave this connection."""

    steps: set = field(default_factory=set)  # steps copied from them
    exact: bool = False  # the newest file was computed from exactly the span parts read now
    full_rows: int | None = None  # rows of the full file, when its parts still hold
    additions: list[Path] = field(default_factory=list)  # the addition files read


def _reuse_cached(con, missing: pd.DataFrame) -> _Cached:
    """Copy the cached rows of the `missing` steps that still hold into the connection's cache,
    from the newest cache file to the oldest (a step recomputed later is in a newer file).

    A cached step holds while its own spans are unchanged (its fingerprint) and no span part new
    since reaches into its time range. A part merged from parts the cache was computed from (a
    writer merges its parts all the while) holds no new span; a part merged from others may."""
    full, additions = _parts.cache_files(con)
    out = _Cached(additions=additions)
    if full is None:
        return out
    now = _parts.parts_now(con)
    merged = _parts.replaced(con)
    for i, path in enumerate([*additions, full, *_parts.stored_files(con)]):
        try:
            cached = views.read_whole(path)
            then = _parts.listed_parts(cached.schema)
            cached = cached.select(_names.STEP_SUMMARY_SCHEMA.names).cast(_names.STEP_SUMMARY_SCHEMA)
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as exc:
            logger.debug("rltrace: ignoring the summary cache %s: %s", path, exc)
            continue
        known = {n for n, _, _ in then}
        fresh = [n for n, _, _ in now - then if not (n in merged and set(merged[n]) <= known)]
        out.exact |= i == 0 and then == now
        if path == full:
            out.full_rows = len(cached)
        left = missing[~missing["step"].isin(_done(con))]
        candidates = left[~_touched(con, fresh, left)]  # and each step's fingerprint, below
        if candidates.empty:
            continue
        before = _done(con)
        con.register("_rltrace_cached_file", cached)
        try:
            _copy_matching(con, "_rltrace_cached_file", candidates, windows_too=False)
        finally:
            con.unregister("_rltrace_cached_file")
        out.steps |= _done(con) - before
    return out


def _touched(con, names: list[str], steps: pd.DataFrame) -> np.ndarray:
    """Per step of `steps`, whether a finished span of the parts `names` overlaps its window."""
    if not names:
        return np.zeros(len(steps), bool)
    checks(con)  # fills the per-part aggregates
    ranges = con.execute(
        f"SELECT min(start_ns), max(end_ns) FROM {_PART_STEPS} WHERE list_contains(?, part) GROUP BY part", [names]
    ).fetchall()
    lo, hi = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    hit = np.zeros(len(steps), bool)
    for a, b in ranges:
        if a is not None:
            hit |= (a <= hi) & (b >= lo)
    return hit


def _save_cache(con, cached: _Cached) -> None:
    """Leave the connection's summaries (every step) in the run's summary cache; never fails a report.

    When the full file still holds and the steps not taken from the cache are few (a live run's
    new steps), only those are written, as an addition: on a run of 10,000 steps that is a few
    kB instead of a million rows. Otherwise, or once there are `_parts.ADDITIONS` additions, every step
    is written to the full file and the additions are removed.
    """
    full, _ = _parts.cache_files(con)
    if full is None:
        return
    con.register("_rltrace_from_cache", pd.DataFrame({"step": sorted(cached.steps)}, dtype="Int64"))
    try:
        new = f"SELECT * FROM {_CACHE} WHERE step NOT IN (SELECT step FROM _rltrace_from_cache)"
        new_rows = con.execute(f"SELECT count(*) FROM ({new})").fetchall()[0][0]
        addition = (cached.full_rows is not None and len(cached.additions) < _parts.ADDITIONS
                    and 4 * new_rows < cached.full_rows)

        def build() -> pa.Table:
            table = con.sql(f"{new if addition else f'SELECT * FROM {_CACHE}'} {_order()}").to_arrow_table()
            table = table.select(_names.STEP_SUMMARY_SCHEMA.names).cast(_names.STEP_SUMMARY_SCHEMA)
            return _parts.with_parts(table, _parts.parts_now(con))

        if addition:
            _parts.write_cache(full.with_name(f"{full.stem}.new-{time.time_ns():020d}-{os.getpid()}.parquet"), build)
        elif _parts.write_cache(full, build):
            for path in cached.additions:  # folded into the full file
                with contextlib.suppress(OSError):
                    path.unlink()
    finally:
        con.unregister("_rltrace_from_cache")


def _reuse_stored(con, missing: pd.DataFrame) -> None:
    """Copy the stored rows of the `missing` steps that still match the spans into the cache."""
    if not con.execute("SELECT count(*) FROM step_summary WHERE kind = 'step'").fetchall()[0][0]:
        return
    digest = parts_digest(con)
    same_parts = digest is not None and digest == _parts.meta(con, "summary_of")
    candidates = missing
    if not same_parts:  # spans arrived (or parts changed) since compact: check each step's window too
        candidates = missing.merge(windows(con, missing), on="step")
    _copy_matching(con, "step_summary", candidates, windows_too=not same_parts)


def _copy_matching(con, source: str, candidates: pd.DataFrame, windows_too: bool) -> None:
    """Copy into the connection's cache every row of `source` (a table or view of summaries) for
    the steps whose step row matches the candidate's fingerprint (and window, if asked) and the
    current algorithm."""
    window_check = "AND k.window_count = m.window_count AND k.window_ns = m.window_ns" if windows_too else ""
    con.register("_rltrace_missing", candidates)
    try:
        con.execute(
            f"""INSERT INTO {_CACHE} BY NAME
            SELECT s.* FROM {source} s JOIN (
                SELECT k.step FROM {source} k JOIN _rltrace_missing m
                  ON k.step = m.step AND k.count = m.count AND k.start_ns = m.start_ns
                 AND k.end_ns = m.end_ns AND k.total_ns = m.total_ns {window_check}
                WHERE k.kind = 'step' AND k.version = ?) v USING (step)""",
            [_compute.VERSION],
        )
    finally:
        con.unregister("_rltrace_missing")


def _batches(missing: pd.DataFrame):
    """Consecutive steps cut into groups of rows to load: at least 4 groups (two threads stay busy)
    of BATCH_SPANS[0] to BATCH_SPANS[1] rows (bigger ones re-read fewer Parquet row groups)."""
    missing = missing.sort_values("step")
    low, high = BATCH_SPANS
    rows_ = missing["loaded"] if "loaded" in missing else missing["count"]
    size = min(high, max(low, int(rows_.sum()) // 4))
    start, total = 0, 0
    for i, n in enumerate(rows_.to_numpy()):
        if i > start and total + n > size:
            yield missing.iloc[start:i]
            start, total = i, 0
        total += n
    if start < len(missing):
        yield missing.iloc[start:]
