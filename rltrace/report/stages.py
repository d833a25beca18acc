"""Stage figures of a report: each stage per step and per run, its share of step time, the child
that holds most of it, and the bottleneck. Every view reads these; none computes them again.

Two per-step notions, named the same way in every view (docs/analysis.md, "Per step and per run"):

- **per step**: amortised over the steps a stage serves, as the cost model counts it. A rollout
  of 8 s that feeds 4 training steps is 2 s per step. `per_step_s` = the stage's total time over
  every step of the range, so per_step_s × steps = total_s; `median_s` is the median of the
  amortised per-step values (the cost model's t_R, t_T, t_W and the headline use medians).
- **per run**: per execution of the stage, i.e. per step that ran it (`per_run_s`: 8 s above).

A share is a fraction of the same kind of total: the stage's time summed over the steps over the
steps' wall time summed over the same steps. A stage's time in a step lies inside that step's
wall time, so a share is always within [0, 1].
"""

from __future__ import annotations

import pandas as pd

from rltrace._phases import ALWAYS_CONTAINER, COST_COLUMN, WAIT, phases_of
from rltrace._phases import stage as stage_of
from rltrace.analysis.costs import serving_period

CULPRIT_SHARE = 0.5  # a child holding at least this share of its stage's time is named with the stage
NOT_WORK = frozenset({WAIT, *ALWAYS_CONTAINER})  # children that are waiting or containers, never a culprit


def stage_rows(costs: pd.DataFrame, children: pd.DataFrame) -> list[dict]:
    """One row per stage with spans in the range (absent is not zero).

    `costs`: `analysis.cost_model` of the range; `children`: summary rows of kind `child`
    (step, phase = the stage's phase, other = the child's phase, seconds).

    Returns dicts: stage, column (its cost-model column), steps (in the range), runs (steps that
    ran it), serves_steps (how many steps one run serves), total_s, per_step_s, per_run_s,
    median_s, iqr_s ([q25, q75] of the amortised per-step values), share (of summed step wall
    time), children (phase, total_s, per_step_s, share of the stage's time; largest first) and
    culprit (the child holding at least CULPRIT_SHARE of the stage's time, or None).
    """
    steps, wall = len(costs), float(costs["wall_s"].sum()) if len(costs) else 0.0
    out = []
    for stage, column in COST_COLUMN.items():
        if column not in costs or not costs[column].notna().any():
            continue
        raw = costs[column].dropna()
        total = float(raw.sum())
        runs = int((raw > 0).sum()) or len(raw)
        amortised = costs[column + "_amortised"].dropna()
        row = {
            "stage": stage,
            "column": column,
            "steps": steps,
            "runs": runs,
            "serves_steps": serving_period(costs[column].notna().to_numpy()),
            "total_s": total,
            "per_step_s": total / steps,
            "per_run_s": total / runs,
            "median_s": float(amortised.median()) if len(amortised) else None,
            "iqr_s": [float(amortised.quantile(0.25)), float(amortised.quantile(0.75))] if len(amortised) else None,
            "share": total / wall if wall > 0 else None,
        }
        row["children"] = _children(stage, total, steps, children)
        top = row["children"][0] if row["children"] else None
        row["culprit"] = top if top and top["share"] >= CULPRIT_SHARE else None
        out.append(row)
    return out


def _children(stage: str, stage_total: float, steps: int, children: pd.DataFrame) -> list[dict]:
    """The phases directly inside the stage's spans that belong to no other stage (reward
    functions, tool calls, engine requests), by their time over the range."""
    if children.empty or stage_total <= 0:
        return []
    mine = children[children["phase"].isin(phases_of(stage))]
    mine = mine[[stage_of(c) in (None, stage) and c not in phases_of(stage) and c not in NOT_WORK
                 for c in mine["other"]]]
    if mine.empty:
        return []
    totals = mine.groupby("other")["seconds"].sum().sort_values(ascending=False)
    return [{"phase": phase, "total_s": float(total), "per_step_s": float(total) / steps,
             "share": min(1.0, float(total) / stage_total)} for phase, total in totals.items()]


def bottleneck(rows: list[dict], breakdown: pd.DataFrame) -> dict | None:
    """The stage with the longest median time per step, where it ran (from `phase_breakdown`
    rows: process, role, rank, largest phase) and the runner-up: when their interquartile
    ranges overlap the two are within noise."""
    ranked = sorted((r for r in rows if r["median_s"]), key=lambda r: r["median_s"], reverse=True)
    if not ranked:
        return None
    top, runner_up = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    mine = breakdown[breakdown["phase"].isin(phases_of(top["stage"]))]
    by_process = mine.groupby("process_id")["seconds"].sum().sort_values(ascending=False)
    by_phase = mine.groupby("phase")["seconds"].sum().sort_values(ascending=False)
    process_id = by_process.index[0] if len(by_process) else None
    who = mine[mine["process_id"] == process_id].iloc[0] if process_id else None
    return {
        "stage": top["stage"],
        "median_s": top["median_s"],
        "per_step_s": top["per_step_s"],
        "per_run_s": top["per_run_s"],
        "runs": top["runs"],
        "serves_steps": top["serves_steps"],
        "share": top["share"],
        "culprit": top["culprit"],
        "iqr_s": top["iqr_s"],
        "runner_up": runner_up["stage"] if runner_up else None,
        "runner_up_median_s": runner_up["median_s"] if runner_up else None,
        "runner_up_iqr_s": runner_up["iqr_s"] if runner_up else None,
        "within_noise": bool(runner_up and runner_up["iqr_s"][1] >= top["iqr_s"][0]),
        "phase": by_phase.index[0] if len(by_phase) else top["stage"],
        "process_id": process_id,
        "role": None if who is None else who["role"],
        "rank": None if who is None else who["rank"],
    }
