"""The no-progress rules, evaluated on a snapshot of a live run (`rltrace.store.open`).

Each rule returns `Alert`s; an alert's `key` names what it is about (the stalled step, the
silent process, the span), so the watcher raises it once however often the rules run.

- no_progress: no step has finished for `stall_factor` x the median time between step ends.
- heartbeat: a process that did not end cleanly has not written to the store for `heartbeat_s`,
  or (on this host) the writer lock it held is free: it stopped (`analysis.health.gone`).
- starved: a `wait` (or a span with `rl.waiting_for`) has lasted `starved_s` while nothing it
  waits for runs or has ended since it began (the empty-buffer case).
- hang: a phase is still open past its limit (`hang_s`, or `hang_factor` x its median, at least
  `hang_min_s`), or the process's own hang watchdog dumped its stacks (RLTRACE_HANG_TIMEOUT).
- threshold: a step metric crossed a limit the user gave (`reward_mean<0.2`).
Time rules are quiet once every process has ended cleanly: a finished run is not stuck.
"""

from __future__ import annotations

import operator
import re
import time
from dataclasses import dataclass, field, replace

import pandas as pd

from rltrace._config import RltraceError
from rltrace.analysis._format import number_text, seconds_text
from rltrace.analysis._format import process_name as _who
from rltrace.analysis import health
from rltrace.analysis.health import processes as _run_processes
from rltrace.analysis.metrics import step_metrics

RULES = ("no_progress", "heartbeat", "starved", "hang", "threshold")
NOT_WORK = health.CONTAINERS  # containers: a hang is named on the phase inside them


