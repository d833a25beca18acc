"""Who waits on whom, and on what: the blocking edges of a stuck run, from the processes' latest
stacks (`stacks` table), their open spans and whether each process is alive.

A dump counts while the innermost span it recorded on a thread is still open (the thread has
not moved on). Each thread in such a dump is classified (`known.classify`) and each blocked one
becomes an edge, one sentence that names the other side where the run tells it:

- a collective that another rank never entered ("trainer1 never entered it: it is in
  wait_for_batch (train, step 4)"), or whose rank has stopped (killed: its writer lock is free);
- a socket or HTTP read from host:port with no span of another process ended since it began;
- a queue get with no producer alive; a Ray get; a subprocess wait; the rest as they are.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import pandas as pd

from rltrace.analysis import health
from rltrace.analysis._format import process_name, seconds_text
from rltrace.stacks.known import Blocked, classify

#: the order edges are listed in: the ones that name another side first
_ORDER = {"collective": 0, "dead_rank": 0, "http": 1, "socket": 1, "queue": 2, "ray": 2, "subprocess": 3}


@dataclass
class Thread:
    """One thread of a process now: its innermost open span and, if a dump holds it, its stack."""

    process_id: str
    who: str
    thread_id: int | None
    thread_name: str | None
    span_id: str | None
    phase: str | None
    step: int | None
    start_ns: int | None
    frames: list = field(default_factory=list)
    peer: str | None = None
    dumped_ns: int | None = None
    blocked: Blocked | None = None
    collectives: list = field(default_factory=list)  # Flight Recorder entries of the thread, oldest first

    def last_collective(self, group: str | None = None) -> dict | None:
        """Its newest Flight Recorder entry (on `group`, if given)."""
        return next((c for c in reversed(self.collectives) if group is None or c.get("group") == group), None)

    def doing(self) -> str:
        """`phase, step N` of its open span."""
        step = "" if self.step is None else f", step {self.step}"
        return f"{self.phase}{step}" if self.phase else "no open phase"

    def in_words(self) -> str:
        """What the thread is in: its known call (and the program's function that made it), or its function."""
        b = self.blocked
        if b is None:
            return f"{self.phase}" + ("" if self.step is None else f" (step {self.step})")
        if b.kind and b.where and b.where != b.call:
            return f"{b.call} in {b.where} ({self.doing()})"
        return f"{b.call or 'an unknown place'} ({self.doing()})"


@dataclass
class Edge:
    kind: str  # collective / dead_rank / http / socket / queue / ray / subprocess / wait / sleep / other
    process_id: str
    who: str
    span_id: str | None
    phase: str | None
    step: int | None
    seconds: float | None  # how long its innermost open span has been open
    text: str  # the edge in one sentence
    waits_on: list[str] = field(default_factory=list)  # the process ids on the other side, where known
    call: str | None = None
    peer: str | None = None
    proof: list[str] = field(default_factory=list)  # the stack lines that show it, innermost first
    stack: list[str] = field(default_factory=list)  # the thread's whole stack as stored, innermost first

    def as_dict(self) -> dict:
        return asdict(self)


def _int(value):
    return None if value is None or pd.isna(value) else int(value)


def latest(con) -> pd.DataFrame:
    """The threads of each process's latest dump (columns of the `stacks` table)."""
    return con.execute(
        """SELECT * FROM stacks QUALIFY time_ns = max(time_ns) OVER (PARTITION BY process_id)
           ORDER BY role, rank, process_id, thread_name"""
    ).df()


def liveness(con, now_ns: int) -> dict[str, tuple[str, str] | None]:
    """process_id -> None while it lives, else (what happened, how we know): ("has stopped",
    ": its writer lock is free (killed?); last heard 3.1 s ago")."""
    procs = con.execute("SELECT process_id, max(heartbeat_ns) AS heartbeat_ns, max(ended_ns) AS ended_ns "
                        "FROM processes GROUP BY process_id").df()  # not `health.processes`: it counts every span
    gone = health.gone(con, procs["process_id"])
    out: dict[str, tuple[str, str] | None] = {}
    crashed = {p for (p,) in con.execute("SELECT DISTINCT process_id FROM crashes WHERE kind = 'process'").fetchall()}
    for p in procs.itertuples():
        silent = (now_ns - p.heartbeat_ns) / 1e9 if not pd.isna(p.heartbeat_ns) else None
        if p.process_id in crashed:
            out[p.process_id] = ("has crashed", "")
        elif not pd.isna(p.ended_ns):
            out[p.process_id] = ("has exited", "")
        elif p.process_id in gone:
            out[p.process_id] = ("has stopped", f": its writer lock is free (killed?); last heard "
                                                f"{seconds_text(silent)} ago")
        elif silent is None or silent > health.STALE_AFTER_S:
            out[p.process_id] = ("has gone silent", f": nothing written for {seconds_text(silent)} (stopped or frozen)")
        else:
            out[p.process_id] = None
    return out


def threads(con, now_ns: int) -> tuple[list[Thread], dict, dict[str, str]]:
    """Every thread with open work (innermost open span), its stack where a dump still holds it;
    the processes' liveness; process_id -> role."""
    opened = con.execute(
        """WITH o AS (SELECT * FROM spans WHERE is_open)
           SELECT o.process_id, o.role, o.rank, o.thread_id, o.thread_name, coalesce(o.phase, o.name) AS phase,
                  o.step, o.span_id, o.start_ns
           FROM o WHERE NOT EXISTS (SELECT 1 FROM o c WHERE c.parent_span_id = o.span_id)
           ORDER BY o.start_ns"""
    ).df()
    alive = liveness(con, now_ns)
    roles = dict(con.execute("SELECT process_id, any_value(role) FROM processes GROUP BY ALL").fetchall())
    open_ids = set(opened["span_id"])
    dumps = latest(con)
    out: list[Thread] = []
    held = set()
    for d in dumps.itertuples():
        spans = json.loads(d.spans or "[]")
        if not spans or spans[0]["span_id"] not in open_ids:
            continue  # a thread with no open work, or one that has moved on since
        s = spans[0]
        frames = json.loads(d.frames or "[]")
        out.append(Thread(d.process_id, process_name(d.role, _int(d.rank)), _int(d.thread_id), d.thread_name,
                          s["span_id"], s.get("phase"), s.get("step"), s.get("start_ns"), frames,
                          d.peer if isinstance(d.peer, str) else None, int(d.time_ns), classify(frames),
                          json.loads(d.collectives) if isinstance(getattr(d, "collectives", None), str) else []))
        held.add(s["span_id"])
    for o in opened.itertuples():
        if o.span_id not in held:
            out.append(Thread(o.process_id, process_name(o.role, _int(o.rank)), _int(o.thread_id), o.thread_name,
                              o.span_id, o.phase, _int(o.step), _int(o.start_ns)))
    return out, alive, roles


def _lines(frames: list) -> list[str]:
    return [f"{f[0]}:{f[1]} in {f[2]}" + (f": {f[3]}" if f[3] else "") for f in frames]


def _proof(t: Thread, n: int = 3) -> list[str]:
    """The stack lines that show where the thread is: the recognised call's frame and the ones just outside it."""
    if not t.frames:
        return []
    line = t.blocked.line if t.blocked else ""
    at = next((i for i, f in enumerate(t.frames) if f"{f[0]}:{f[1]}" == line), 0)
    return _lines(t.frames[at:at + n])


def edges(con, now_ns: int | None = None, *, min_s: float = 0.0) -> list[Edge]:
    """The blocking edges of the run now: one per thread whose stack (still current) shows where
    it is blocked, open at least `min_s`; the ones naming another process first."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    if not con.execute("SELECT count(*) FROM (SELECT 1 FROM stacks LIMIT 1)").fetchall()[0][0]:
        return []  # no process has dumped its stacks: nothing to read (most runs)
    found, alive, roles = threads(con, now_ns)
    by_process: dict[str, list[Thread]] = {}
    for t in found:
        by_process.setdefault(t.process_id, []).append(t)
    out = []
    for t in found:
        if t.blocked is None or t.start_ns is None:
            continue
        age = (now_ns - t.start_ns) / 1e9
        if age < min_s or alive.get(t.process_id) is not None:
            continue
        out.append(_edge(t, age, found, by_process, alive, roles, now_ns, con))
    named = {p for e in out if e.kind in ("collective", "dead_rank") for p in e.waits_on}
    out = [e for e in out if e.process_id not in named or e.kind in _ORDER]  # already said as the other side
    out.sort(key=lambda e: (_ORDER.get(e.kind, 9), -(e.seconds or 0)))
    return out


def _edge(t: Thread, age: float, found, by_process, alive, roles, now_ns, con) -> Edge:
    b = t.blocked
    base = dict(process_id=t.process_id, who=t.who, span_id=t.span_id, phase=t.phase, step=t.step, seconds=age,
                call=b.call, peer=t.peer, proof=_proof(t), stack=_lines(t.frames))
    if b.kind == "collective":
        return _collective(t, age, by_process, alive, roles, base)
    if b.kind in ("http", "socket"):
        where = f" reading from {t.peer}" if t.peer else f" in {b.call}"
        text = f"{t.who}'s {t.phase} has been blocked {seconds_text(age)}{where} ({b.where or b.call}"
        text += "" if t.step is None else f", step {t.step}"
        text += ")"
        quiet = con.execute("SELECT count(*) FROM spans WHERE process_id <> ? AND NOT is_open AND end_ns >= ?",
                            [t.process_id, int(t.start_ns)]).fetchall()[0][0]
        if not quiet:
            text += f"; no span of another process has ended since it began {seconds_text(age)} ago"
        text += f" ({b.call}): the other side accepted and never answered." if t.peer and not quiet else "."
        return Edge(kind=b.kind, text=text, **base)
    if b.kind == "queue":
        text = f"{t.who} has been waiting {seconds_text(age)} in {b.call} in {b.where} ({t.doing()})"
        others = [p for p in alive if p != t.process_id]
        mine = [x for x in by_process.get(t.process_id, []) if x is not t]
        if others and all(alive[p] is not None for p in others) and not mine:
            names = ", ".join(_name_of(p, found, roles) for p in others)
            text += f"; no producer is alive: {names} stopped"
        elif not others and not mine:
            text += "; no producer is alive: no other thread of it has open work and no other process is in the run"
        return Edge(kind="queue", text=text + ".", waits_on=others, **base)
    if b.kind == "ray":
        text = (f"{t.who} has been waiting {seconds_text(age)} in {b.call} in {b.where} ({t.doing()}): a Ray task or "
                "actor call it awaits has not returned.")
        return Edge(kind="ray", text=text, **base)
    if b.kind == "subprocess":
        text = f"{t.who} has been waiting {seconds_text(age)} for a child process in {b.call} in {b.where} ({t.doing()})."
        return Edge(kind="subprocess", text=text, **base)
    kind = b.kind or "other"
    return Edge(kind=kind, text=f"{t.who} has been in {t.in_words()} for {seconds_text(age)}.", **base)


def _name_of(process_id: str, found: list[Thread], roles: dict) -> str:
    for t in found:
        if t.process_id == process_id:
            return t.who
    return roles.get(process_id) or process_id


def _collective(t: Thread, age: float, by_process, alive, roles, base) -> Edge:
    """A rank in a collective: which ranks are not in it (never entered, or stopped)."""
    call = t.blocked.call
    role = roles.get(t.process_id)
    peers = [p for p in alive if p != t.process_id and (roles.get(p) == role or any(
        x.blocked is not None and x.blocked.kind == "collective" for x in by_process.get(p, [])))]
    parts, waits_on, kind = [], [], "collective"
    for p in peers:
        mine = by_process.get(p, [])
        name = mine[0].who if mine else p
        if alive.get(p) is not None:
            verb, how = alive[p]
            doing = next((f" while in {x.doing()}" for x in mine), "")
            parts.append(f"{name} {verb}{doing}{how}")
            waits_on.append(p)
            kind = "dead_rank"
            continue
        inside = [x for x in mine if x.blocked is not None and x.blocked.kind == "collective"]
        if any(x.blocked.call == call for x in inside):
            continue
        if inside:
            parts.append(f"{name} is in {inside[0].in_words()} instead")
        elif any(x.blocked is not None for x in mine):
            x = next(x for x in mine if x.blocked is not None)
            parts.append(f"{name} never entered it: it is in {x.in_words()}")
        elif mine:
            parts.append(f"{name} never entered it: it is in {mine[0].doing()} (its stacks are not in the run yet)")
        else:
            continue
        waits_on.append(p)
    mine_fr = t.last_collective()
    head = f"{t.who} has been in {call} ({t.doing()}) for {seconds_text(age)}"
    if mine_fr is not None:  # torch's Flight Recorder numbers the collectives of each process group
        head += f" (collective #{mine_fr.get('seq')} on process group {mine_fr.get('group')})"
        for p in peers:
            theirs = next((x.last_collective(mine_fr.get("group")) for x in by_process.get(p, [])
                           if x.last_collective(mine_fr.get("group"))), None)
            if theirs is not None and theirs.get("seq") != mine_fr.get("seq"):
                name = by_process[p][0].who
                for j, part in enumerate(parts):
                    if part.startswith(name + " "):
                        parts[j] = f"{part}; its last collective there is #{theirs.get('seq')}"
    if not parts:
        text = head + (": every other rank is in it too." if peers else ".")
    else:
        text = head + "; " + "; ".join(parts) + "."
    return Edge(kind=kind, text=text, waits_on=waits_on, **base)
