"""What if: the step period, staleness and pool utilisation of another schedule, predicted by
replaying a recorded run's own work.

The analytic bound max(t_R, t_T) + t_W treats each stage as one number. Real steps are not: a
static batch ends with its longest sample (more engines do not shorten it), rollout and train
times vary step to step (a pipeline steps at the mean of their *max*, not the max of their
means), and reward and sync can hide behind the next rollout. So this module replays the work:

- **Calibration** (`calibrate`): per recorded step, each sample's generation time (`gen_end -
  gen_start`; when an engine reports every sample of a batch at the batch's end, the batch time
  shared by response length), the rollout's fixed cost beyond its samples, and the reward, train
  and weight-sync times (own time, `cost_model`); the trainer's untraced time per step when the
  run did not overlap stages.
- **Event model** (`simulate`): N engines each decode their share of a step's samples as one
  static batch (ends with its longest sample); an engine starts the batch of step i when it is
  free and weights of version >= i - K exist (K = 0: synchronous); the trainer scores, trains
  and syncs step i once every share is in. Partial rollouts over-sample and cut each batch when
  its share finished, resuming the rest in the next batch. Colocated: engines and trainer share
  devices and take turns.
- **Bootstrap** (`predict`): each replicate replays the recorded steps drawn with replacement
  (a step keeps its samples and costs together), giving an interval for every figure.

Assumed, since one run at one batch size cannot tell: decode time per token does not depend on
the batch size, and a weight sync costs the trainer what it cost in the recorded run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rltrace.analysis._format import seconds_text
from rltrace.analysis.costs import cost_model, cost_summary
from rltrace.analysis._steps import Steps, step_filter

REPLICATES = 200
MIN_STEPS = 30  # each replay runs at least this many steps (a short run is drawn from again) ...
MAX_STEPS = 200  # ... and at most this many
CALIBRATION_STEPS = 1000  # the most recent steps calibrated on
WORK = 5e7  # sample-steps over all replays: fewer replays of runs with many samples a step
BOUND = 0.9  # the trainer waited for the rollout on this share of steps (or on 1 - this share at most): one binds
PARTIAL_OVERSAMPLE = 1.25  # partial rollouts without a factor: 25 % more samples in flight than kept


@dataclass
class Scenario:
    """A schedule to predict. None: as recorded."""

    staleness: int | None = None  # K; 0 is the synchronous loop
    rollout_workers: int | None = None
    partial: float | None = None  # over-sampling factor of partial rollouts; None: off
    placement: str | None = None  # "colocated" (engines and trainer take turns) or "disaggregated"
    sync_s: float | None = None  # a weight sync's cost there (another placement's transfer); None: as recorded

    def label(self) -> str:
        workers = self.rollout_workers
        parts = ["sync" if self.staleness == 0 else f"async K={self.staleness}" if self.staleness else None,
                 f"{workers} worker{'s' if workers > 1 else ''}" if workers else None,
                 f"partial x{self.partial:g}" if self.partial else None,
                 "colocated" if self.placement == "colocated" else None,
                 f"weight sync {seconds_text(self.sync_s)}" if self.sync_s is not None else None]
        return ", ".join(p for p in parts if p) or "as recorded"


@dataclass
class Calibration:
    """What the event model replays, one entry per recorded step (arrays aligned by position)."""

    steps: np.ndarray
    works: np.ndarray  # steps × samples: each sample's generation time (s; NaN padding), or the rollout as one
    overhead: np.ndarray  # rollout time beyond its samples' generation, per batch
    reward: np.ndarray
    train: np.ndarray
    sync: np.ndarray
    extra: np.ndarray  # the trainer's untraced time per step (0 when stages overlapped)
    period: np.ndarray  # recorded time between consecutive step ends (NaN for the first)
    workers: int  # engines recorded (distinct worker_rank; 1 when not recorded)
    staleness: int  # K recorded (max sample staleness; 0 when not recorded or negative: a version mix-up)
    per_sample: bool  # per-sample generation times were recorded
    terms: dict = field(default_factory=dict)  # t_R, t_T, t_W: the cost model's medians, for the analytic bound
    notes: list[str] = field(default_factory=list)


def calibrate(con, steps: Steps = None, *, per_step: pd.DataFrame | None = None,
              summary: dict | None = None) -> Calibration:
    """The recorded run's work, per step: the last `CALIBRATION_STEPS` steps of the range with a
    rollout or train span (what the run does now). `per_step`, `summary`: `cost_model()` and
    `cost_summary()` of the same steps, when the caller has them."""
    costs = (cost_model(con, steps) if per_step is None else per_step).set_index("step")
    costs = costs[costs["t_T"].notna() | costs["t_R"].notna()]
    notes = []
    if len(costs) > CALIBRATION_STEPS:
        notes.append(f"calibrated on the last {CALIBRATION_STEPS} of {len(costs)} steps")
        costs = costs.iloc[-CALIBRATION_STEPS:]
    if len(costs) and steps is None:
        steps = (int(costs.index[0]), int(costs.index[-1]))
    per = _sample_frame(con, steps)
    per = per[per["step"].isin(costs.index)]
    ends = _step_ends(con, steps).reindex(costs.index)
    period = ends.diff().where(pd.Series(costs.index, index=costs.index).diff() == 1).to_numpy(float)
    zero = lambda col: costs[col].fillna(0.0).to_numpy(float)  # noqa: E731 - absent is no cost to replay
    works, overhead = [], []
    groups = dict(tuple(per.groupby("step"))) if len(per) else {}
    for step, rollout in zip(costs.index, zero("t_rollout")):
        s = groups.get(step)
        if s is None or s.empty:
            works.append(np.array([rollout]))
            overhead.append(0.0)
            continue
        works.append(s["work"].to_numpy(float))
        overhead.append(max(0.0, rollout - _batch_time(s)))
    per_sample = bool(groups)
    if len(per) and per["carried"].any():
        notes.append(f"{int(per['carried'].sum())} samples were carried over from one batch to the next (partial "
                     "rollouts): each counts only its time in the batch that finished it, so a replay without partial "
                     "rollouts misses the work done before")
    if not per_sample:
        notes.append("no per-sample generation times (gen_start, gen_end): each rollout replays as one piece, "
                     "so more rollout workers and partial rollouts cannot change it")
    summary = summary or cost_summary(con, steps, per_step=costs.reset_index())
    overlapped = bool(summary.get("overlapping"))
    stage = zero("t_R") + zero("t_T") + zero("t_W")
    extra = np.zeros(len(costs)) if overlapped else np.clip(np.nan_to_num(period - stage, nan=0.0), 0.0, None)
    workers = int(per.groupby("step")["worker_rank"].nunique().max()) if len(per) and per["worker_rank"].notna().any() else 1
    stale = per.loc[~per["carried"], "staleness"].max() if len(per) else np.nan  # a carried sample's age is not K
    return Calibration(
        steps=costs.index.to_numpy(), works=_padded(works), overhead=np.array(overhead),
        reward=zero("t_reward"), train=zero("t_T"), sync=zero("t_W"), extra=extra, period=period,
        workers=max(1, workers), staleness=0 if stale != stale else max(0, int(stale)), per_sample=per_sample,
        terms={k: summary.get(k) or 0.0 for k in ("t_R", "t_T", "t_W")}, notes=notes)


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    out = np.full((len(rows), max((len(r) for r in rows), default=1)), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _sample_frame(con, steps: Steps) -> pd.DataFrame:
    """The samples a step waited for (as `long_tail.samples`), with `work` (generation seconds),
    `worker_rank` and `staleness` (NaN where the run has no such column)."""
    have = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()}
    where, params = step_filter(steps)
    kept = "in_batch IS NOT false" if "in_batch" in have else "true"
    cols = ["step", "gen_start", "gen_end"] + [c if c in have else f"NULL AS {c}"
                                                for c in ("response_len", "worker_rank", "staleness")]
    s = con.execute(f"SELECT {', '.join(cols)} FROM samples WHERE gen_start IS NOT NULL AND gen_end IS NOT NULL "
                    f"AND {kept} AND {where}", params).df()
    s = s.astype({c: float for c in ("gen_start", "gen_end", "response_len", "worker_rank", "staleness")})
    s["work"] = (s["gen_end"] - s["gen_start"]).clip(lower=0.0)
    return _carried_over(_share_batch_time(s))


def _carried_over(s: pd.DataFrame) -> pd.DataFrame:
    """Samples an engine started before its previous step's static batch ended (partial rollouts
    carry them over): only their time in this step's batch, from its first fresh sample's start, is
    work here (`carried` marks them). Needs worker_rank, and a batch whose fresh samples started
    together; otherwise no sample is taken for carried."""
    s["carried"] = False
    if s.empty or s["worker_rank"].isna().all():
        return s
    key = s["worker_rank"].fillna(-1)
    last = s.groupby([key, s["step"]])["gen_end"].max().rename("prev_end").reset_index()
    last["step"] = last["step"] + 1  # each engine's previous step's end, on the next step's rows
    last = last.rename(columns={"worker_rank": "_w"})
    prev = s.assign(_w=key).merge(last, on=["_w", "step"], how="left")["prev_end"].to_numpy()
    # a static batch starts its fresh samples together; an engine that starts requests one by one
    # (continuous batching) overlaps steps without carrying anything over
    together = s.groupby([key, s["step"], s["gen_start"]])["gen_start"].transform("size").groupby(
        [key, s["step"]]).transform("max") >= 2
    carried = (s["gen_start"].to_numpy() < prev - 1e-6) & together.to_numpy()
    if not carried.any():
        return s
    s["carried"] = carried
    fresh_start = s["gen_start"].where(~s["carried"]).groupby([key, s["step"]]).transform("min")
    start = fresh_start.fillna(pd.Series(prev, index=s.index))
    s.loc[s["carried"], "work"] = (s["gen_end"] - start)[s["carried"]].clip(lower=0.0)
    return s


def _share_batch_time(s: pd.DataFrame) -> pd.DataFrame:
    """An engine that reports every sample of a batch at the batch's end (same start, same end) hides
    how long each took: the batch time is shared out by response length (the longest took all of it)."""
    if s.empty or s["response_len"].isna().all():
        return s
    keys = [s["step"], s["worker_rank"].fillna(-1), s["gen_start"]]
    g = s.groupby(keys)
    same_end = g["gen_end"].transform("nunique") == 1
    longest = g["response_len"].transform("max")
    shared = same_end & (g["response_len"].transform("nunique") > 1) & (longest > 0)
    s.loc[shared, "work"] = s.loc[shared, "work"] * s.loc[shared, "response_len"] / longest[shared]
    return s


def _batch_time(s: pd.DataFrame) -> float:
    """How long a recorded step's engines were generating: first sample start to last sample end."""
    return float(s["gen_end"].max() - s["gen_start"].min())