class AlertRuleError(RltraceError, ValueError):
    """A rule setting that cannot be read, e.g. `--threshold reward_mean`."""


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str  # "<" or ">"
    value: float

    @classmethod
    def parse(cls, text: str) -> Threshold:
        """`reward_mean<0.2` or `mismatch_k3>0.05`."""
        m = re.fullmatch(r"\s*([A-Za-z0-9_./-]+)\s*([<>])\s*([-+0-9.eE]+)\s*", text or "")
        try:
            value = float(m.group(3)) if m else None
        except ValueError:
            value = None
        if m is None or value is None:
            raise AlertRuleError(f"threshold {text!r} is not METRIC<VALUE or METRIC>VALUE (e.g. reward_mean<0.2)")
        return cls(m.group(1), m.group(2), value)

    def crossed(self, value: float) -> bool:
        return (operator.lt if self.op == "<" else operator.gt)(value, self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass(frozen=True)
class Settings:
    stall_factor: float = 5.0  # no_progress: times the median time between step ends ...
    stall_min_s: float = 60.0  # ... and never under this
    heartbeat_s: float = 60.0  # processes write a heartbeat at least every 10 s
    starved_s: float = 60.0
    hang_s: float | None = None  # one limit for every phase; None: hang_factor x the phase's median
    hang_factor: float = health.HANG_FACTOR
    hang_min_s: float = health.HANG_MIN_S
    hang_min_samples: int = health.HANG_MIN_SAMPLES  # finished runs of a phase before its median is trusted
    thresholds: tuple[Threshold, ...] = ()
    rules: tuple[str, ...] = RULES

    def __post_init__(self):
        for name in ("stall_factor", "stall_min_s", "heartbeat_s", "starved_s", "hang_factor", "hang_min_s"):
            if not getattr(self, name) > 0:
                raise AlertRuleError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.hang_s is not None and not self.hang_s > 0:
            raise AlertRuleError(f"hang limit must be > 0 seconds, got {self.hang_s!r}")
        unknown = set(self.rules) - set(RULES)
        if unknown:
            raise AlertRuleError(f"unknown rule(s) {sorted(unknown)}; rules are {', '.join(RULES)}")


@dataclass
class Alert:
    key: str
    rule: str
    message: str
    process_id: str | None = None
    role: str | None = None
    rank: int | None = None
    host: str | None = None
    phase: str | None = None
    step: int | None = None
    span_id: str | None = None
    seconds: float | None = None
    limit_s: float | None = None
    metric: str | None = None
    value: float | None = None
    threshold: float | None = None
    profile_id: str | None = None
    profile_path: str | None = None
    extra: dict = field(default_factory=dict)


def _int(value):
    return None if value is None or pd.isna(value) else int(value)


def _span_fields(row) -> dict:
    return {"process_id": row["process_id"], "role": row["role"], "rank": _int(row["rank"]), "host": row["host"],
            "phase": row["phase"], "step": _int(row["step"]), "span_id": row["span_id"]}


def _at_step(step) -> str:
    return "" if step is None else f" at step {step}"


# --- what the rules read -------------------------------------------------------------------------
def _processes(con) -> pd.DataFrame:
    """The run's processes (one query for every reader: `analysis.processes`), with `ended`."""
    procs = _run_processes(con)
    return procs.assign(ended=procs["ended_ns"].notna())


def _open(con) -> pd.DataFrame:
    """Open spans that have no open child (the innermost thing each thread is doing)."""
    return con.execute(
        """WITH o AS (SELECT * FROM spans WHERE is_open)
           SELECT o.process_id, o.role, o.rank, o.host, coalesce(o.phase, o.name) AS phase, o.step, o.span_id,
                  o.start_ns, attr(o.attributes, 'rl.waiting_for') AS waiting_for
           FROM o WHERE NOT EXISTS (SELECT 1 FROM o c WHERE c.parent_span_id = o.span_id)
           ORDER BY o.start_ns"""
    ).df()


def _profiles(con, span_ids) -> dict[str, tuple[str, str]]:
    ids = sorted({s for s in span_ids if isinstance(s, str)})
    if not ids:
        return {}
    marks = ", ".join("?" for _ in ids)
    rows = con.execute(
        f"""SELECT span_id, profile_id, path, trigger FROM profiles WHERE span_id IN ({marks})
            ORDER BY (trigger = 'hang') DESC, started_ns DESC""",
        ids,
    ).fetchall()
    out: dict[str, tuple[str, str]] = {}
    for span_id, profile_id, path, _ in rows:
        out.setdefault(span_id, (profile_id, path))
    return out


# --- the rules -----------------------------------------------------------------------------------
def no_progress(con, s: Settings, now_ns: int, open_spans: pd.DataFrame) -> list[Alert]:
    ends = con.execute(
        """SELECT step, max(end_ns) AS end_ns FROM spans WHERE step IS NOT NULL GROUP BY step
           HAVING NOT bool_or(is_open) ORDER BY end_ns"""
    ).df()
    if len(ends) < 3:
        return []
    gaps = ends["end_ns"].diff().dropna() / 1e9
    median = float(gaps.median())
    last = ends.iloc[-1]
    silent = (now_ns - int(last["end_ns"])) / 1e9
    limit = max(s.stall_factor * median, s.stall_min_s)
    if silent <= limit:
        return []
    step = int(last["step"])
    running = open_spans[~open_spans["phase"].isin(NOT_WORK)]
    where = ""
    fields: dict = {"step": step}
    if len(running):
        row = running.iloc[0]  # the longest-running innermost phase
        fields = _span_fields(row)
        where = f"; {row['phase']} on {_who(row['role'], row['rank'])}{_at_step(fields['step'])} has run " \
                f"{seconds_text((now_ns - row['start_ns']) / 1e9)}"
    message = (f"No step has finished for {seconds_text(silent)} since step {step} (limit {seconds_text(limit)}: "
               f"{s.stall_factor:g}x the median {seconds_text(median)} between steps){where}.")
    return [Alert(f"no_progress:{step}", "no_progress", message, seconds=silent, limit_s=limit, **fields)]


def heartbeat(con, s: Settings, now_ns: int, open_spans: pd.DataFrame) -> list[Alert]:
    out = []
    procs = _processes(con)
    gone = health.gone(con, procs.loc[~procs["ended"], "process_id"])  # on this host, a free writer lock: stopped now
    for p in procs.itertuples():
        silent = (now_ns - p.heartbeat_ns) / 1e9 if not pd.isna(p.heartbeat_ns) else None
        if p.ended or silent is None or (silent <= s.heartbeat_s and p.process_id not in gone):
            continue
        mine = open_spans[open_spans["process_id"] == p.process_id]
        fields = {"process_id": p.process_id, "role": p.role, "rank": _int(p.rank), "host": p.host}
        doing = ""
        if len(mine):
            row = mine.iloc[0]
            fields.update(phase=row["phase"], step=_int(row["step"]), span_id=row["span_id"])
            doing = f" while in {row['phase']}{_at_step(fields['step'])}"
        if silent <= s.heartbeat_s:  # its lock says what its heartbeat cannot yet
            message = (f"{_who(p.role, p.rank)} on {p.host} stopped{doing}: the writer lock it held is free and it "
                       f"did not shut down (killed?); last write {seconds_text(silent)} ago.")
        else:
            message = (f"{_who(p.role, p.rank)} on {p.host} has not written to the store for {seconds_text(silent)}"
                       f"{doing} (limit {seconds_text(s.heartbeat_s)}): stopped, killed or frozen.")
        out.append(Alert(f"heartbeat:{p.process_id}:{int(p.heartbeat_ns)}", "heartbeat", message, seconds=silent,
                         limit_s=s.heartbeat_s, **fields))
    return out


def starved(con, s: Settings, now_ns: int, open_spans: pd.DataFrame) -> list[Alert]:
    waits = open_spans[(open_spans["phase"] == "wait") | open_spans["waiting_for"].notna()]
    out = []
    for _, w in waits.iterrows():
        waited = (now_ns - w["start_ns"]) / 1e9
        if waited <= s.starved_s:
            continue
        target = w["waiting_for"] if isinstance(w["waiting_for"], str) and w["waiting_for"] else None
        if target is not None:  # something of that phase running, or ended since the wait began
            busy = con.execute(
                """SELECT count(*) FROM spans WHERE coalesce(phase, name) = ? AND span_id <> ?
                   AND (is_open OR end_ns >= ?)""", [target, w["span_id"], int(w["start_ns"])]).fetchall()[0][0]
        else:  # any work on another process
            busy = con.execute(
                """SELECT count(*) FROM spans WHERE process_id <> ? AND coalesce(phase, name) NOT IN ('wait', 'step')
                   AND (is_open OR end_ns >= ?)""", [w["process_id"], int(w["start_ns"])]).fetchall()[0][0]
        if busy:
            continue
        what = target or "another process"
        fields = _span_fields(w)
        message = (f"{_who(w['role'], w['rank'])} has waited {seconds_text(waited)} for {what}"
                   f"{_at_step(fields['step'])} while no {what} ran (limit {seconds_text(s.starved_s)}): "
                   "nothing upstream is producing.")
        out.append(Alert(f"starved:{w['span_id']}", "starved", message, seconds=waited, limit_s=s.starved_s, **fields))
    return out


def hang(con, s: Settings, now_ns: int, open_spans: pd.DataFrame) -> list[Alert]:
    work = open_spans[~open_spans["phase"].isin([*NOT_WORK, "wait"])]  # a long wait is the starved rule's
    medians = health.phase_medians(con, work["phase"], s.hang_min_samples)
    dumped = health.hang_dumps(con, work["span_id"])
    out = []
    for _, o in work.iterrows():
        age = (now_ns - o["start_ns"]) / 1e9
        limit, why = health.hang_limit(medians.get(o["phase"]), dumped=o["span_id"] in dumped,
                                       dumped_s=dumped.get(o["span_id"]), limit_s=s.hang_s,
                                       factor=s.hang_factor, min_s=s.hang_min_s)
        if age <= limit:
            continue
        fields = _span_fields(o)
        message = (f"{o['phase']} on {_who(o['role'], o['rank'])}{_at_step(fields['step'])} has been open for "
                   f"{seconds_text(age)} (limit {seconds_text(limit)}: {why}): hung?")
        out.append(Alert(f"hang:{o['span_id']}", "hang", message, seconds=age, limit_s=limit, **fields))
    return _with_edges(con, now_ns, out)


def _with_edges(con, now_ns: int, alerts: list[Alert]) -> list[Alert]:
    """Hang alerts with the blocking edge of their thread (`rltrace.stacks`) added, where the
    process's stacks in the run still show it."""
    if not alerts:
        return alerts
    from rltrace.stacks import edges

    found = edges(con, now_ns)
    by_span = {e.span_id: e for e in found}
    other_side = {p: e for e in reversed(found) for p in e.waits_on}  # the rank that never entered, say
    out = []
    for a in alerts:
        e = by_span.get(a.span_id) or other_side.get(a.process_id)
        out.append(a if e is None else replace(a, message=f"{a.message} {e.text}",
                                               extra={**a.extra, "edge": e.as_dict()}))
    return out


def threshold(con, s: Settings, now_ns: int, open_spans: pd.DataFrame) -> list[Alert]:
    out = []
    for t in s.thresholds:
        values = step_metrics(con, [t.metric])
        if values.empty or not t.crossed(float(values["value"].iloc[-1])):
            continue
        crossed = [t.crossed(float(v)) for v in values["value"]]
        first = len(crossed) - 1
        while first > 0 and crossed[first - 1]:
            first -= 1  # the start of this episode: one alert per crossing, not per step
        since, step, value = int(values["step"].iloc[first]), int(values["step"].iloc[-1]), float(values["value"].iloc[-1])
        message = (f"{t.metric} = {number_text(value)} at step {step} crossed {t} "
                   f"(since step {since}, {len(crossed) - first} step(s)).")
        out.append(Alert(f"threshold:{t}:{since}", "threshold", message, step=step, metric=t.metric, value=value,
                         threshold=t.value))
    return out


_RULES = {"no_progress": no_progress, "heartbeat": heartbeat, "starved": starved, "hang": hang, "threshold": threshold}


def evaluate(con, settings: Settings = Settings(), now_ns: int | None = None) -> list[Alert]:
    """Every alert that holds on this snapshot of the run, with profiles attached where a span has one."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    procs = _processes(con)
    finished = len(procs) > 0 and bool(procs["ended"].all())
    open_spans = _open(con)
    alerts: list[Alert] = []
    for name in settings.rules:
        if finished and name != "threshold":
            continue
        alerts.extend(_RULES[name](con, settings, now_ns, open_spans))
    profiles = _profiles(con, [a.span_id for a in alerts])
    return [replace(a, profile_id=profiles[a.span_id][0], profile_path=profiles[a.span_id][1])
            if a.span_id in profiles else a for a in alerts]
