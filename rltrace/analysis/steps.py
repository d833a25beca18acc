"""Where a step's time goes: wall time per step, time per phase per process, share of the step."""

from __future__ import annotations

import pandas as pd

from rltrace.analysis import _who, summary
from rltrace._phases import term as stage
from rltrace.analysis._steps import Steps


def step_breakdown(con, steps: Steps = None) -> pd.DataFrame:
    """Wall time of each step.

    Returns:
        step; start_ns, end_ns (first start and last end of the step's finished spans, Unix ns);
        wall_s (seconds between them); spans (finished spans with that step).
    Open spans are not counted (see `health.open_spans`); spans without a step are left out.
    """
    c = summary.checks(con, steps)
    return pd.DataFrame(
        {
            "step": c["step"],
            "start_ns": c["start_ns"],
            "end_ns": c["end_ns"],
            "wall_s": (c["end_ns"] - c["start_ns"]) / 1e9,
            "spans": c["count"],
        }
    )


#: The summary columns `phase_breakdown` and `phase_totals` read.
PHASE_COLUMNS = ("step", "kind", "process_id", "phase", "seconds", "count", "total_ns")


def phase_rows(con, steps: Steps = None, *, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The summary rows `phase_breakdown` and `phase_totals` read, for a caller that wants both
    (every column, or only `columns`: `PHASE_COLUMNS` is what they need, read faster)."""
    return summary.rows(con, steps, kinds=("phase", "step"), columns=columns)


def phase_breakdown(con, steps: Steps = None, *, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Time per phase per process per step.

    Returns:
        step, process_id, role, rank, phase, stage (R/T/W or None); seconds (length of the union
        of that phase's spans on that process in the step, so concurrent spans count once);
        spans (count); span_s (summed span durations); share (seconds / the step's wall_s).
    Nested phases each count their own time, so shares of nested phases add up past 1.
    `rows`: `phase_rows()` of the same steps, when the caller has them.
    """
    rows = phase_rows(con, steps) if rows is None else rows
    walls = rows[rows["kind"] == "step"].set_index("step")["seconds"]
    phases = rows[(rows["kind"] == "phase") & rows["process_id"].notna()]
    out = pd.DataFrame(
        {
            "step": phases["step"],
            "process_id": phases["process_id"],
            "phase": phases["phase"],
            "stage": phases["phase"].map({p: stage(p) for p in phases["phase"].unique()}),  # once per phase
            "seconds": phases["seconds"],
            "spans": phases["count"],
            "span_s": phases["total_ns"] / 1e9,
        }
    )
    out["share"] = out["seconds"] / out["step"].map(walls)
    out = _who.label(out, con)
    cols = ["step", "process_id", "role", "rank", "phase", "stage", "seconds", "spans", "span_s", "share"]
    return out[cols].sort_values(["step", "seconds"], ascending=[True, False], ignore_index=True)


def phase_totals(con, steps: Steps = None, *, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each phase over the selected steps.

    Returns:
        phase, stage; steps (steps where it ran: its runs); spans; total_s (sum over steps of the
        phase's union time across all processes); per_step_s (total_s / every step of the range:
        per step, amortised); per_run_s (total_s / steps where it ran: per run of the phase);
        mean_s (= per_run_s, the older name); share (total_s / summed step wall time, in [0, 1]);
        span_s (summed span durations, counts concurrent spans separately).
    `rows`: `phase_rows()` of the same steps, when the caller has them.
    """
    rows = phase_rows(con, steps) if rows is None else rows
    walls = rows.loc[rows["kind"] == "step", "seconds"]
    wall, in_range = walls.sum(), len(walls)
    phases = rows[(rows["kind"] == "phase") & rows["process_id"].isna()]
    out = phases.groupby("phase").agg(
        steps=("step", "nunique"), spans=("count", "sum"), total_s=("seconds", "sum"), span_ns=("total_ns", "sum")
    )
    out = out.reset_index()
    out["stage"] = out["phase"].map(stage)
    out["per_step_s"] = out["total_s"] / in_range if in_range else float("nan")
    out["per_run_s"] = out["total_s"] / out["steps"]
    out["mean_s"] = out["per_run_s"]
    out["share"] = out["total_s"] / wall if wall > 0 else float("nan")
    out["span_s"] = out["span_ns"] / 1e9
    cols = ["phase", "stage", "steps", "spans", "total_s", "per_step_s", "per_run_s", "mean_s", "share", "span_s"]
    return out[cols].sort_values("total_s", ascending=False, ignore_index=True)


def stage_children(con, steps: Steps = None) -> pd.DataFrame:
    """The phases directly inside each stage phase's spans (reward functions, tool calls, engine
    requests), per step.

    Returns:
        step, phase (the stage's phase, e.g. reward), other (the child's phase), seconds (union
        of the child's spans across processes in that step), count (child spans).
    """
    return summary.rows(con, steps, kinds=("child",), columns=("step", "phase", "other", "seconds", "count"))
