"""Is delta weight sync worth it? Transfer time saved against the work the delta adds.

A delta sync sends only the changed bytes S_Δ instead of the payload S_W, and pays for it with
snapshot, diff, encode and rebuild steps. When a `weight_sync` span records its payload
(`rl.bytes`), one of its descendants the changed bytes (`rl.bytes_delta`, or `bytes_delta`), and
those steps are traced as its descendants (phases or span names `snapshot`, `diff`, `encode`,
`rebuild`), each sync compares
    saved = (S_W − S_Δ) / B_W    with    cost = snapshot + diff + encode + rebuild
where B_W is the bandwidth fitted over the run's weight syncs (`weight_sync_fit`, when time grows
with payload), else the delta transfer's own rate (S_Δ over the time of the span that moved it).
A step run by several processes at once counts its slowest process (the sync waits for it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis.costs import weight_sync_fit
from rltrace.analysis.engine_requests import DELTA_STEPS, marks as serving_marks
from rltrace.analysis.sync import BELOW_SYNCS

_DELTA_KEYS = ("rl.bytes_delta", "bytes_delta")


def delta_children(con, steps: Steps = None) -> pd.DataFrame:
    """One row per finished weight_sync span and descendant that is a delta step or carries the
    changed bytes. Returns: sync_span_id, step, sync_bytes (`rl.bytes` of the sync), sync_s,
    process_id, child, seconds, bytes_delta."""
    cols = ["sync_span_id", "step", "sync_bytes", "sync_s", "process_id", "child", "seconds", "bytes_delta"]
    if serving_marks(con, "delta_step").empty:  # most runs: no delta sync traced; skip the walk over every span
        return pd.DataFrame(columns=cols)  # (which parts hold one is read once per part, the serving marks)
    marks = ", ".join("?" for _ in DELTA_STEPS)
    where, params = step_filter(steps, "step")
    delta = "coalesce(" + ", ".join(f"TRY_CAST(attr(s.attributes, '{k}') AS DOUBLE)" for k in _DELTA_KEYS) + ")"
    return con.execute(
        f"""WITH RECURSIVE syncs AS (
                SELECT span_id, step, duration_s, TRY_CAST(attr(attributes, 'rl.bytes') AS DOUBLE) AS bytes FROM _spans
                WHERE coalesce(phase, name) = 'weight_sync' AND NOT is_open AND {where}),
            {BELOW_SYNCS},
            kids AS (
                SELECT b.sync_id, s.process_id, coalesce(s.phase, s.name) AS child, s.duration_s AS seconds,
                       {delta} AS bytes_delta
                FROM below b JOIN _spans s ON s.span_id = b.span_id WHERE b.depth > 0 AND NOT s.is_open)
            SELECT span_hex(k.sync_id) AS sync_span_id, y.step, y.bytes AS sync_bytes, y.duration_s AS sync_s, k.process_id,
                   k.child, k.seconds, k.bytes_delta
            FROM kids k JOIN syncs y ON y.span_id = k.sync_id
            WHERE k.child IN ({marks}) OR k.bytes_delta IS NOT NULL
            ORDER BY y.step, k.sync_id, k.child""",
        [*params, *DELTA_STEPS],
    ).df()


def delta_sync(con, steps: Steps = None) -> dict | None:
    """Per traced delta sync and on average: saved transfer time against the delta's own cost.

    Returns None when no sync records `bytes_delta`; else a dict: syncs, bytes_mean (S_W),
    bytes_delta_mean (S_Δ), bandwidth (bytes/s), bandwidth_from (`weight_sync_fit` /
    `delta transfer`), saved_s_mean, cost_s_mean, costs ({step: mean seconds}), net_s_mean
    (saved − cost), worth_it, per_sync (step, sync_span_id, bytes, bytes_delta, saved_s, cost_s,
    net_s), missing (why a figure is null, e.g. no `rl.bytes` on the sync).
    """
    rows = delta_children(con, steps)
    rows = rows[rows["sync_span_id"].isin(rows.loc[rows["bytes_delta"].notna(), "sync_span_id"])]
    if rows.empty:
        return None
    fit = weight_sync_fit(con, steps)
    fitted = fit.get("B_W") if fit.get("regime") == "bandwidth" else None
    per_sync, moved_bytes, moved_s = [], 0.0, 0.0
    for sync_id, g in rows.groupby("sync_span_id", sort=False):
        carrier = g[g["bytes_delta"].notna()]
        s_delta = float(carrier["bytes_delta"].max())
        moved_bytes += s_delta
        moved_s += float(carrier.loc[carrier["bytes_delta"].idxmax(), "seconds"])
        steps_ = g[g["child"].isin(DELTA_STEPS)]
        # per step: the slowest process's summed time (processes run it at once; the sync waits for the slowest)
        cost = steps_.groupby(["child", "process_id"], dropna=False)["seconds"].sum().groupby(level=0).max()
        per_sync.append({"step": None if pd.isna(g["step"].iloc[0]) else int(g["step"].iloc[0]), "sync_span_id": sync_id,
                         "bytes": None if pd.isna(g["sync_bytes"].iloc[0]) else float(g["sync_bytes"].iloc[0]),
                         "bytes_delta": s_delta, "costs": {k: float(v) for k, v in cost.items()},
                         "cost_s": float(cost.sum())})
    bandwidth, source = (fitted, "weight_sync_fit") if fitted else (
        (moved_bytes / moved_s, "delta transfer") if moved_s > 0 else (None, None))
    missing = {}
    if bandwidth is None:
        missing["bandwidth"] = "no weight_sync_fit bandwidth and the span carrying bytes_delta has no duration"
    if any(p["bytes"] is None for p in per_sync):
        missing["bytes"] = "a weight_sync span without rl.bytes (its full payload S_W)"
    for p in per_sync:
        p["saved_s"] = (p["bytes"] - p["bytes_delta"]) / bandwidth if bandwidth and p["bytes"] is not None else None
        p["net_s"] = None if p["saved_s"] is None else p["saved_s"] - p["cost_s"]
    frame = pd.DataFrame(per_sync)
    steps_seen = [k for k in DELTA_STEPS if any(k in p["costs"] for p in per_sync)]  # in the order they run
    net = frame["net_s"].dropna()
    return {
        "syncs": len(per_sync), "bytes_mean": mean_of(frame["bytes"]), "bytes_delta_mean": mean_of(frame["bytes_delta"]),
        "bandwidth": bandwidth, "bandwidth_from": source, "saved_s_mean": mean_of(frame["saved_s"]),
        "cost_s_mean": mean_of(frame["cost_s"]),
        "costs": {k: float(np.mean([p["costs"].get(k, 0.0) for p in per_sync])) for k in steps_seen},
        "net_s_mean": float(net.mean()) if len(net) else None, "worth_it": bool(net.mean() > 0) if len(net) else None,
        "per_sync": [{k: v for k, v in p.items() if k != "costs"} for p in per_sync], "missing": missing,
    }


def mean_of(values: pd.Series) -> float | None:
    """The mean of the numbers among `values`, or None when there are none."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    return float(v.mean()) if len(v) else None
