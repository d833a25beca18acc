"""Health of a run: crashes, spans that started and never ended (hangs, kills), and what was dropped."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa

from rltrace.analysis import _parts, summary
from rltrace.analysis._format import process_name, seconds_text

STALE_AFTER_S = 30.0  # a process silent this long has stopped: three missed heartbeats (written every 10 s)
#: When a live process's open span counts as hung (`rltrace watch`'s hang rule, and the report's
#: findings): open for HANG_FACTOR x the median of its phase's finished spans (with at least
#: HANG_MIN_SAMPLES of them), and never before HANG_MIN_S; sooner if the process's own watchdog
#: dumped its stacks for it (RLTRACE_HANG_TIMEOUT).
HANG_FACTOR = 10.0
HANG_MIN_S = 300.0
HANG_MIN_SAMPLES = 5


def gone(con, process_ids) -> set[str]:
    """The processes of `process_ids` known to have stopped although their heartbeat may be recent:
    a writer holds `.writers/<process_id>.lock` while it lives, and the OS frees it when the process
    ends, `kill -9` included. Only processes of this host count, and only a lock this probe could
    take (a filesystem that cannot lock tells nothing); this process is never probed (on NFS its
    own probe could free its lock). The others are judged by their heartbeat (`STALE_AFTER_S`)."""
    from rltrace.analysis._parts import meta
    from rltrace.store.merge import lock_state

    wanted = sorted({p for p in process_ids if isinstance(p, str)})
    run_dir = meta(con, "run_dir")
    if not run_dir or not wanted:
        return set()
    here = con.execute("SELECT process_id, any_value(pid) FROM processes WHERE host = ? "
                       "AND list_contains(?, process_id) GROUP BY process_id", [socket.gethostname(), wanted]).fetchall()
    return {p for p, pid in here if pid != os.getpid() and lock_state(Path(run_dir), p) == "free"}


#: Container phases: the work inside them is what hangs (`rltrace watch` and the report judge it)
CONTAINERS = ("step",)


def phase_medians(con, phases, min_samples: int = HANG_MIN_SAMPLES) -> dict[str, float]:
    """Median duration (seconds) of the finished spans of each of `phases` that has `min_samples`."""
    phases = sorted({p for p in phases if isinstance(p, str)})
    if not phases:
        return {}
    return dict(con.execute(
        """SELECT coalesce(phase, name), median(duration_s) FROM spans
           WHERE NOT is_open AND list_contains(?, coalesce(phase, name)) GROUP BY ALL HAVING count(*) >= ?""",
        [phases, min_samples]).fetchall())


def hang_dumps(con, span_ids) -> dict[str, float | None]:
    """span_id -> seconds it had been open when its process's hang watchdog dumped its stacks."""
    from rltrace.analysis.profiles import has_profiles

    ids = sorted({s for s in span_ids if isinstance(s, str)})
    if not ids or not has_profiles(con):
        return {}
    return dict(con.execute("SELECT span_id, max(elapsed_s) FROM profiles WHERE trigger = 'hang' "
                            "AND list_contains(?, span_id) GROUP BY span_id", [ids]).fetchall())


def mark_in_progress(con, spans: list[dict]) -> None:
    """Set `in_progress` on each open span (`open_spans` rows as dicts, with `profiles`): its process
    is alive, and it is not what `rltrace watch` calls hung: the innermost open work of its thread
    (no open child; not a `step` container; not a `wait`, the starved rule's) open longer than its
    `hang_limit`. The report names only the others."""
    running = [o for o in spans if o["state"] == "running"]
    outer = {p for (p,) in con.execute("SELECT DISTINCT parent_span_id FROM open_spans "
                                       "WHERE parent_span_id IS NOT NULL").fetchall()} if running else set()
    judged = [o for o in running if o["span_id"] not in outer and o["phase"] not in (*CONTAINERS, "wait")]
    dumped = hang_dumps(con, [o["span_id"] for o in judged])
    # every limit is at least HANG_MIN_S: only a span open longer needs its phase's median
    medians = phase_medians(con, [o["phase"] for o in judged if o["age_s"] > HANG_MIN_S])
    hung = set()
    for o in judged:
        limit, _ = hang_limit(medians.get(o["phase"]), dumped=o["span_id"] in dumped, dumped_s=dumped.get(o["span_id"]))
        if o["age_s"] > limit:
            hung.add(o["span_id"])
    for o in spans:
        o["in_progress"] = o["state"] == "running" and o["span_id"] not in hung


