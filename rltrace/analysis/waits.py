"""Which stage waits on which: idle time per process and `wait` spans per thread, attributed to the
phases running elsewhere at that moment (other processes, or other threads of the same process)."""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd

from rltrace._phases import STAGE_OF
from rltrace.analysis import _who, summary
from rltrace.analysis._format import process_name, seconds_text, share_text
from rltrace.analysis._steps import Steps

UNTRACED = "untraced"  # waited while no busy span ran anywhere


def waits(con, steps: Steps = None) -> pd.DataFrame:
    """Waiting time per step, process and what was awaited.

    Returns:
        step, process_id, role, rank; kind (`idle`: inside the step's window with no busy or
        wait span on the process; `wait_span`: inside a `wait` span, also one nested in a busy
        span, minus the time its own children run; `declared`: such a `wait` span whose
        `rl.waiting_for` names the phase); in_phase (`idle`, or the phase enclosing the wait
        span); waited_for (a busy phase running meanwhile on another process or another thread
        of this one, the declared phase, or `untraced` when nothing recorded ran);
        waited_for_group (rollout, reward, train, weight_sync or the phase itself);
        waited_for_process (the other process where that phase ran longest in the step, or this
        process when it ran only here, on another thread); seconds (time that phase ran during
        the waits; phases running at once each get their full overlap); intervals (waits
        contributing).
    """
    out = _who.label(_unlabelled(con, steps), con)
    cols = ["step", "process_id", "role", "rank", "kind", "in_phase", "waited_for", "waited_for_group",
            "waited_for_process", "seconds", "intervals"]
    return out[cols]


def by_step(con, steps: Steps = None) -> pd.DataFrame:
    """Seconds waited per step, process and awaited stage (every wait of the step: the chart of who
    waits for what). Returns: step, process_id, role, rank, waited_for_group, seconds; by step,
    process and stage. Grouped before labelling (role and rank follow from the process)."""
    w = _unlabelled(con, steps)
    keys = ["step", "process_id", "waited_for_group"]
    g = w.groupby(keys, dropna=False, sort=True)["seconds"].sum().reset_index()
    who = _who.processes(con, g["process_id"].dropna().unique())[["process_id", "role", "rank"]]
    g = g.merge(who, on="process_id", how="left")
    return g[["step", "process_id", "role", "rank", "waited_for_group", "seconds"]]


#: the last `_unlabelled` frame of each connection (`waits`, `top_waits` and `by_step` all read it:
#: a million wait rows at 100M spans)
_LAST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _unlabelled(con, steps: Steps) -> pd.DataFrame:
    """`waits` without role and rank (a label per wait row costs a join over every row), in its
    order; read once per connection and step range (callers never change it)."""
    last = _LAST.get(con)
    if last is not None and last[0] == steps:
        return last[1]
    out = _read_unlabelled(con, steps)
    _LAST[con] = (steps, out)
    return out


def _read_unlabelled(con, steps: Steps) -> pd.DataFrame:
    rows = summary.rows(con, steps, kinds=("wait",), columns=(
        "step", "process_id", "detail", "phase", "other", "other_process_id", "seconds", "count"))
    out = pd.DataFrame(
        {
            "step": rows["step"],
            "process_id": rows["process_id"],
            "kind": rows["detail"],
            "in_phase": rows["phase"],
            "waited_for": rows["other"].fillna(UNTRACED),
            "waited_for_process": rows["other_process_id"],
            "seconds": rows["seconds"],
            "intervals": rows["count"],
        }
    )
    out["waited_for_group"] = out["waited_for"].map(STAGE_OF).fillna(out["waited_for"])  # a phase outside the stages: itself
    out = out[~_between_siblings(con, steps, out)]
    return out.sort_values(["step", "seconds"], ascending=[True, False], ignore_index=True)


def _between_siblings(con, steps: Steps, w: pd.DataFrame) -> np.ndarray:
    """Per wait row, whether it is one sibling 'waiting' on another: the awaited phase ran on a
    process of the same role, and the waiting process ran that phase in the step too. Workers
    doing the same work at unequal speed are an imbalance (`imbalance`), not a wait on each other."""
    other = w["waited_for_process"]
    maybe = other.notna().to_numpy() & (other != w["process_id"]).to_numpy()
    if not maybe.any():
        return np.zeros(len(w), bool)
    who = _who.processes(con, pd.concat([w["process_id"], other[maybe]]).dropna().unique())
    role = dict(zip(who["process_id"], who["role"]))
    same_role = maybe & (w["process_id"].map(role) == other.map(role)).to_numpy(bool)
    if not same_role.any():
        return same_role
    ran = summary.rows(con, steps, kinds=("phase",), columns=("step", "process_id", "phase"))
    did = set(zip(ran["step"].tolist(), ran["process_id"].tolist(), ran["phase"].tolist()))
    return same_role & np.fromiter(((st, p, ph) in did for st, p, ph in zip(
        w["step"].tolist(), w["process_id"].tolist(), w["waited_for"].tolist())), bool, len(w))


