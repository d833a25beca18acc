"""What the hardware did under each phase: `resources` samples (init(resources=True)) joined to spans.

A sample covers the `interval_s` before its `time_ns`; it belongs to every span of the same
process that is open at the middle of that interval (a `train` span and the `step` around it
both get it). Spans still open (hung or running) count up to now. GPU utilisation is NVML's: the
share of time a kernel ran on the device, whoever launched it.
"""

from __future__ import annotations

import pandas as pd

from rltrace.analysis._steps import Steps, step_filter

IDLE_PCT = 10.0  # a GPU under this mean utilisation during a phase is idle
MIN_SAMPLES = 3  # ... over at least this many samples
NOT_WORK = ("wait", "step")  # phases where an idle device is expected (the waits analysis covers them)

_COLUMNS = ["step", "phase", "process_id", "role", "rank", "kind", "device", "device_name", "samples", "util_mean_pct",
            "util_max_pct", "mem_max_bytes", "power_mean_w"]


def phase_resources(con, steps: Steps = None) -> pd.DataFrame:
    """Mean utilisation per phase per step, per process and device.

    Returns:
        step, phase, process_id, role, rank, kind (cpu / gpu), device (GPU index; null for cpu),
        device_name, samples, util_mean_pct and util_max_pct (cpu: 100 = one core; gpu: % of
        time busy), mem_max_bytes (cpu: RSS; gpu: device memory used), power_mean_w (gpu).
        Empty when the run sampled no resources.
    """
    where, params = step_filter(steps, "s.step")
    sampled = con.execute("SELECT count(*) FROM (SELECT 1 FROM resources WHERE note IS NULL AND util_pct IS NOT NULL LIMIT 1)")
    # no samples (most runs): the same query on no spans, so the empty frame keeps its columns' types
    spans = "spans" if sampled.fetchall()[0][0] else "(SELECT * FROM spans LIMIT 0)"
    return con.execute(
        f"""WITH r AS (SELECT *, time_ns - CAST(coalesce(interval_s, 0) * 5e8 AS BIGINT) AS mid_ns
                       FROM resources WHERE note IS NULL AND util_pct IS NOT NULL)
            SELECT s.step, coalesce(s.phase, s.name) AS phase, r.process_id, any_value(r.role) AS role,
                   any_value(r.rank) AS rank, r.kind, r.device, any_value(r.device_name) AS device_name,
                   count(*) AS samples, avg(r.util_pct) AS util_mean_pct, max(r.util_pct) AS util_max_pct,
                   max(r.mem_bytes) AS mem_max_bytes, avg(r.power_w) AS power_mean_w
            FROM {spans} s JOIN r ON r.process_id = s.process_id
                 AND r.mid_ns >= s.start_ns AND r.mid_ns <= coalesce(s.end_ns, 9223372036854775807)
            WHERE {where}
            GROUP BY s.step, coalesce(s.phase, s.name), r.process_id, r.kind, r.device
            ORDER BY s.step NULLS FIRST, r.process_id, phase, r.kind, r.device""",
        params,
    ).df()[_COLUMNS]


def idle_devices(con, steps: Steps = None, *, idle_pct: float = IDLE_PCT, min_samples: int = MIN_SAMPLES) -> pd.DataFrame:
    """GPUs that sat nearly idle during a working phase (not `wait` or `step`), over the whole range.

    Returns: process_id, role, rank, phase, device, device_name, util_mean_pct (mean over every
    sample in the phase), samples, steps (how many steps the samples came from); idlest first.
    """
    per = phase_resources(con, steps)
    per = per[(per["kind"] == "gpu") & ~per["phase"].isin(NOT_WORK)]
    cols = ["process_id", "role", "rank", "phase", "device", "device_name", "util_mean_pct", "samples", "steps"]
    if per.empty:
        return pd.DataFrame(columns=cols)
    per = per.assign(weighted=per["util_mean_pct"] * per["samples"])
    out = per.groupby(["process_id", "phase", "device"], dropna=False).agg(
        role=("role", "first"), rank=("rank", "first"), device_name=("device_name", "first"),
        weighted=("weighted", "sum"), samples=("samples", "sum"), steps=("step", "nunique")).reset_index()
    out["util_mean_pct"] = out["weighted"] / out["samples"]
    out = out[(out["util_mean_pct"] < idle_pct) & (out["samples"] >= min_samples)]
    return out.sort_values(["util_mean_pct", "samples"], ascending=[True, False], ignore_index=True)[cols]


def notes(con) -> pd.DataFrame:
    """Why a kind of resource was not sampled, per process. Returns: process_id, role, rank, kind, note."""
    return con.execute(
        """SELECT process_id, any_value(role) AS role, any_value(rank) AS rank, kind, note FROM resources
           WHERE note IS NOT NULL GROUP BY process_id, kind, note ORDER BY process_id, kind"""
    ).df()


def samples(con, start_ns: int, end_ns: int, *, max_rows: int = 20000) -> pd.DataFrame:
    """Resource samples whose interval overlaps [start_ns, end_ns], for drawing lanes under spans.

    Returns: time_ns, interval_s, process_id, role, rank, kind, device, device_name, util_pct,
    mem_bytes, power_w; ordered by process, kind, device and time (at most `max_rows`, latest kept).
    """
    return con.execute(
        """SELECT time_ns, interval_s, process_id, role, rank, kind, device, device_name, util_pct, mem_bytes, power_w
           FROM (SELECT * FROM resources WHERE note IS NULL AND util_pct IS NOT NULL
                 AND time_ns > ? AND time_ns - CAST(coalesce(interval_s, 0) * 1e9 AS BIGINT) < ?
                 ORDER BY time_ns DESC LIMIT ?)
           ORDER BY process_id, kind, device NULLS FIRST, time_ns""",
        [int(start_ns), int(end_ns), int(max_rows)],
    ).df()
