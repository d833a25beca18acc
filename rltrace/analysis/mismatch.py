"""Training-vs-rollout mismatch per step and its trend (how far the rollout engine's log-probs drift from the trainer's)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis.metrics import step_metrics

MISMATCH_METRICS = ("train_rollout_logprob_abs_diff", "mismatch_k3", "tis_mean", "tis_clipfrac")


def mismatch(con, steps: Steps = None) -> pd.DataFrame:
    """Mismatch values per step from step metrics and, where samples carry them, per-sample columns.

    Returns: step, metric, value, source (`metrics`, or `samples` for the mean of a sample
    column with a mismatch metric's name).
    """
    out = [step_metrics(con, MISMATCH_METRICS, steps).rename(columns={"name": "metric"}).assign(source="metrics")]
    columns = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()}
    where, params = step_filter(steps)
    for metric in MISMATCH_METRICS:
        if metric in columns:
            out.append(
                con.execute(
                    f"""SELECT step, ? AS metric, avg(TRY_CAST("{metric}" AS DOUBLE)) AS value
                        FROM samples WHERE {where} GROUP BY step HAVING value IS NOT NULL ORDER BY step""",
                    [metric, *params],
                ).df().assign(source="samples")
            )
    frame = pd.concat([f for f in out if len(f)], ignore_index=True) if any(len(f) for f in out) else out[0]
    return frame[["step", "metric", "value", "source"]]


def trends(values: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, source) of a `mismatch()`-shaped frame: how it moved over the steps.

    Returns: metric, source, steps, first, last, mean, min, max, max_step (the step of the
    max), slope_per_step (least-squares slope of value against step; NaN with one step).
    """
    rows = []
    for (metric, source), g in values.groupby(["metric", "source"]):
        g = g.sort_values("step")
        slope = float(np.polyfit(g["step"], g["value"], 1)[0]) if g["step"].nunique() > 1 else float("nan")
        rows.append(
            {"metric": metric, "source": source, "steps": len(g), "first": g["value"].iloc[0],
             "last": g["value"].iloc[-1], "mean": g["value"].mean(), "min": g["value"].min(),
             "max": g["value"].max(), "max_step": g["step"].iloc[int(g["value"].to_numpy().argmax())],
             "slope_per_step": slope}
        )
    cols = ["metric", "source", "steps", "first", "last", "mean", "min", "max", "max_step", "slope_per_step"]
    return pd.DataFrame(rows, columns=cols)
