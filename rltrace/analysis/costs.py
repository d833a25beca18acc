"""The async cost model from measured spans: t_R, t_T, t_W, t_sync, the async bound
max(t_R, t_T) + t_W (after slime's async analysis), the weight-sync fit `t_W ≈ S_W / B_W + t_0`.

Per step, `t_X` is the length of the union, over every process and thread, of the *own time*
of the step's spans whose phase is in term X (R: rollout, generate, reward; T: train, forward,
backward, optimizer; W: weight_sync); a span's own time leaves out nested spans of another stage
on its thread (see `_compute`). Three rules keep the model true on real run shapes:

- **Absent is not zero.** A term with no span anywhere in the run is None (not recorded); the
  formulas use the terms that were recorded and say which.
- **Amortised steps.** A stage that runs on some steps only (generation every k steps, several
  updates per rollout) serves the steps up to its next run: its time is spread over them
  (`t_R` of a rollout feeding k train steps is its time / k). Medians, the async bound and the
  bottleneck use the amortised figures; the per-step table shows both.
- **Overlap only from evidence.** `achieved_speedup` comes from measured concurrency: the time
  each term ran while another term ran anywhere (`overlap` summary rows), never from comparing a
  step period with medians. A run whose stages never ran at once reports exactly 1.0.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rltrace._phases import TERM_COLUMN, phases_of
from rltrace.analysis import summary
from rltrace.analysis._robust import theil_sen
from rltrace.analysis._steps import Steps

OVERLAP_SHARE = 0.05  # stages ran at once for at least this share of their time: the run overlaps
_RAW = ("t_R", "t_T", "t_W", "t_reward")


def cost_model(con, steps: Steps = None) -> pd.DataFrame:
    """Per step: the cost model on measured times.

    Returns:
        step; wall_s (first start to last end); t_R, t_T, t_W, t_reward (seconds, own time; NaN
        where the step has no such span), t_rollout (t_R - t_reward); t_R_amortised,
        t_T_amortised, t_W_amortised, t_reward_amortised, t_rollout_amortised (each run of a
        stage spread over the steps it serves; NaN when the run has no such span at all);
        t_sync = t_R + t_T + t_W and async_bound = max(t_R, t_T) + t_W on the amortised figures
        (absent terms left out); async_speedup_bound = t_sync / async_bound (NaN when 0).
    """
    rows = summary.rows(con, steps, kinds=("stage", "step"), columns=("step", "kind", "phase", "seconds"))
    walls = rows[rows["kind"] == "step"].set_index("step")["seconds"].rename("wall_s")
    stages = rows[rows["kind"] == "stage"].pivot_table(index="step", columns="phase", values="seconds", aggfunc="sum")
    out = pd.DataFrame(index=walls.index).join(walls)
    for col, key in (("t_R", "R"), ("t_T", "T"), ("t_W", "W"), ("t_reward", "reward")):
        out[col] = stages[key] if key in stages else np.nan
    if out["t_reward"].notna().any():  # a step with rollout but no reward, in a run that records reward, has reward 0
        out["t_reward"] = out["t_reward"].where(out["t_R"].isna(), out["t_reward"].fillna(0.0))
    out["t_rollout"] = out["t_R"] - out["t_reward"].fillna(0.0)  # a run without reward spans: all of t_R
    for col in _RAW:
        out[col + "_amortised"] = _amortise(out[col])
    out["t_rollout_amortised"] = out["t_R_amortised"] - out["t_reward_amortised"].fillna(0.0)
    if not _records_rollout(con, steps):  # reward spans only: the rollout is not recorded, not 0 s
        out["t_rollout"] = out["t_rollout_amortised"] = np.nan
    out = _formulas(out, suffix="_amortised")
    return out.reset_index()


def _records_rollout(con, steps: Steps) -> bool:
    """Whether any selected step holds a rollout-stage phase (rollout, generate)."""
    phases = summary.rows(con, steps, kinds=("phase",), columns=("phase",))["phase"]
    return bool(phases.isin(phases_of("rollout")).any())


def serving_period(present: np.ndarray) -> int:
    """How many steps one run of a stage serves: the median gap between the steps it ran on (the
    steps left after its only run when it ran once); 1 for a stage that runs every step."""
    where = np.flatnonzero(present)
    if not len(where):
        return 1
    gaps = np.diff(where) if len(where) > 1 else np.array([len(present) - where[0]])
    return max(1, int(round(float(np.median(gaps)))))


def trainer_steps(con, steps: Steps) -> tuple[Steps, list[int]]:
    """The range of trainer steps within `steps`, and the steps after it: a step is a trainer step,
    and work that ran ahead into a step the trainer never reached (an async worker generating for
    a step the trainer stopped before) is told apart, not averaged in; a step the trainer reached
    (a span of a process that trains, even one a crash or kill left unfinished) counts. Only for
    runs whose training runs every step (otherwise a trailing step may be served by an earlier one)."""
    costs = cost_model(con, steps)
    trained = costs["t_T"].notna().to_numpy() if len(costs) else None
    if trained is None or not trained.any() or serving_period(trained) > 1:
        return steps, []
    last = int(costs.loc[trained, "step"].max())
    ahead = [int(s) for s in costs.loc[costs["step"] > last, "step"]]
    if ahead:  # a step the trainer reached (any span of a process that trains, open or not, a zero-length train) counts
        held = con.execute(
            """SELECT max(step) FROM spans WHERE list_contains(?, step) AND process_id IN (
                   SELECT DISTINCT process_id FROM spans WHERE NOT is_open AND step = ?
                   AND list_contains(?, coalesce(phase, name)))""", [ahead, last, list(phases_of("train"))]).fetchall()
        last = max(last, held[0][0] if held and held[0][0] is not None else last)
        ahead = [s for s in ahead if s > last]
    if not ahead:
        return steps, []
    return (None if steps is None else steps[0], last), ahead


def _amortise(values: pd.Series) -> pd.Series:
    """Spread each recorded value over the steps it serves (itself and up to k - 1 after it).

    A stage that normally runs every step (k = 1) is left as recorded: a step where it is
    missing (a hung last step, a gap in the record) is not recorded rather than amortised.
    """
    present = values.notna().to_numpy()
    k = serving_period(present)
    if k == 1:
        return values.astype(float)
    where = np.flatnonzero(present)
    stop = np.minimum(np.append(where[1:], len(present)), where + k)
    out = np.full(len(present), np.nan)
    v = values.to_numpy(float)
    for a, b in zip(where, stop):
        out[a:b] = v[a] / (b - a)
    return pd.Series(out, index=values.index)


def _formulas(frame: pd.DataFrame, suffix: str = "") -> pd.DataFrame:
    r, t, w = (frame[c + suffix] for c in ("t_R", "t_T", "t_W"))
    frame["t_sync"] = r.fillna(0) + t.fillna(0) + w.fillna(0)
    frame["async_bound"] = np.maximum(r.fillna(0), t.fillna(0)) + w.fillna(0)
    frame["async_speedup_bound"] = frame["t_sync"] / frame["async_bound"].where(frame["async_bound"] > 0)
    return frame


def cost_summary(con, steps: Steps = None, *, per_step: pd.DataFrame | None = None) -> dict:
    """Medians over steps and what overlap achieved.

    Returns a dict (seconds unless noted): steps (count); t_R, t_T, t_W, t_reward, t_rollout,
    wall_s (medians of the amortised per-step figures; None when the run recorded no such span);
    recorded (the terms with spans, e.g. ["t_R", "t_T"]); amortised ({column: k} for stages that
    run every k > 1 steps: one run serves k steps, see `serving_period`);
    t_sync, async_bound, async_speedup_bound (the formulas on those medians, absent terms left
    out); spread ({column: [q25, q75]} of the amortised per-step figures); period_s (median time
    between the ends of consecutive steps, for reference); stage_s (summed own time of every
    term over the steps); concurrent_s (time during which two terms ran at once, pairwise);
    achieved_speedup (stage_s / (stage_s - concurrent_s): 1.0 when no two terms ever ran at
    once); achieved_fraction ((1 - 1/achieved) / (1 - 1/async_speedup_bound): 1 means the async
    bound was reached, 0 no overlap); overlapping (concurrent_s is at least 5 % of stage_s).
    `per_step`: the `cost_model()` table of the same steps, when the caller has it already.
    """
    per_step = cost_model(con, steps) if per_step is None else per_step
    keys = ("t_R", "t_T", "t_W", "t_reward", "t_rollout", "wall_s", "recorded", "amortised", "t_sync", "async_bound",
            "async_speedup_bound", "spread", "period_s", "stage_s", "concurrent_s", "achieved_speedup",
            "achieved_fraction", "overlapping")
    out: dict = {"steps": int(len(per_step))} | {k: None for k in keys}
    if per_step.empty:
        return out
    out["wall_s"] = float(per_step["wall_s"].median())
    out["recorded"] = [c for c in TERM_COLUMN.values() if per_step[c].notna().any()]
    out["amortised"], out["spread"] = {}, {}
    for col in ("t_R", "t_T", "t_W", "t_reward", "t_rollout"):
        values = per_step[col + "_amortised"].dropna()
        out[col] = float(values.median()) if len(values) else None
        if len(values):
            out["spread"][col] = [float(values.quantile(0.25)), float(values.quantile(0.75))]
        k = serving_period(per_step[col].notna().to_numpy())
        if col != "t_rollout" and k > 1:
            out["amortised"][col] = k
    med = _formulas(pd.DataFrame([{k: out[k] if out[k] is not None else np.nan for k in ("t_R", "t_T", "t_W")}])).iloc[0]
    out["t_sync"], out["async_bound"] = float(med["t_sync"]), float(med["async_bound"])
    out["async_speedup_bound"] = _num(med["async_speedup_bound"])
    checks = summary.checks(con, steps)
    consecutive = checks["step"].diff() == 1
    periods = (checks["end_ns"].diff() / 1e9)[consecutive]
    out["period_s"] = float(periods.median()) if len(periods) else None
    out |= _concurrency(con, steps, out["async_speedup_bound"])
    return out


def _concurrency(con, steps: Steps, bound: float | None) -> dict:
    """Achieved overlap from the `overlap` rows (each term's time while another ran anywhere)."""
    rows = summary.rows(con, steps, kinds=("stage", "overlap"), columns=("kind", "phase", "seconds"))
    stage_ns = round(rows.loc[(rows["kind"] == "stage") & rows["phase"].isin(list(TERM_COLUMN)), "seconds"].sum() * 1e9)
    both_sides_ns = round(rows.loc[rows["kind"] == "overlap", "seconds"].sum() * 1e9)
    concurrent_ns = both_sides_ns // 2  # each instant of two terms at once is counted from both sides
    out = {"stage_s": stage_ns / 1e9, "concurrent_s": concurrent_ns / 1e9}
    if stage_ns <= 0:
        return out | {"achieved_speedup": None, "achieved_fraction": None, "overlapping": False}
    achieved = stage_ns / (stage_ns - concurrent_ns) if concurrent_ns else 1.0
    out["achieved_speedup"] = achieved
    out["achieved_fraction"] = (1 - 1 / achieved) / (1 - 1 / bound) if bound and bound > 1 else None
    out["overlapping"] = bool(concurrent_ns >= OVERLAP_SHARE * stage_ns)
    return out


def nested_stages(con, steps: Steps = None) -> pd.DataFrame:
    """Stages that ran inside another stage's span on the same thread (TRL generates and scores
    inside its training step), and what that took out of the outer stage.

    Returns: outer, inner (stages), steps (how many steps it happened in), seconds (median per
    such step of the inner stage's time inside the outer one).
    """
    rows = summary.rows(con, steps, kinds=("nested",))
    if rows.empty:
        return pd.DataFrame(columns=["outer", "inner", "steps", "seconds"])
    g = rows.groupby(["phase", "other"]).agg(steps=("step", "nunique"), seconds=("seconds", "median")).reset_index()
    return g.rename(columns={"phase": "outer", "other": "inner"}).sort_values("seconds", ascending=False, ignore_index=True)


def _num(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def weight_sync_points(con, steps: Steps = None) -> pd.DataFrame:
    """Finished `weight_sync` spans that carry a payload size.

    Returns:
        step, process_id, span_id, bytes (the span's `rl.bytes`), seconds (duration), method
        (`rl.method`, or None).
    """
    rows = summary.rows(con, steps, kinds=("sync",))
    rows = rows[rows["count"].notna()]  # a sync row without bytes: a weight_sync span without `rl.bytes`
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
    """Robust fit of weight-sync time against payload: seconds ≈ bytes / B_W + t_0 (`fit_bandwidth`).

    Returns a dict: n (syncs with a payload size), sizes (distinct payload sizes), regime
    (`bandwidth`: time grows with payload, B_W fitted; `latency`: time does not grow with payload
    over the sizes seen, so t_0 is the median time and B_W is not measurable; None with fewer than
    two sizes), B_W (bytes/s, bandwidth regime only), t_0 (seconds; None when the fit cannot tell
    it from zero), r2 and rmse_s (of the syncs kept, around the line), effective_B_W (bytes / seconds
    of the syncs kept: what a single size can still tell), min_bytes, max_bytes, methods (distinct
    `rl.method` values), kept (syncs the line was fitted to), set_aside (the stalled syncs left
    out of the fit: step, span_id, bytes, seconds, expected_s from the line; slowest first).
    """
    pts = weight_sync_points(con, steps)
    fit = fit_bandwidth(pts["bytes"].to_numpy(float), pts["seconds"].to_numpy(float))
    stalled = pts.iloc[fit.pop("set_aside_index")]
    expected = fit.pop("expected_s")
    fit["set_aside"] = [
        {"step": None if pd.isna(step) else int(step), "span_id": span_id, "bytes": float(nbytes), "seconds": float(sec),
         "expected_s": None if expected is None else float(expected[i])}
        for i, step, span_id, nbytes, sec in zip(stalled.index, stalled["step"], stalled["span_id"], stalled["bytes"],
                                                 stalled["seconds"])]
    fit["set_aside"].sort(key=lambda x: -x["seconds"])
    return fit | {"methods": sorted(m for m in pts["method"].dropna().unique())}


#: Payload explains less than this share of the median sync time across the sizes seen: latency-bound.
SIZE_EFFECT = 0.05
#: A sync slower than the fitted line by this many robust deviations (1.4826 x the median absolute
#: residual) and by at least STALL_SHARE of the time the line expects is a stall: set aside, named.
STALL_DEVIATIONS = 5.0
STALL_SHARE = 0.5
MAX_GROUPS = 200  # more distinct sizes than this: fitted on the medians of this many size bins


def _groups(nbytes: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median size and median time per payload size (per size bin when sizes are many)."""
    sizes = np.unique(nbytes)
    if len(sizes) <= MAX_GROUPS:
        which = np.searchsorted(sizes, nbytes)
    else:
        edges = np.quantile(nbytes, np.linspace(0, 1, MAX_GROUPS + 1)[1:-1])
        which = np.searchsorted(edges, nbytes, side="right")
    xs, ys = [], []
    for g in np.unique(which):
        mine = which == g
        xs.append(float(np.median(nbytes[mine])))
        ys.append(float(np.median(seconds[mine])))
    return np.array(xs), np.array(ys)


def fit_bandwidth(nbytes: np.ndarray, seconds: np.ndarray) -> dict:
    """The fit of `weight_sync_fit` on plain arrays (plus set_aside_index and expected_s arrays).

    Robust throughout: the line is the Theil–Sen fit of the median time per payload size, syncs far
    slower than it are set aside as stalls and the line fitted again on the rest, so a few stalled
    syncs neither bend it nor decide the regime. The regime is decided by how much time the payload
    explains across the sizes seen (slope × size range) against the median time and the residual
    noise, never by the sign of a slope that is zero in theory and a rounding error in practice;
    t_0 is stated only when the intercept stands clear of that noise.
    """
    n = len(nbytes)
    out = {"n": int(n), "sizes": int(len(np.unique(nbytes))), "regime": None, "B_W": None, "t_0": None,
           "r2": None, "rmse_s": None, "min_bytes": float(nbytes.min()) if n else None,
           "max_bytes": float(nbytes.max()) if n else None, "kept": int(n), "set_aside_index": [], "expected_s": None}
    if n:
        slope, intercept = theil_sen(*_groups(nbytes, seconds)) if out["sizes"] >= 2 else (0.0, float(np.median(seconds)))
        expected = np.maximum(intercept + slope * nbytes, 0.0)
        residual = seconds - expected
        scale = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
        stalled = residual > np.maximum(STALL_DEVIATIONS * scale, STALL_SHARE * expected)
        if stalled.any() and not stalled.all():
            out["set_aside_index"], out["expected_s"] = np.flatnonzero(stalled).tolist(), expected
            nbytes, seconds = nbytes[~stalled], seconds[~stalled]
            out["kept"] = int(len(nbytes))
    out["effective_B_W"] = float(nbytes.sum() / seconds.sum()) if n and seconds.sum() > 0 else None
    if n < 2 or len(np.unique(nbytes)) < 2:
        return out
    slope, intercept = theil_sen(*_groups(nbytes, seconds))
    residual = seconds - (intercept + slope * nbytes)
    spread = ((seconds - seconds.mean()) ** 2).sum()
    out["rmse_s"] = float(np.sqrt((residual**2).mean()))
    out["r2"] = float(1.0 - (residual**2).sum() / spread) if spread > 0 else None
    noise = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
    explained = slope * (nbytes.max() - nbytes.min())  # seconds the payload adds across the sizes seen
    if explained > max(SIZE_EFFECT * float(np.median(seconds)), 2 * noise):
        out["regime"], out["B_W"] = "bandwidth", float(1.0 / slope)
        out["t_0"] = float(intercept) if intercept > 2 * noise and intercept > 1e-3 * explained else None
    else:
        out["regime"], out["t_0"] = "latency", float(np.median(seconds))
    return out
