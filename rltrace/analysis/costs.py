"""The seed's cost models from measured spans: t_R, t_T, t_W, t_sync, the async bound, the
weight-sync fit `t_W ≈ S_W / B_W + t_0`.

Per step, `t_X` is the length of the union, over every process and thread, of the intervals of
the step's finished spans whose phase is in category X (R: rollout, generate, reward; T: train,
forward, backward, optimizer; W: weight_sync). Nested or concurrent spans count once; a
category with no span in the step counts 0. Medians are taken per column over steps.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rltrace.analysis import summary
from rltrace.analysis._steps import Steps


def cost_model(con, steps: Steps = None) -> pd.DataFrame:
    """Per step: the seed's formulas on measured times.

    Returns:
        step; wall_s (first start to last end); t_R, t_T, t_W (seconds, see module doc);
        t_reward (union of reward spans), t_rollout (t_R - t_reward); t_sync = t_R + t_T + t_W;
        async_bound = max(t_R, t_T) + t_W; async_speedup_bound = t_sync / async_bound
        (NaN when async_bound is 0).
    """
    rows = summary.rows(con, steps, kinds=("stage", "step"))
    walls = rows[rows["kind"] == "step"].set_index("step")["seconds"].rename("wall_s")
    stages = rows[rows["kind"] == "stage"].pivot_table(index="step", columns="phase", values="seconds", aggfunc="sum")
    out = pd.DataFrame(index=walls.index).join(walls)
    for col, key in (("t_R", "R"), ("t_T", "T"), ("t_W", "W"), ("t_reward", "reward")):
        out[col] = stages[key] if key in stages else 0.0
    out = out.fillna({"t_R": 0.0, "t_T": 0.0, "t_W": 0.0, "t_reward": 0.0})
    out["t_rollout"] = out["t_R"] - out["t_reward"]
    out = _formulas(out)
    return out.reset_index()


def _formulas(frame: pd.DataFrame) -> pd.DataFrame:
    frame["t_sync"] = frame["t_R"] + frame["t_T"] + frame["t_W"]
    frame["async_bound"] = np.maximum(frame["t_R"], frame["t_T"]) + frame["t_W"]
    frame["async_speedup_bound"] = frame["t_sync"] / frame["async_bound"].where(frame["async_bound"] > 0)
    return frame


def cost_summary(con, steps: Steps = None) -> dict:
    """Medians over steps and what async achieved.

    Returns a dict (seconds unless noted): steps (count); t_R, t_T, t_W, t_reward, t_rollout,
    wall_s (per-column medians); t_sync, async_bound, async_speedup_bound (the formulas on those
    medians); period_s (median time between the ends of consecutive steps: the achieved step
    time); achieved_speedup (t_sync / period_s); achieved_fraction ((t_sync - period_s) /
    (t_sync - async_bound): 1 means the async bound was reached, 0 no overlap); overlapping
    (true when most consecutive steps overlap in time, i.e. the run ran async).
    """
    per_step = cost_model(con, steps)
    out: dict = {"steps": int(len(per_step))}
    if per_step.empty:
        return out | {k: None for k in ("t_R", "t_T", "t_W", "t_reward", "t_rollout", "wall_s", "t_sync",
                                           "async_bound", "async_speedup_bound", "period_s", "achieved_speedup",
                                           "achieved_fraction", "overlapping")}
    for col in ("t_R", "t_T", "t_W", "t_reward", "t_rollout", "wall_s"):
        out[col] = float(per_step[col].median())
    med = _formulas(pd.DataFrame([{k: out[k] for k in ("t_R", "t_T", "t_W")}])).iloc[0]
    out["t_sync"], out["async_bound"] = float(med["t_sync"]), float(med["async_bound"])
    out["async_speedup_bound"] = _num(med["async_speedup_bound"])
    checks = summary.checks(con, steps)
    consecutive = checks["step"].diff() == 1
    periods = (checks["end_ns"].diff() / 1e9)[consecutive]
    overlaps = (checks["start_ns"] < checks["end_ns"].shift())[consecutive]
    out["period_s"] = float(periods.median()) if len(periods) else None
    out["achieved_speedup"] = out["t_sync"] / out["period_s"] if out["period_s"] else None
    room = out["t_sync"] - out["async_bound"]
    out["achieved_fraction"] = (out["t_sync"] - out["period_s"]) / room if out["period_s"] and room > 0 else None
    out["overlapping"] = bool(len(overlaps) and overlaps.mean() > 0.5)
    return out


def _num(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def weight_sync_points(con, steps: Steps = None) -> pd.DataFrame:
    """Finished `weight_sync` spans that carry a payload size.

    Returns:
        step, process_id, span_id, bytes (the span's `rl.bytes`), seconds (duration), method
        (`rl.method`, or None).
    """
    rows = summary.rows(con, steps, kinds=("sync",))
    return pd.DataFrame(
        {
            "step": rows["step"],
            "process_id": rows["process_id"],
            "span_id": rows["span_id"],
            "bytes": rows["count"].astype(float),
            "seconds": rows["seconds"],
            "method": rows["other"],
        }
    ).sort_values(["step", "span_id"], ignore_index=True)


def weight_sync_fit(con, steps: Steps = None) -> dict:
    """Least-squares fit of weight-sync time against payload: seconds ≈ bytes / B_W + t_0.

    Returns a dict: n (points), sizes (distinct payload sizes), B_W (bytes/s; None when all
    payloads have one size, or the fitted slope is not positive), t_0 (seconds), r2 (coefficient
    of determination), rmse_s (root-mean-square residual, seconds), effective_B_W (total bytes /
    total seconds: what a single size can still tell), methods (distinct `rl.method` values).
    """
    pts = weight_sync_points(con, steps)
    return fit_bandwidth(pts["bytes"].to_numpy(float), pts["seconds"].to_numpy(float)) | {
        "methods": sorted(m for m in pts["method"].dropna().unique())
    }


def fit_bandwidth(nbytes: np.ndarray, seconds: np.ndarray) -> dict:
    """The fit of `weight_sync_fit` on plain arrays."""
    n = len(nbytes)
    out = {"n": int(n), "sizes": int(len(np.unique(nbytes))), "B_W": None, "t_0": None, "r2": None, "rmse_s": None}
    out["effective_B_W"] = float(nbytes.sum() / seconds.sum()) if n and seconds.sum() > 0 else None
    if n < 2 or out["sizes"] < 2:
        return out
    design = np.column_stack([nbytes, np.ones(n)])
    (slope, intercept), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    residual = seconds - design @ np.array([slope, intercept])
    spread = ((seconds - seconds.mean()) ** 2).sum()
    out["t_0"] = float(intercept)
    out["B_W"] = float(1.0 / slope) if slope > 0 else None
    out["rmse_s"] = float(np.sqrt((residual**2).mean()))
    out["r2"] = float(1.0 - (residual**2).sum() / spread) if spread > 0 else None
    return out
