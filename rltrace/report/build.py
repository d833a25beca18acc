"""`build(con)`: every analysis of a run gathered into one plain dict with stable keys.

This is what `rltrace report --json` prints and what the terminal report draws. Every key is
documented in docs/analysis.md; add keys, never rename them.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from rltrace import analysis
from rltrace._phases import COST_COLUMN, phases_of
from rltrace.analysis._steps import Steps
from rltrace.analysis.steps import PHASE_COLUMNS
from rltrace.importers.metrics import SERVICE_NAME as IMPORTER
from rltrace.report import findings

WAITS_PER_STEP = 3
SPIKE_RATIO = 3.0  # an outlier step: a stage took at least this multiple of its median ...
SPIKE_SHARE = 0.25  # ... and at least this share of the median step's wall time more than its median


_SCALARS = frozenset((str, int, bool, type(None)))  # already JSON-ready: by far the most values


def plain(value):
    """JSON-ready copy: numpy scalars to Python, NaN to None, frames to lists of dicts."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        return None if value != value else value
    if isinstance(value, pd.DataFrame):
        return _records(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    """`plain` of each row of a frame, a column at a time: number columns convert at once, and only
    cells that may hold something else (objects, text, nested dicts) go through `plain` one by one."""
    keys = [str(k) for k in frame.columns]
    columns = []
    for i in range(frame.shape[1]):
        values = frame.iloc[:, i].tolist()
        kind = frame.dtypes.iloc[i].kind if isinstance(frame.dtypes.iloc[i], np.dtype) else "O"
        if kind == "f":
            values = [None if v != v else v for v in values]  # NaN is the only value unequal to itself
        elif kind not in "iub":
            values = [v if type(v) is str else plain(v) for v in values]  # text, by far the most, as is
        columns.append(values)
    if not columns:
        return [{} for _ in range(len(frame))]
    return [dict(zip(keys, row)) for row in zip(*columns)]


def build(con, *, steps: Steps = None, now_ns: int | None = None) -> dict:
    """The report of one run (a connection from `rltrace.store.open`) over a step range."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    per_step = analysis.step_breakdown(con, steps)
    costs = analysis.cost_model(con, steps)
    summary = analysis.cost_summary(con, steps, per_step=costs)
    generation = analysis.generation_samples(con, steps)  # read once: long tail and stragglers
    tail = analysis.long_tail(con, steps, table=generation)
    step_rows = per_step.merge(costs.drop(columns=["wall_s"]), on="step", how="left")
    step_rows = step_rows.merge(tail[["step", "tail_s", "tail_share"]], on="step", how="left")
    phase_rows = analysis.phase_rows(con, steps, columns=PHASE_COLUMNS)  # read once: totals and the bottleneck's breakdown
    phases = analysis.phase_totals(con, steps, rows=phase_rows)
    rollout = analysis.rollout(con, steps)
    step_rows = plain(step_rows)
    report = {
        "steps": step_rows,
        "phases": plain(phases),
        **{k: plain(summary.get(k)) for k in ("t_R", "t_T", "t_W", "t_reward", "t_rollout", "t_sync",
                                               "async_bound", "async_speedup_bound", "recorded", "amortised")},
        "async": plain({k: summary.get(k) for k in ("period_s", "stage_s", "concurrent_s", "achieved_speedup",
                                                    "achieved_fraction", "overlapping")}),
        "nested": plain(analysis.nested_stages(con, steps)),
        "bottleneck": _bottleneck(con, steps, summary, costs, phase_rows),
        "outliers": _outliers(con, step_rows),
        "critical_path": plain(analysis.common_paths(con, steps)),
        "waits": plain(analysis.top_waits(con, steps, n=WAITS_PER_STEP)),
        "long_tail": plain(tail),
        "stragglers": plain(analysis.stragglers(con, steps, table=generation)),
        "weight_sync_fit": plain(analysis.weight_sync_fit(con, steps)),
        "weight_sync_children": plain(analysis.sync_growth(con, steps)),
        "staleness": _staleness(con, steps),
        "mismatch": _mismatch(con, steps),
        "reward": _reward(con, steps, rollout),
        "rollout": plain(rollout),
        "engine": plain(analysis.engine_summary(con, steps, rollout_table=rollout)),
        "serving": plain(analysis.serving_section(con, steps)),
        "crashes": plain(analysis.crashes(con)),
        "open_spans": _open_spans(con, now_ns),
        "dropped": _dropped(con),
        "imported_spans": _imported_spans(con),
        "idle_devices": plain(analysis.idle_devices(con, steps)),
    }
    report["findings"] = findings.sentences(report)
    return report


def _bottleneck(con, steps: Steps, summary: dict, costs: pd.DataFrame, phase_rows: pd.DataFrame) -> dict | None:
    """The stage with the longest median time per step (amortised), where it ran, what to open
    next, and the runner-up: when their interquartile ranges overlap the two are within noise."""
    per_step = {stage: costs[col + "_amortised"].dropna() for stage, col in COST_COLUMN.items()}
    medians = {k: float(v.median()) for k, v in per_step.items() if len(v) and v.median() > 0}
    if not medians:
        return None
    ranked = sorted(medians, key=medians.get, reverse=True)
    stage = ranked[0]
    iqr = {k: [float(per_step[k].quantile(0.25)), float(per_step[k].quantile(0.75))] for k in ranked[:2]}
    runner_up = ranked[1] if len(ranked) > 1 else None
    breakdown = analysis.phase_breakdown(con, steps, rows=phase_rows)
    mine = breakdown[breakdown["phase"].isin(phases_of(stage))]
    by_process = mine.groupby("process_id")["seconds"].sum().sort_values(ascending=False)
    by_phase = mine.groupby("phase")["seconds"].sum().sort_values(ascending=False)
    process_id = by_process.index[0] if len(by_process) else None
    who = mine[mine["process_id"] == process_id].iloc[0] if process_id else None
    wall = summary.get("wall_s") or 0
    out = {
        "stage": stage,
        "median_s": medians[stage],
        "share": medians[stage] / wall if wall else None,
        "iqr_s": iqr[stage],
        "runner_up": runner_up,
        "runner_up_median_s": medians.get(runner_up),
        "runner_up_iqr_s": iqr.get(runner_up),
        "within_noise": bool(runner_up and iqr[runner_up][1] >= iqr[stage][0]),
        "phase": by_phase.index[0] if len(by_phase) else stage,
        "process_id": process_id,
        "role": None if who is None else who["role"],
        "rank": None if who is None else who["rank"],
        "profiles": plain(analysis.for_phase(con, by_phase.index[0], steps) if len(by_phase) else []),
    }
    return plain(out)


def _outliers(con, step_rows: list[dict]) -> list[dict]:
    """Stages whose slowest step stands far above their median: occasional culprits that medians hide."""
    frame = pd.DataFrame(step_rows)
    if frame.empty:
        return []
    wall, out = frame["wall_s"].median(), []
    for stage, col in COST_COLUMN.items():
        values = frame[col].dropna() if col in frame else pd.Series(dtype=float)
        if values.empty:
            continue
        median, worst = values.median(), values.idxmax()
        if values[worst] < SPIKE_RATIO * median or values[worst] - median < SPIKE_SHARE * wall:
            continue
        step = int(frame.loc[worst, "step"])
        profiles = [p for phase in phases_of(stage) for p in plain(analysis.for_phase(con, phase, (step, step)))]
        out.append({"stage": stage, "step": step, "seconds": values[worst], "median_s": median,
                    "steps_over": int((values >= SPIKE_RATIO * median).sum()), "profiles": profiles})
    return plain(out)


def _open_spans(con, now_ns: int) -> list[dict]:
    """Open spans, each with the profiles (e.g. a py-spy hang dump) attached to it."""
    spans = plain(analysis.open_spans(con, now_ns=now_ns))
    profiles = plain(analysis.attached(con, [o["span_id"] for o in spans]))
    for o in spans:
        o["profiles"] = [p for p in profiles if p["span_id"] == o["span_id"]]
    return spans


def _staleness(con, steps: Steps) -> dict:
    per_step = analysis.staleness(con, steps)
    hist = analysis.staleness_histogram(con, steps)
    by_step: dict[int, dict[str, int]] = {}
    for step, age, n in zip(hist["step"].tolist(), hist["age"].tolist(), hist["samples"].tolist()):
        by_step.setdefault(step, {})[str(age)] = n
    rows = plain(per_step)
    for row in rows:
        row["histogram"] = plain(by_step.get(row["step"], {}))
    return {
        "mean": plain(per_step["mean"].mean()) if len(per_step) else None,
        "max": plain(per_step["max"].max()) if len(per_step) else None,
        "per_step": rows,
    }


def _mismatch(con, steps: Steps) -> dict:
    values = analysis.mismatch(con, steps)
    return {"trends": plain(analysis.trends(values)), "per_step": plain(values)}


def _reward(con, steps: Steps, ro: pd.DataFrame) -> dict:
    r = analysis.step_metrics(con, ["reward_mean"], steps)
    if r.empty:  # no reward_mean logged: the mean of the samples' rewards (an imported slime run)
        if "reward_mean" in ro and ro["reward_mean"].notna().any():
            r = ro.loc[ro["reward_mean"].notna(), ["step", "reward_mean"]].rename(columns={"reward_mean": "value"})
            r = r.assign(logged_as="samples' reward").reset_index(drop=True)
    if r.empty:
        return {"first": None, "last": None, "mean": None, "best": None, "best_step": None, "logged_as": None,
                "per_step": []}
    best = r["value"].idxmax()
    return plain({"first": r["value"].iloc[0], "last": r["value"].iloc[-1], "mean": r["value"].mean(),
                  "best": r["value"][best], "best_step": r["step"][best], "first_step": r["step"].iloc[0],
                  "last_step": r["step"].iloc[-1], "logged_as": sorted(set(r["logged_as"])),
                  "per_step": r[["step", "value"]]})


def _imported_spans(con) -> dict:
    """How many finished spans were synthesized from imported metric logs (`rltrace import
    metrics` writes them, with `rl.source` = metrics, as the service `IMPORTER`)."""
    imported, total = con.execute(
        "SELECT (SELECT count(*) FROM spans WHERE NOT is_open AND service_name = $importer), "
        "(SELECT sum(rows) FROM _rltrace_span_parts)", {"importer": IMPORTER}).fetchall()[0]
    return {"metrics": int(imported or 0), "total": int(total or 0)}


def _dropped(con) -> dict:
    d = analysis.drops(con)
    return plain(
        {
            "spans": int(d["spans_dropped"].sum()) if len(d) else 0,
            "rows": int(d["rows_dropped"].sum()) if len(d) else 0,
            "otlp_spans": int(d["otlp_spans_dropped"].sum()) if len(d) else 0,
            "attributes": int(d["attributes_dropped"].sum()) if len(d) else 0,
            "processes": d[(d["spans_dropped"] > 0) | (d["rows_dropped"] > 0) | (d["otlp_spans_dropped"] > 0)].drop(columns="drop_reasons"),
        }
    )
