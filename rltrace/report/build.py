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
from rltrace import _names
from rltrace._phases import COST_COLUMN, phases_of
from rltrace.analysis import health
from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis._format import process_name
from rltrace.analysis.steps import PHASE_COLUMNS
from rltrace.importers.metrics import SERVICE_NAME as IMPORTER
from rltrace.report import evidence, findings
from rltrace.report import stages as stage_figures

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


def build(con, *, steps: Steps = None, now_ns: int | None = None, skipped: list[str] | tuple = ()) -> dict:
    """The report of one run (a connection from `rltrace.store.open`) over a step range; `skipped`:
    the damaged parts its snapshot left out ("path: why", `store.scan(..., skip_corrupt=True)`)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    asked = steps
    steps, ahead = analysis.trainer_steps(con, steps)
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
    stage_list = stage_figures.stage_rows(costs, analysis.stage_children(con, steps))
    step_rows = plain(step_rows)
    report = {
        "step_range": _step_range(con, asked),
        "ran_ahead": _ran_ahead(con, ahead),
        "steps": step_rows,
        "phases": plain(phases),
        **{k: plain(summary.get(k)) for k in ("wall_s", "t_R", "t_T", "t_W", "t_reward", "t_rollout", "t_sync",
                                               "async_bound", "async_speedup_bound", "recorded", "amortised")},
        "async": plain({k: summary.get(k) for k in ("period_s", "stage_s", "concurrent_s", "achieved_speedup",
                                                    "achieved_fraction", "overlapping")}),
        "nested": plain(analysis.nested_stages(con, steps)),
        "stages": plain(stage_list),
        "bottleneck": _bottleneck(con, steps, stage_list, phase_rows),
        "outliers": _outliers(con, step_rows),
        "critical_path": plain(analysis.common_paths(con, steps)),
        "waits": plain(analysis.top_waits(con, steps, n=WAITS_PER_STEP)),
        "waits_by_step": _waits_by_step(con, steps),
        "waits_total": plain(analysis.waits_total(con, steps)),
        "long_tail": plain(tail),
        "stragglers": plain(analysis.stragglers(con, steps, table=generation)),
        "weight_sync_fit": plain(analysis.weight_sync_fit(con, steps)),
        "weight_sync_points": plain(analysis.weight_sync_points(con, steps)),
        "weight_sync_children": plain(analysis.sync_growth(con, steps)),
        "staleness": _staleness(con, steps),
        "whatif": _whatif(con, steps, costs, summary),
        "mismatch": _mismatch(con, steps),
        "reward": _reward(con, steps, rollout),
        "metrics": plain(analysis.step_metrics(con, _names.METRICS, steps)),
        "scalars": _scalars(con, steps),
        "rollout": plain(rollout),
        "engine": plain(analysis.engine_summary(con, steps, rollout_table=rollout)),
        "serving": plain(analysis.serving_section(con, steps)),
        "crashes": plain(analysis.crashes(con)),
        "open_spans": _open_spans(con, now_ns),
        "unstepped": analysis.unstepped(con),
        "blocking": _blocking(con, now_ns),
        "startups": analysis.startups(con),
        "restarts": analysis.restarts(con),
        "imbalance": plain(analysis.imbalance(con, steps)),
        "dropped": _dropped(con),
        "imported_spans": _imported_spans(con),
        "idle_devices": plain(analysis.idle_devices(con, steps)),
        "skipped_parts": list(skipped),
    }
    report["figures"] = plain(evidence.figures(report, evidence.sources(con)))
    if report["figures"]["achieved_speedup"]["kind"] == evidence.NOT_RECORDED:  # not recorded is never a number
        report["async"] |= {"achieved_speedup": None, "achieved_fraction": None, "concurrent_s": None, "overlapping": None}
    report["findings"] = findings.sentences(report)
    return report


def _ran_ahead(con, ahead: list[int]) -> dict | None:
    """Steps the trainer never reached that other work ran into: steps, spans (finished, in them),
    processes (names, e.g. rollout0)."""
    if not ahead:
        return None
    rows = con.execute("SELECT any_value(role), any_value(rank), count(*) FROM spans WHERE NOT is_open "
                       "AND list_contains(?, step) GROUP BY process_id ORDER BY 1, 2", [ahead]).fetchall()
    return {"steps": ahead, "spans": int(sum(n for _, _, n in rows)),
            "processes": [process_name(role, rank) for role, rank, _ in rows]}


def _bottleneck(con, steps: Steps, stages: list[dict], phase_rows: pd.DataFrame) -> dict | None:
    """`stages.bottleneck`, with the profiles attached to its largest phase's longest spans."""
    b = stage_figures.bottleneck(stages, analysis.phase_breakdown(con, steps, rows=phase_rows))
    if b is None:
        return None
    b["profiles"] = plain(analysis.for_phase(con, b["phase"], steps))
    return plain(b)


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
        over = values >= SPIKE_RATIO * median
        out.append({"stage": stage, "step": step, "seconds": values[worst], "median_s": median,
                    "steps_over": int(over.sum()), "over_steps": sorted(int(x) for x in frame.loc[over[over].index, "step"]),
                    "profiles": profiles})
    return plain(out)