def in_progress_now(span: dict, now_ns: int) -> bool:
    """`in_progress` of a span from a report made earlier (a cached one), still true at `now_ns`:
    its process has written a heartbeat within STALE_AFTER_S (a killed process writes nothing
    more, so nothing would make the report again)."""
    heard = span.get("last_heard_ns")
    return bool(span.get("in_progress")) and heard is not None and (now_ns - heard) / 1e9 <= STALE_AFTER_S


def hang_limit(median: float | None, *, dumped: bool = False, dumped_s: float | None = None,
               limit_s: float | None = None, factor: float = HANG_FACTOR,
               min_s: float = HANG_MIN_S) -> tuple[float, str]:
    """How long a span of a phase whose finished spans have this `median` may stay open before it
    counts as hung, and why (`limit_s`: one limit for every phase instead; `dumped`: the process's
    watchdog dumped its stacks `dumped_s` into the span)."""
    if limit_s is not None:
        limit, why = limit_s, "the hang limit"
    elif median is not None:
        limit, why = max(factor * median, min_s), f"{factor:g}x its median {seconds_text(median)}, at least {seconds_text(min_s)}"
    else:
        limit, why = min_s, "no median yet"
    if dumped:  # the process's own watchdog already judged it hung
        limit, why = min(limit, dumped_s or limit), "RLTRACE_HANG_TIMEOUT"
    return limit, why