def _step_ends(con, steps: Steps) -> pd.Series:
    from rltrace.analysis import summary

    c = summary.checks(con, steps)
    return pd.Series(c["end_ns"].to_numpy(float) / 1e9, index=c["step"].to_numpy())


def resolve(cal: Calibration, scenario: Scenario) -> Scenario:
    """The scenario with every knob set (as recorded where left None)."""
    return Scenario(
        staleness=cal.staleness if scenario.staleness is None else scenario.staleness,
        rollout_workers=cal.workers if scenario.rollout_workers is None else scenario.rollout_workers,
        partial=scenario.partial, placement=scenario.placement or "disaggregated", sync_s=scenario.sync_s)


def simulate(cal: Calibration, scenario: Scenario, order: np.ndarray, rng: np.random.Generator) -> dict:
    """Replays of the recorded steps under a resolved scenario, one per row of `order` (R replays
    × n steps, indices into `cal`), all at once (each array below has one row per replay).

    Returns: ends (R × n: each step's end on the trainer, s); age_sum, age_n, age_max (staleness
    of the trained samples); rollout_busy (engine-seconds generating), trainer_busy (s);
    rollout_s (R × n: the batch time of the step's slowest engine); tail_s (R × n: how much of
    it came after the median sample); waited (R × n: 1 where the trainer waited for the rollout)."""
    k, n, colocated = scenario.staleness, scenario.rollout_workers, scenario.placement == "colocated"
    reps, steps = order.shape
    free = np.zeros((reps, n))  # when each engine is free
    ready = np.full((reps, steps + 1), np.inf)  # ready[:, v]: when weights of version v reach the engines
    ready[:, 0] = 0.0
    trainer = np.zeros(reps)
    out = {key: np.zeros((reps, steps)) for key in ("ends", "rollout_s", "tail_s", "waited")}
    out |= {key: np.zeros(reps) for key in ("age_sum", "age_n", "age_max", "rollout_busy", "trainer_busy")}
    counts = np.isfinite(cal.works).sum(axis=1)
    medians = cal.overhead + np.nanmedian(np.where(counts[:, None] > 0, cal.works, 0.0), axis=1)
    carry = _Carry(reps, n, cal, scenario.partial) if scenario.partial and cal.per_sample else None
    syncs = cal.sync if scenario.sync_s is None else np.full(len(cal.sync), float(scenario.sync_s))
    for i in range(steps):
        j = order[:, i]
        start = np.maximum(free, ready[:, max(0, i - k)][:, None])
        if colocated:
            start = np.maximum(start, trainer[:, None])
        version = (ready[:, None, : i + 1] <= start[:, :, None]).sum(axis=2) - 1
        took, ages_of, kept = carry.batch(j, version, rng) if carry else _static(cal.works[j], n, rng, version)
        took = np.where(kept > 0, took + cal.overhead[j][:, None], 0.0)
        free = start + took
        out["rollout_busy"] += took.sum(axis=1)
        ages = i - ages_of  # R × n × slots (NaN where no sample)
        out["age_sum"] += np.nansum(ages, axis=(1, 2))
        out["age_n"] += np.isfinite(ages).sum(axis=(1, 2))
        out["age_max"] = np.fmax(out["age_max"], np.nanmax(np.where(np.isfinite(ages), ages, -np.inf), axis=(1, 2)))
        out["rollout_s"][:, i] = took.max(axis=1)
        out["tail_s"][:, i] = np.maximum(0.0, took.max(axis=1) - medians[j])
        work = cal.reward[j] + cal.train[j] + cal.extra[j]
        out["waited"][:, i] = free.max(axis=1) > trainer  # the trainer waited for this step's rollout
        ready[:, i + 1] = np.maximum(trainer, free.max(axis=1)) + work + syncs[j]
        trainer = ready[:, i + 1]
        out["trainer_busy"] += work + syncs[j]
        out["ends"][:, i] = trainer
        if colocated:
            free = np.maximum(free, trainer[:, None])
    return out