def _step_range(con, steps: Steps) -> dict:
    """The steps asked for (`selected`: [first, last], None for all) and the run's own trainer steps
    (`trainer_steps`): first, last and how many hold a finished span, so an empty selection can say
    where the steps are; `ran_ahead`: the run's steps past them."""
    trained, ahead = analysis.trainer_steps(con, None)
    every = analysis.step_breakdown(con)
    if ahead:
        every = every[every["step"] <= trained[1]]
    first, last = (int(every["step"].min()), int(every["step"].max())) if len(every) else (None, None)
    return {"selected": None if steps is None else list(steps), "run_first": first, "run_last": last,
            "run_steps": int(len(every)), "ran_ahead": ahead}


def _waits_by_step(con, steps: Steps) -> list[dict]:
    """Per step, process and awaited stage (`waited_for_group`): seconds waited (every wait of
    the step, for the chart of who waits for what; `waits` keeps the longest few, with sentences)."""
    return plain(analysis.waits_by_step(con, steps))


def _open_spans(con, now_ns: int) -> list[dict]:
    """Open spans, each with the profiles (e.g. a py-spy hang dump) attached to it, and whether it
    is work in progress (`in_progress`: its process is alive and it is not what `rltrace watch`
    calls hung, `health.mark_in_progress`; the findings name only the others)."""
    spans = plain(analysis.open_spans(con, now_ns=now_ns))
    profiles = plain(analysis.attached(con, [o["span_id"] for o in spans]))
    for o in spans:
        o["profiles"] = [p for p in profiles if p["span_id"] == o["span_id"]]
    health.mark_in_progress(con, spans)
    return spans


#: Replays behind the report's one-step-off prediction (`rltrace whatif` runs 200).
WHATIF_REPLAYS = 100


def _whatif(con, steps: Steps, costs: pd.DataFrame, summary: dict) -> dict | None:
    """What async could gain, replayed: one-step-off (staleness 1) predicted from the run's own samples
    and stage times (`analysis.whatif`), for a run whose stages ran one after another; else None."""
    if summary.get("overlapping") or not {"t_R", "t_T"} <= set(summary.get("recorded") or []):
        return None
    table = analysis.what_if(con, [analysis.WhatIf(staleness=1)], steps, replicates=WHATIF_REPLAYS,
                             per_step=costs, summary=summary)
    if table.empty or table.iloc[0]["staleness"] != 0:  # already async: the overlap sentence tells
        return None
    return plain(table.iloc[1].to_dict())


def _blocking(con, now_ns: int) -> list[dict]:
    """Who waits on whom, and on what, from the stacks the processes wrote (`rltrace.stacks`)."""
    from rltrace.stacks import edges

    return plain([e.as_dict() for e in edges(con, now_ns)])


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


#: Which computation of a mismatch metric leads when there are several: the run's own logged
#: value, then the one computed from frozen batches, then the mean of per-sample columns.
MISMATCH_SOURCES = ("metrics", "batches", "samples")
AGREE_ABS, AGREE_REL = 1e-7, 1e-4  # float precision: below the 1e-6 alignment gate; float32 accumulation


def _mismatch(con, steps: Steps) -> dict:
    """One row per mismatch metric in `trends` (its leading computation), with every other
    computation of the same quantity compared with it on the steps both hold."""
    values = analysis.mismatch(con, steps)
    trends = analysis.trends(values)
    rows = []
    for metric, group in trends.groupby("metric", sort=True):
        ranked = sorted(group.to_dict("records"), key=lambda t: _source_rank(t["source"]))
        lead = ranked[0]
        lead["sources"] = [t["source"] for t in ranked]
        lead["computations"] = [_agreement(values, metric, lead["source"], t["source"]) for t in ranked[1:]]
        rows.append(lead)
    return {"trends": plain(rows), "per_step": plain(values), "missing": plain(analysis.mismatch_missing(con, steps))}


def _source_rank(source: str) -> int:
    return MISMATCH_SOURCES.index(source) if source in MISMATCH_SOURCES else len(MISMATCH_SOURCES)


def _agreement(values: pd.DataFrame, metric: str, lead: str, other: str) -> dict:
    """How a second computation of `metric` compares with the leading one on their common steps:
    source, steps (compared), max_abs_diff, at_step (where it is largest), agree (within float
    precision: AGREE_ABS, or AGREE_REL of the larger value)."""
    mine = values[values["metric"] == metric]
    a = mine[mine["source"] == lead].set_index("step")["value"]
    b = mine[mine["source"] == other].set_index("step")["value"]
    common = a.index.intersection(b.index)
    out = {"source": other, "steps": int(len(common)), "max_abs_diff": None, "at_step": None, "agree": None}
    if len(common):
        diff = (a[common] - b[common]).abs()
        worst = diff.idxmax()
        scale = max(abs(a[worst]), abs(b[worst]))
        out |= {"max_abs_diff": float(diff[worst]), "at_step": int(worst), "lead_value": float(a[worst]),
                "other_value": float(b[worst]), "agree": bool(diff[worst] <= max(AGREE_ABS, AGREE_REL * scale))}
    return out


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


def _scalars(con, steps: Steps) -> list[dict]:
    """Every logged step scalar by the name it was logged under (your `loss` too): `name`, `mean`
    over the steps, `last` (at the last step that logged it), `steps`."""
    where, params = step_filter(steps)
    return plain(con.execute(
        f"""SELECT name, avg(value) AS mean, arg_max(value, step) AS last, count(DISTINCT step) AS steps
            FROM metrics WHERE {where} AND value IS NOT NULL AND NOT isnan(value) GROUP BY name ORDER BY name""",
        params).df())


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