def open_spans(con, now_ns: int | None = None) -> pd.DataFrame:
    """Spans that started and have not ended (running, hung, or their process was killed), and
    spans still open when their process exited (rltrace ended them then, with status ERROR).

    Returns:
        process_id, role, rank, host, thread_name, phase, name, step, span_id, start_ns; age_s (now - start);
        stalled_s (the run's last activity - start: how long it had been open when the run
        last wrote anything, which is what matters for a dead run; activity = the last end of a
        stepped span, a heartbeat or an open span's start; for a span ended at exit, how long
        it was open); last_heard_ns (the process's last heartbeat, Unix ns, or None);
        ended_cleanly (the process called shutdown); heard_for_s (how long the process kept its
        heartbeat after the span started); last_end_ns (the process's last finished span's end, read
        for killed processes only); open_s (how long the span was open, the one figure every view
        prints, see `open_text`: until its process exited or crashed; for a killed process until its
        last sign of life, the later of its last heartbeat and its last span end, so at least that;
        for a running one until now); killed_by (`lock`: its writer lock was freed on this host;
        `silence`: no heartbeat for over STALE_AFTER_S; None unless killed); state: `crashed` (the process died of an uncaught
        exception, a crash record, with the span open: the crash ended it), `exited` (the process
        exited with the span open, no crash), `killed` (the process stopped without shutting
        down and without a crash record: no heartbeat for over STALE_AFTER_S, or on this host
        its writer lock freed (`gone`); e.g. SIGKILL or out of memory) or `running` (its
        heartbeat is fresh: hung, or still running).
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    checks = summary.checks(con)  # per-step first start / last end, cached per connection
    last_step_ns = int(checks["end_ns"].max()) if len(checks) else None
    frame = con.execute(
        """WITH last AS (SELECT greatest(?, (SELECT max(heartbeat_ns) FROM processes),
                                         (SELECT max(start_ns) FROM spans WHERE is_open)) AS ns),
           proc AS (SELECT process_id, max(heartbeat_ns) AS heard, bool_or(ended_ns IS NOT NULL) AS ended
                    FROM processes GROUP BY process_id),
           crashed AS (SELECT DISTINCT process_id FROM crashes WHERE kind = 'process')
           SELECT s.process_id, s.role, s.rank, s.host, s.thread_name, coalesce(s.phase, s.name) AS phase, s.name, s.step,
                  s.span_id, s.start_ns, s.end_ns, (SELECT ns FROM last) AS last_ns, p.heard AS last_heard_ns,
                  coalesce(p.ended, false) AS ended_cleanly, c.process_id IS NOT NULL AS crashed
           FROM open_spans s LEFT JOIN proc p USING (process_id) LEFT JOIN crashed c USING (process_id)
           ORDER BY s.start_ns""",
        [last_step_ns],
    ).df()
    frame["age_s"] = (now_ns - frame["start_ns"]) / 1e9
    closed = frame["end_ns"].notna()  # ended by rltrace when its process exited (`ended_at_exit`)
    frame["stalled_s"] = ((frame["end_ns"].where(closed, frame["last_ns"]) - frame["start_ns"]) / 1e9).clip(lower=0)
    heard = frame["last_heard_ns"].astype("float64")
    frame["heard_for_s"] = ((heard - frame["start_ns"]) / 1e9).clip(lower=0)
    lock_freed = frame["process_id"].isin(gone(con, frame["process_id"]))
    stopped = ((now_ns - heard) / 1e9 > STALE_AFTER_S) | lock_freed
    frame["state"] = ["crashed" if shut and crash else "exited" if shut or ended else "killed" if stop else "running"
                      for shut, crash, ended, stop in zip(closed, frame["crashed"].astype(bool),
                                                          frame["ended_cleanly"].astype(bool), stopped.fillna(True))]
    killed = frame["state"] == "killed"
    frame["killed_by"] = [("lock" if lock else "silence") if k else None for k, lock in zip(killed, lock_freed)]
    frame["last_end_ns"] = frame["process_id"].map(_last_ends(con, frame.loc[killed, "process_id"])).astype("Int64")
    last_sign = pd.concat([heard, frame["last_end_ns"].astype("float64")], axis=1).max(axis=1)
    until = frame["end_ns"].where(closed, last_sign.where(killed, float(now_ns)))
    frame["open_s"] = ((until.astype("float64") - frame["start_ns"]) / 1e9).clip(lower=0).fillna(0.0)
    cols = ["process_id", "role", "rank", "host", "thread_name", "phase", "name", "step", "span_id", "start_ns", "age_s",
            "stalled_s", "last_heard_ns", "ended_cleanly", "heard_for_s", "last_end_ns", "open_s", "killed_by", "state"]
    return frame[cols]


def _last_ends(con, process_ids) -> dict[str, int]:
    """process_id -> end of its last finished span (only killed processes are asked about: a scan)."""
    ids = sorted({p for p in process_ids if isinstance(p, str)})
    if not ids:
        return {}
    return dict(con.execute("SELECT process_id, max(end_ns) FROM spans WHERE NOT is_open "
                            "AND list_contains(?, process_id) GROUP BY 1", [ids]).fetchall())


def _relative(ns, start_ns: int) -> str:
    """`1.55 s before it started`, `3.00 s after it started`."""
    delta = (ns - start_ns) / 1e9
    return f"{seconds_text(abs(delta))} {'before' if delta < 0 else 'after'} it started"


def open_text(o: dict) -> str:
    """How long an open span was open, in the words every view uses (report, `rltrace info`, pages):
    "open 12.0 s until its process exited", "open at least 941 ms (killed; ...)", "open 4.00 s so far"."""
    state, open_s = o.get("state"), seconds_text(o.get("open_s"))
    if state in ("crashed", "exited"):
        return f"open {open_s} until its process {state}"
    if state == "killed":
        if not o.get("open_s"):
            return "open for an unknown time, its process gave no sign of life after it started"
        return f"open at least {open_s}, until its process's last sign of life"
    return f"open {open_s} so far"


def killed_timeline(o: dict) -> str:
    """A killed process's last evidence, each once: its last heartbeat, its last span end and how
    the kill was seen ("its last heartbeat came 1.55 s before it started, its last span ended ...")."""
    start = o["start_ns"]
    parts = []
    if o.get("last_heard_ns") is not None:
        parts.append(f"its last heartbeat came {_relative(o['last_heard_ns'], start)}")
    if o.get("last_end_ns") is not None:
        parts.append(f"its last span ended {_relative(o['last_end_ns'], start)}")
    seen = ("its writer lock was freed (the process is gone)" if o.get("killed_by") == "lock" else
            f"then no heartbeat for over {seconds_text(STALE_AFTER_S)}")
    return ", ".join(parts) + (", " if parts else "") + seen


def unstepped(con) -> dict:
    """Phase spans that no step holds: an instrumentation mistake, since every per-step figure
    leaves them out (a phase run from a thread of its own, a process that never got a step).
    Spans that ended before their process's first stepped span are its start-up (a warm-up, the
    first weight sync) and are not counted.

    Returns: {spans: how many, phases: [(phase, spans), ...] most first}.
    """
    rows = con.execute(
        """WITH first AS (SELECT process_id, min(start_ns) AS first_ns FROM spans
                          WHERE step IS NOT NULL GROUP BY process_id)
           SELECT s.phase, count(*) AS n FROM spans s LEFT JOIN first f USING (process_id)
           WHERE NOT s.is_open AND s.step IS NULL AND s.phase IS NOT NULL
             AND (f.first_ns IS NULL OR s.end_ns > f.first_ns)
           GROUP BY s.phase ORDER BY n DESC, s.phase"""
    ).fetchall()
    return {"spans": int(sum(n for _, n in rows)), "phases": [(phase, int(n)) for phase, n in rows]}


def process_states(con, procs: pd.DataFrame, now_ns: int | None = None) -> pd.DataFrame:
    """`processes(con)` with `state`, what `rltrace info`, the report and the Overview all say:
    `crashed` (a crash record of the process), `ended` (it shut down), `killed` (no heartbeat for over
    STALE_AFTER_S, or on this host its writer lock freed) or `running`."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    crashed = {p for (p,) in con.execute("SELECT DISTINCT process_id FROM crashes WHERE kind = 'process'").fetchall()}
    lock_freed = gone(con, procs["process_id"])
    states = []
    for pid, heard, ended in zip(procs["process_id"], procs["heartbeat_ns"], procs["ended_ns"]):
        stopped = pd.isna(heard) or (now_ns - heard) / 1e9 > STALE_AFTER_S or pid in lock_freed
        states.append("crashed" if pid in crashed else "ended" if pd.notna(ended) else "killed" if stopped else "running")
    return procs.assign(state=states)