IMBALANCE = 1.5  # sibling processes doing one phase: the slowest's median over the fastest's worth a sentence
IMBALANCE_MIN_S = 0.01  # ... when the slowest takes at least this long per step


def imbalance(con, steps: Steps = None) -> pd.DataFrame:
    """Processes of one role running the same phase at unequal speed: per phase and role with at
    least two processes, the slowest and the fastest by median seconds per step of that phase.

    Returns: phase, role, slow_process_id, slow_name, slow_s, fast_process_id, fast_name, fast_s,
    ratio (slow_s / fast_s), steps (where both ran it); ratios of IMBALANCE or more, largest first."""
    cols = ["phase", "role", "slow_process_id", "slow_name", "slow_s", "fast_process_id", "fast_name", "fast_s",
            "ratio", "steps"]
    ran = summary.rows(con, steps, kinds=("phase",), columns=("step", "process_id", "phase", "seconds"))
    if ran.empty:
        return pd.DataFrame(columns=cols)
    who = _who.processes(con, ran["process_id"].dropna().unique())
    ran = ran.merge(who[["process_id", "role", "rank"]], on="process_id")
    rows = []
    for (phase, role), mine in ran.groupby(["phase", "role"], sort=True):
        if mine["process_id"].nunique() < 2:
            continue
        shared = mine.groupby("step")["process_id"].transform("nunique") > 1  # steps where siblings both ran it
        med = mine[shared].groupby(["process_id", "rank"], dropna=False)["seconds"].median().reset_index()
        if len(med) < 2:
            continue
        med = med.sort_values(["seconds", "process_id"], ascending=[False, True])
        slow, fast = med.iloc[0], med.iloc[-1]
        if fast["seconds"] <= 0 or slow["seconds"] < IMBALANCE_MIN_S or slow["seconds"] / fast["seconds"] < IMBALANCE:
            continue
        rows.append({"phase": phase, "role": role, "slow_process_id": slow["process_id"],
                     "slow_name": process_name(role, slow["rank"]), "slow_s": float(slow["seconds"]),
                     "fast_process_id": fast["process_id"], "fast_name": process_name(role, fast["rank"]),
                     "fast_s": float(fast["seconds"]), "ratio": float(slow["seconds"] / fast["seconds"]),
                     "steps": int(mine.loc[shared, "step"].nunique())})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values("ratio", ascending=False, ignore_index=True)