def _static(works: np.ndarray, n: int, rng: np.random.Generator, version: np.ndarray):
    """Each replay's step samples (R × M, NaN padding) dealt out at random to n engines (as even as
    can be), each engine's share one static batch that ends with its longest sample. Returns
    (R × n batch times, R × n × 1 weight versions, R × n sample counts); a rollout recorded as
    one piece goes to engine 0 whole."""
    reps, m = works.shape
    if n == 1:  # one engine: the whole step is its batch
        kept = np.isfinite(works).sum(axis=1, keepdims=True)
        took = np.nanmax(np.where(np.isfinite(works), works, -np.inf), axis=1, keepdims=True)
        return np.where(kept > 0, took, 0.0), np.where(np.isfinite(works), version, np.nan)[:, None, :], kept
    keys = np.where(np.isfinite(works), rng.random(works.shape), np.inf)
    dealt = np.take_along_axis(works, np.argsort(keys, axis=1), axis=1)  # samples first, padding last
    width = -(-m // n) * n
    dealt = np.pad(dealt, ((0, 0), (0, width - m)), constant_values=np.nan).reshape(reps, width // n, n)
    kept = np.isfinite(dealt).sum(axis=1)
    took = np.nanmax(np.where(np.isfinite(dealt), dealt, -np.inf), axis=1)
    versions = np.where(kept > 0, version, np.nan)[:, :, None]  # every sample of a share: its engine's version
    return np.where(kept > 0, took, 0.0), np.where(np.isfinite(dealt.transpose(0, 2, 1)), versions, np.nan), kept


class _Carry:
    """Partial rollouts: each engine keeps `slots` = ceil(share × factor) samples in flight; a batch
    ends when `share` of them finished, and the rest carry on, with the work they have left and the
    weight version they started under, into the engine's next batch."""

    def __init__(self, reps: int, n: int, cal: Calibration, factor: float):
        counts = np.isfinite(cal.works).sum(axis=1)
        self.share = max(1, int(math.ceil(np.median(counts) / n)))
        self.slots = max(self.share, math.ceil(self.share * factor))
        self.left = np.full((reps, n, self.slots), np.nan)
        self.version = np.full((reps, n, self.slots), np.nan)
        self.cal, self.counts = cal, counts

    def batch(self, j: np.ndarray, version: np.ndarray, rng: np.random.Generator):
        empty = np.isnan(self.left)
        pick = (rng.random(self.left.shape) * self.counts[j][:, None, None]).astype(int)
        fresh = np.take_along_axis(self.cal.works[j], pick.reshape(len(j), -1), axis=1).reshape(self.left.shape)
        self.left = np.where(empty, fresh, self.left)
        self.version = np.where(empty, version[:, :, None], self.version)
        cut = np.partition(self.left, self.share - 1, axis=2)[:, :, self.share - 1]
        done = self.left <= cut[:, :, None]
        ages_of = np.where(done, self.version, np.nan)
        self.left = np.where(done, np.nan, self.left - cut[:, :, None])
        return cut, ages_of, done.sum(axis=2)


def predict(cal: Calibration, scenario: Scenario, *, replicates: int = REPLICATES, seed: int = 0) -> dict:
    """The scenario's figures over bootstrap replays of the recorded steps.

    Returns a dict: scenario (a label of every knob), staleness, rollout_workers, partial, placement, sync_s (resolved);
    predicted_step_s (median over replays of each replay's median step period), interval_s ([5 %,
    95 %] of it), staleness_mean, staleness_max (of trained samples, median over replays),
    rollout_util, trainer_util (share of the time each pool was busy), tail_share (share of the
    rollout spent after the median sample finished), trainer_waited_share (share of steps on which
    the trainer waited for the rollout), binding (which constraint sets the period),
    why (a sentence), notes.
    """
    sc = resolve(cal, scenario)
    rng = np.random.default_rng(seed)
    n = min(max(len(cal.steps), MIN_STEPS), MAX_STEPS)
    replicates = max(20, min(replicates, int(WORK / (n * cal.works.shape[1]))))
    out = simulate(cal, sc, rng.integers(0, len(cal.steps), (replicates, n)), rng)
    warm = min(n - 2, sc.staleness + 2)  # the pipeline fills over the first steps
    period = np.median(np.diff(out["ends"], axis=1)[:, warm:], axis=1)
    span = out["ends"][:, -1]
    row = {"scenario": sc.label(), "staleness": sc.staleness, "rollout_workers": sc.rollout_workers,
           "partial": sc.partial, "placement": sc.placement, "sync_s": sc.sync_s,
           "predicted_step_s": float(np.median(period)),
           "interval_s": [float(np.quantile(period, 0.05)), float(np.quantile(period, 0.95))],
           "staleness_mean": float(np.median(out["age_sum"] / np.maximum(out["age_n"], 1))),
           "staleness_max": int(round(float(np.median(out["age_max"])))),
           "rollout_util": float(np.median(out["rollout_busy"] / (span * sc.rollout_workers))),
           "trainer_util": float(np.median(out["trainer_busy"] / span)),
           "tail_share": float(np.median(out["tail_s"].sum(axis=1) / np.maximum(out["rollout_s"].sum(axis=1), 1e-12))),
           "trainer_waited_share": float(np.median(out["waited"][:, warm:].mean(axis=1)))}
    return row | _binding(cal, sc, row) | {"notes": list(cal.notes)}


def _binding(cal: Calibration, sc: Scenario, row: dict) -> dict:
    """Which constraint sets the period, named by the cost model's terms, and why: what the trainer
    waited for step by step (a few slow steps do not decide it, as they would a mean)."""
    tail = ("partial rollouts end each batch when its share of samples is in" if sc.partial else
            f"the longest sample of each batch: {row['tail_share']:.0%} of the rollout comes after the median sample")
    if sc.staleness == 0 or sc.placement == "colocated":
        why = ("colocated: rollout and training take turns on the same devices, so the step is their sum"
               if sc.placement == "colocated" else "synchronous: each step is rollout + reward + train + sync in turn")
        return {"binding": "t_sync", "why": f"{why}; in the rollout, {tail}"}
    waited = row["trainer_waited_share"]
    if waited <= 1 - BOUND:
        return {"binding": "t_T + t_W", "why": f"the trainer waits for the rollout on {waited:.0%} of steps: reward, "
                "train and weight sync in turn set the step, and more rollout workers or a larger staleness bound "
                "cannot help"}
    if waited >= BOUND:
        return {"binding": "t_R", "why": f"the trainer waits for the rollout on {waited:.0%} of steps; {tail}"}
    return {"binding": "t_R vs t_T", "why": (
        f"the trainer waits for the rollout on {waited:.0%} of steps: rollout and train times vary step to step "
        f"and each waits for the other; in the rollout, {tail}")}


def whatif(con, scenarios: list[Scenario], steps: Steps = None, *, replicates: int = REPLICATES,
           per_step: pd.DataFrame | None = None, summary: dict | None = None) -> pd.DataFrame:
    """Per scenario, `predict`'s figures, after a row for the recorded run replayed as recorded
    (`recorded_step_s`: its own median step period, to judge the replay by).

    Returns one row per scenario with the columns of `predict` (scenario: "as recorded", or the knobs
    asked; schedule: every knob, as resolved) and recorded_step_s, analytic_s
    (max(t_R, t_T) + t_W for an async scenario, t_sync for a synchronous one, from the medians).
    `per_step`, `summary`: `cost_model()` and `cost_summary()` of the same steps, when the caller has them.
    """
    return table(calibrate(con, steps, per_step=per_step, summary=summary), scenarios, replicates=replicates)


def _analytic(cal: Calibration, sc: Scenario) -> float:
    """The cost model's formula for the scenario: t_sync = t_R + t_T + t_W for a synchronous or
    colocated one, max(t_R, t_T) + t_W for an async one (t_W: the scenario's sync cost if given)."""
    r, t = cal.terms.get("t_R", 0.0), cal.terms.get("t_T", 0.0)
    w = cal.terms.get("t_W", 0.0) if sc.sync_s is None else sc.sync_s
    return r + t + w if sc.staleness == 0 or sc.placement == "colocated" else max(r, t) + w


def table(cal: Calibration, scenarios: list[Scenario], *, replicates: int = REPLICATES) -> pd.DataFrame:
    """`whatif` on a calibration already made (the dashboard keeps one per run and step range)."""
    if not len(cal.steps):
        return pd.DataFrame()
    recorded = float(np.nanmedian(cal.period)) if np.isfinite(cal.period).any() else None
    rows = []
    for i, sc in enumerate([Scenario()] + list(scenarios)):
        row = predict(cal, sc, replicates=replicates)
        row["schedule"] = row["scenario"]  # every knob, as resolved
        row["scenario"] = "as recorded" if i == 0 else sc.label()
        row["analytic_s"] = _analytic(cal, resolve(cal, sc))
        row["recorded_step_s"] = recorded
        rows.append(row)
    return pd.DataFrame(rows)