def state_now(state: str, heartbeat_ns, now_ns: int) -> str:
    """A process's `state` from a record read earlier (a cached one), as of `now_ns`: a running
    process silent for over STALE_AFTER_S since has stopped (a killed process writes nothing more)."""
    if state == "running" and (heartbeat_ns is None or pd.isna(heartbeat_ns) or (now_ns - heartbeat_ns) / 1e9 > STALE_AFTER_S):
        return "killed"
    return state


STARTUP_MIN_S = 1.0  # a process's start-up worth a sentence


def startups(con) -> list[dict]:
    """Processes that joined the run late and began well into its first step: spawning, imports,
    loading a model. That time is their start-up, which no wait counts (`summary.first_starts`).

    Returns: [{process_id, name (e.g. rollout1), seconds (its first span's start after the first
    step's), step (the first step)}], longest first; only STARTUP_MIN_S or more."""
    from rltrace.analysis import _who

    firsts = summary.first_starts(con)
    checks = summary.checks(con)
    if not firsts or checks.empty:
        return []
    first_step = checks.iloc[0]
    t0 = int(first_step["start_ns"])
    late = {p: (ns - t0) / 1e9 for p, ns in firsts.items()
            if (ns - t0) / 1e9 >= STARTUP_MIN_S and ns <= int(first_step["end_ns"])}
    if not late:
        return []
    who = _who.processes(con, list(late))
    names = {p: process_name(r, k) for p, r, k in zip(who["process_id"], who["role"], who["rank"])}
    names = _told_apart(con, names)
    return sorted(({"process_id": p, "name": names.get(p, p), "seconds": s, "step": int(first_step["step"])}
                   for p, s in late.items()), key=lambda r: (-r["seconds"], r["name"]))


def _told_apart(con, names: dict[str, str]) -> dict[str, str]:
    """Names that two processes share (a role without ranks, or a run started twice) get the
    process's host:pid, so a sentence never reads "bench and bench"."""
    shared = [p for p, n in names.items() if list(names.values()).count(n) > 1]
    if not shared:
        return names
    marks = ", ".join("?" for _ in shared)
    where = dict(con.execute(f"SELECT process_id, any_value(host) || ':' || any_value(pid) FROM processes "
                             f"WHERE process_id IN ({marks}) GROUP BY process_id", shared).fetchall())
    return {p: f"{n} ({where[p]})" if p in where and where[p] else n for p, n in names.items()}


_PART_STEP_RANGES_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("size", pa.int64()),
                                      ("process_id", pa.string()), ("first_step", pa.int64()),
                                      ("last_step", pa.int64()), ("last_ns", pa.int64())])