def _most_waited_on(w: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys`, the awaited process that holds the largest share of its waits (not
    whichever row came first): `keys` + waited_for_process."""
    per = w.groupby([*keys, "waited_for_process"], dropna=False)["seconds"].sum().reset_index()
    per = per.sort_values([*keys, "seconds", "waited_for_process"], ascending=[True] * len(keys) + [False, True],
                          kind="stable", na_position="last")
    return per.drop_duplicates(keys)[[*keys, "waited_for_process"]]


#: another awaited process is named beside the largest when it holds at least this share of the largest's time
CLOSE_SHARE = 0.5


def totals(con, steps: Steps = None) -> pd.DataFrame:
    """Every wait of the steps, summed per waiting process and awaited stage, with the processes
    waited on by their share (what the report's sentences say: a whole wait, never the top few).

    Returns: process_id, role, rank, waited_for (stage group or phase, or `untraced`), seconds,
    on (list of dicts, largest first: process_id, name (e.g. rollout1), seconds, share of this
    wait; the waiting process itself when the awaited work ran on another of its threads);
    largest waits first."""
    w = _unlabelled(con, steps)
    cols = ["process_id", "role", "rank", "waited_for", "seconds", "on"]
    if w.empty:
        return pd.DataFrame(columns=cols)
    keys = ["process_id", "waited_for_group"]
    per = w.groupby([*keys, "waited_for_process"], dropna=False)["seconds"].sum().reset_index()
    who = _who.processes(con, pd.concat([per["process_id"], per["waited_for_process"]]).dropna().unique())
    name = {p: process_name(r, k) for p, r, k in zip(who["process_id"], who["role"], who["rank"])}
    rows = []
    for (pid, group), mine in per.groupby(keys, dropna=False, sort=False):
        total = float(mine["seconds"].sum())
        mine = mine[mine["waited_for_process"].notna()].sort_values(["seconds", "waited_for_process"],
                                                                     ascending=[False, True])
        on = [{"process_id": p, "name": name.get(p), "seconds": float(s), "share": float(s) / total if total > 0 else None}
              for p, s in zip(mine["waited_for_process"], mine["seconds"])]
        rows.append({"process_id": pid, "waited_for": group, "seconds": total, "on": on})
    out = pd.DataFrame(rows)
    out = out.merge(who.rename(columns={"host": "_host"})[["process_id", "role", "rank"]], on="process_id", how="left")
    return out.sort_values(["seconds", "process_id"], ascending=[False, True], ignore_index=True)[cols]


def on_text(on: list[dict], waiting_process: str | None) -> str:
    """Where a wait's awaited work ran: " on rollout1", " on rollout1 (52%) and rollout0 (48%)" when
    another process holds at least CLOSE_SHARE of the largest's time, " on another thread"."""
    if not on:
        return ""
    top = on[0]
    close = [o for o in on[1:3] if top["seconds"] > 0 and o["seconds"] >= CLOSE_SHARE * top["seconds"]]

    def one(o: dict) -> str:
        return "another thread" if o["process_id"] == waiting_process else (o.get("name") or "?")

    if not close:
        return f" on {one(top)}"
    named = [f"{one(o)} ({share_text(o['share'])})" for o in (top, *close)]
    return " on " + (", ".join(named[:-1]) + " and " + named[-1])


def top_waits(con, steps: Steps = None, n: int = 3) -> pd.DataFrame:
    """The `n` longest waits of each step, rolled up to stages, with a sentence each.

    Returns:
        step, process_id, role, rank, in_phase, waited_for (group), waited_for_process,
        waited_for_name (e.g. rollout0), seconds, share (seconds / the step's wall time), text
        (e.g. "trainer0 idle 3.50 s (39% of step 4) waiting for rollout on rollout0", or "... on
        another thread" when the awaited work ran in the waiting process itself).
    """
    w = _unlabelled(con, steps)
    if w.empty:
        return pd.DataFrame(columns=["step", "process_id", "role", "rank", "in_phase", "waited_for",
                                     "waited_for_process", "waited_for_name", "seconds", "share", "text"])
    # role and rank follow from process_id: grouped without them, labelled once the top n are kept
    keys = ["step", "process_id", "in_phase", "waited_for_group"]
    g = w.groupby(keys, dropna=False)["seconds"].sum().reset_index()
    g = g.merge(_most_waited_on(w, keys), on=keys, how="left").rename(columns={"waited_for_group": "waited_for"})
    walls = summary.checks(con, steps).set_index("step")
    g["share"] = g["seconds"] / g["step"].map((walls["end_ns"] - walls["start_ns"]) / 1e9)
    g = g.sort_values(["step", "seconds"], ascending=[True, False]).groupby("step").head(n)
    who = _who.processes(con, w["process_id"].dropna().unique())[["process_id", "role", "rank"]]
    g = g.merge(who, on="process_id", how="left").set_axis(g.index)
    names = _who.processes(con, g["waited_for_process"].dropna().unique())
    short = {p: process_name(r, k) for p, r, k in zip(names["process_id"], names["role"], names["rank"])}
    g["waited_for_name"] = g["waited_for_process"].map(short)
    texts = []
    fields = ["step", "process_id", "role", "rank", "in_phase", "waited_for", "waited_for_process", "waited_for_name",
              "seconds", "share"]
    for step, pid, role, rank, in_phase, what, other_pid, other, seconds, share in zip(*(g[f].tolist() for f in fields)):
        where = "idle" if in_phase == "idle" else f"in a wait inside {in_phase}"
        text = f"{process_name(role, rank)} {where} {seconds_text(seconds)} ({share_text(share)} of step {step})"
        if what == UNTRACED:
            texts.append(text + " while no recorded phase ran anywhere")
        elif other_pid == pid:
            texts.append(text + f" waiting for {what} on another thread")
        else:
            texts.append(text + f" waiting for {what}" + (f" on {other}" if isinstance(other, str) else ""))
    g["text"] = texts
    cols = ["step", "process_id", "role", "rank", "in_phase", "waited_for", "waited_for_process", "waited_for_name",
            "seconds", "share", "text"]
    return g[cols].reset_index(drop=True)