def restarts(con) -> list[dict]:
    """Steps recorded again by a later process of the same role and rank, started after the first
    one had stopped: a resumed run redoing the steps after its checkpoint, or a script run again
    into the same directory. Those steps' figures hold both attempts, and the report says so.

    Returns: [{name, before (host:pid), after (host:pid), first_step, last_step (the steps both
    recorded)}], in time order; from each part's step range (`_parts`: computed once per part)."""
    name = _parts.table(con, "step_ranges", _PART_STEP_RANGES_SCHEMA, """
        SELECT filename, process_id, min(step) AS first_step, max(step) AS last_step, max(end_ns) AS last_ns
        FROM part_spans WHERE process_id IS NOT NULL AND step IS NOT NULL GROUP BY filename, process_id""", digests=1)
    rows = con.execute(f"""
        WITH r AS (SELECT process_id, min(first_step) AS lo, max(last_step) AS hi, max(last_ns) AS last_ns
                   FROM {name} GROUP BY process_id),
             p AS (SELECT process_id, any_value(role) AS role, any_value(rank) AS rank, any_value(host) AS host,
                          any_value(pid) AS pid, min(started_ns) AS started_ns, max(ended_ns) AS ended_ns
                   FROM processes GROUP BY process_id),
             l AS (SELECT r.*, p.role, p.rank, p.host, p.pid, p.started_ns,
                          coalesce(p.ended_ns, r.last_ns) AS stopped_ns FROM r JOIN p USING (process_id))
        SELECT a.role, a.rank, a.host, a.pid, b.host, b.pid, greatest(a.lo, b.lo), least(a.hi, b.hi)
        FROM l a JOIN l b ON a.role IS NOT DISTINCT FROM b.role AND a.rank IS NOT DISTINCT FROM b.rank
                         AND a.process_id <> b.process_id AND a.stopped_ns <= b.started_ns
                         AND b.lo <= a.hi AND a.lo <= b.hi
        QUALIFY row_number() OVER (PARTITION BY b.process_id ORDER BY a.stopped_ns DESC, a.process_id) = 1
        ORDER BY b.started_ns, a.started_ns""").fetchall()
    return [{"name": process_name(role, rank), "before": f"{h1}:{p1}", "after": f"{h2}:{p2}",
             "first_step": int(lo), "last_step": int(hi)} for role, rank, h1, p1, h2, p2, lo, hi in rows]


def crashes(con) -> pd.DataFrame:
    """Uncaught exceptions, in time order (docs/integrations.md).

    Returns: process_id, role, rank, host, pid, time_ns, kind (`process`: it exited; `thread`:
    that thread died), thread_name, exc_type, message, phase (innermost phase the exception
    escaped through, or None), step, phases (JSON list, innermost first), traceback.
    """
    return con.execute(
        """SELECT process_id, role, rank, host, pid, time_ns, kind, thread_name, exc_type, message, phase, step,
                  phases, traceback
           FROM crashes ORDER BY time_ns"""
    ).df()


def processes(con) -> pd.DataFrame:
    """One row per process of the run: who it is, when it was heard from, what it wrote and lost.

    Returns: process_id, role, rank, host, pid, started_ns, heartbeat_ns (latest), ended_ns
    (None unless it shut down), spans_written, spans_dropped, otlp_spans_dropped, rows_written,
    rows_dropped, attributes_dropped (counts from its latest heartbeat; drops 0 when unknown),
    drop_reasons (JSON list of {table, column, reason, count}, latest heartbeat's), spans (finished
    spans in the store), open_spans; ordered by role, rank, start.
    """
    return con.execute(
        f"""SELECT p.*, coalesce(s.spans, 0) AS spans, coalesce(s.open, 0) AS open_spans
           FROM ({_PER_PROCESS}) p
           LEFT JOIN (SELECT process_id, count(*) FILTER (NOT is_open) AS spans, count(*) FILTER (is_open) AS open
                      FROM spans GROUP BY process_id) s USING (process_id)
           ORDER BY {_ORDER}"""
    ).df()


#: one row per process from its records (its latest heartbeat's counts), and the order processes are listed in
_PER_PROCESS = """SELECT process_id, any_value(role) AS role, any_value(rank) AS rank, any_value(host) AS host,
                        any_value(pid) AS pid, min(started_ns) AS started_ns, max(heartbeat_ns) AS heartbeat_ns,
                        max(ended_ns) AS ended_ns, max(spans_written) AS spans_written,
                        max(coalesce(spans_dropped, 0)) AS spans_dropped,
                        max(coalesce(otlp_spans_dropped, 0)) AS otlp_spans_dropped,
                        max(rows_written) AS rows_written, max(coalesce(rows_dropped, 0)) AS rows_dropped,
                        max(coalesce(attributes_dropped, 0)) AS attributes_dropped,
                        arg_max(drop_reasons, heartbeat_ns) AS drop_reasons
                 FROM processes GROUP BY process_id"""
_ORDER = "p.role, p.rank, p.started_ns, p.process_id"


def drops(con) -> pd.DataFrame:
    """What each process lost before the store (or the OTLP backend) got it.

    Returns: process_id, role, rank, spans_dropped, rows_dropped, otlp_spans_dropped,
    attributes_dropped (span attributes cut by the attribute limit), drop_reasons (JSON list of
    {table, column, reason, count}) — from the process's latest heartbeat.
    """
    # from the process records alone: counting each process's spans would read every span
    return con.execute(
        f"""SELECT process_id, role, rank, spans_dropped, rows_dropped, otlp_spans_dropped, attributes_dropped,
                   drop_reasons FROM ({_PER_PROCESS}) p ORDER BY {_ORDER}"""
    ).df()
