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
  run did not overlap stages. A sample whose engine request (the request span with the sample's
  id) spent time in the engine's queue is timed from when the engine began serving it; an engine
  that served fewer requests at once than a step sent it batched continuously with a cap
  (`Calibration.cap`, the most it ever served at once).
- **Continuous batching** (a recorded cap): each engine runs at most `cap` of its share at once,
  a waiting request taking the first slot that frees; its batch ends with its last request.
- **Event model** (`simulate`): N engines each decode their share of a step's samples as one
  static batch (ends with its longest sample); an engine starts the batch of step i when it is
  free and weights of version >= i - K exist (K = 0: synchronous); the trainer scores, trains
  and syncs step i once every share is in. Partial rollouts over-sample and cut each batch when
  its share finished, resuming the rest in the next batch. Colocated: engines and trainer share
  devices and take turns.
- **Bootstrap** (`predict`): each replicate replays the recorded steps drawn with replacement
  (a step keeps its samples and costs together), giving an interval for every figure.
- **Prefill/decode split** (`Scenario.pd`): from the engine request spans, each request's prefill
  and decode time and its prompt's KV bytes (prompt tokens × the model config's bytes per token,
  as the serving section counts them). P prefill engines prefill a step's prompts one after
  another each (μ_P = 1 / prefill time); each prompt's KV then crosses one link of B_KV bytes/s,
  first come first served; a decode engine decodes each request from the moment its KV arrived.
  The request that finished last says which of the three held the step.

Assumed, since one run at one batch size cannot tell: decode time per token does not depend on
the batch size (so a decode engine holds every request it is sent at once, and the number of
decode engines does not change the step, unless the run recorded a cap: then each decode engine
runs at most that many at once, first come first served), and a weight sync costs the trainer
what it cost in the recorded run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rltrace._config import RltraceError
from rltrace.analysis._format import rate_text, seconds_text, size_text
from rltrace.analysis.costs import cost_model, cost_summary
from rltrace.analysis._steps import Steps, step_filter

REPLICATES = 200
MIN_STEPS = 30  # each replay runs at least this many steps (a short run is drawn from again) ...
MAX_STEPS = 200  # ... and at most this many
CALIBRATION_STEPS = 1000  # the most recent steps calibrated on
WORK = 5e7  # sample-steps over all replays: fewer replays of runs with many samples a step
BOUND = 0.9  # the trainer waited for the rollout on this share of steps (or on 1 - this share at most): one binds
PARTIAL_OVERSAMPLE = 1.25  # partial rollouts without a factor: 25 % more samples in flight than kept
PD_TERMS = ("prefill", "KV link", "decode")  # what can hold a split step (`_split`)


class Refused(RltraceError):
    """A scenario this run cannot predict; the message says what is missing."""


@dataclass
class Scenario:
    """A schedule to predict. None: as recorded."""

    staleness: int | None = None  # K; 0 is the synchronous loop
    rollout_workers: int | None = None
    partial: float | None = None  # over-sampling factor of partial rollouts; None: off
    placement: str | None = None  # "colocated" (engines and trainer take turns) or "disaggregated"
    sync_s: float | None = None  # a weight sync's cost there (another placement's transfer); None: as recorded
    pd: tuple[int, int] | None = None  # (prefill engines, decode engines); None: unified engines
    kv_bandwidth: float | None = None  # the KV link's bytes/s under `pd`; None: the run's (given or measured)

    def label(self) -> str:
        workers = self.rollout_workers
        parts = ["sync" if self.staleness == 0 else f"async K={self.staleness}" if self.staleness else None,
                 f"{workers} worker{'s' if workers > 1 else ''}" if workers and not self.pd else None,
                 f"prefill/decode {self.pd[0]}:{self.pd[1]}" if self.pd else None,
                 f"KV link {rate_text(self.kv_bandwidth)}" if self.pd and self.kv_bandwidth else None,
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
    terms: dict = field(default_factory=dict)  # t_R, t_T, t_W, t_rollout: the cost model's medians, for the analytic bound
    notes: list[str] = field(default_factory=list)
    requests: dict | None = None  # prefill, decode (s), kv_bytes: steps × requests (NaN padding), from the engine spans
    requests_missing: str | None = None  # why `requests` is None: a split cannot be predicted
    kv_bandwidth: float | None = None  # B_KV given (--kv-bandwidth) or measured from KV transfers
    cap: int | None = None  # continuous batching: the most requests an engine ran at once (None: static batches)


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
    per = per[per["step"].isin(costs.index)].copy()
    cap = _cap(per, notes)
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
    requests, requests_missing, bandwidth = _requests(con, steps, costs.index, notes)
    return Calibration(
        steps=costs.index.to_numpy(), works=_padded(works), overhead=np.array(overhead),
        reward=zero("t_reward"), train=zero("t_T"), sync=zero("t_W"), extra=extra, period=period,
        workers=max(1, workers), staleness=0 if stale != stale else max(0, int(stale)), per_sample=per_sample,
        terms={k: summary.get(k) or 0.0 for k in ("t_R", "t_T", "t_W", "t_rollout")}, notes=notes,
        requests=requests, requests_missing=requests_missing, kv_bandwidth=bandwidth, cap=cap)


def _requests(con, steps: Steps, index: pd.Index, notes: list[str]) -> tuple[dict | None, str | None, float | None]:
    """(per step: each request's prefill and decode time and KV bytes, why there are none, B_KV):
    what a prefill/decode split replays. A request served by a prefill and a decode engine is one
    request (its id joins them); a request missing a time or its prompt tokens is left out, counted."""
    from rltrace.analysis import serving
    from rltrace.analysis.engine_requests import engine_requests

    r = engine_requests(con, steps, columns=("step", "request_id", "span_id", "engine_kind", "prefill_s", "decode_s",
                                             "prompt_tokens"))
    bandwidth, _ = serving.kv_link_bandwidth(con, serving._options(con).get("kv_bandwidth"))
    if r.empty:
        return None, ("no engine request spans (vLLM's or SGLang's through rltrace collect, or slime's): a split "
                      "replays each request's prefill and decode time"), bandwidth
    geo, _, why = serving.model_geometry(con, r["engine_kind"].dropna().unique())
    if geo is None:
        return None, ("no KV bytes per request: no model config (give --model PATH, the model's config.json, or "
                      "rltrace.init(model=...))"), bandwidth
    if why:
        return None, f"no KV bytes per request: {why}", bandwidth
    r = r[r["step"].notna()]
    key = [r["step"], r["request_id"].fillna(r["span_id"])]
    one = r.groupby(key)[["prefill_s", "decode_s", "prompt_tokens"]].max().reset_index()
    whole = one[["prefill_s", "decode_s", "prompt_tokens"]].notna().all(axis=1)
    if not whole.any():
        return None, "no engine request records its prefill time, decode time and prompt tokens", bandwidth
    if (~whole).any():
        notes.append(f"{int((~whole).sum())} of {len(one)} engine requests lack a prefill time, decode time or prompt "
                     "tokens: a split replays the others")
    one = one[whole]
    one["kv_bytes"] = one["prompt_tokens"].astype(float) * geo["c_A"] + (geo["c_R"] or 0)
    groups = dict(tuple(one.groupby("step")))
    out = {}
    for col in ("prefill_s", "decode_s", "kv_bytes"):
        out[col] = _padded([groups[k][col].to_numpy(float) if k in groups else np.zeros(0) for k in index])
    return out, None, bandwidth


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
    cols.append("sample_id::VARCHAR AS sample_id" if "sample_id" in have else "NULL::VARCHAR AS sample_id")
    s = con.execute(f"SELECT {', '.join(cols)} FROM samples WHERE gen_start IS NOT NULL AND gen_end IS NOT NULL "
                    f"AND {kept} AND {where}", params).df()
    s = s.astype({c: float for c in ("gen_start", "gen_end", "response_len", "worker_rank", "staleness")})
    s["work"] = (s["gen_end"] - s["gen_start"]).clip(lower=0.0)
    s = _carried_over(_share_batch_time(s))
    return _queued(con, steps, s)


def _queued(con, steps: Steps, s: pd.DataFrame) -> pd.DataFrame:
    """Each sample's `began`: when its engine may have started serving it. A sample whose engine
    request (the request span whose request id is the sample's id, in the same step) records time in
    the engine's queue began that long after `gen_start`; otherwise at `gen_start`. Only an engine
    recognised as batching continuously (`_cap`) has its samples' work counted from then."""
    s["began"] = s["gen_start"]
    if s.empty or s["sample_id"].isna().all():
        return s
    from rltrace.analysis.engine_requests import engine_requests

    r = engine_requests(con, steps, columns=("step", "request_id", "queue_s"))
    r = r[r["step"].notna() & r["request_id"].notna() & r["queue_s"].notna()]
    if r.empty:
        return s
    q = (pd.DataFrame({"step": r["step"].astype(float), "sample_id": r["request_id"].astype(str),
                       "queue_s": r["queue_s"].astype(float).clip(lower=0.0)})
         .groupby(["step", "sample_id"], as_index=False)["queue_s"].max())
    queued = pd.Series(s[["step", "sample_id"]].merge(q, how="left", on=["step", "sample_id"])["queue_s"].to_numpy(float),
                       index=s.index)
    has = queued.notna() & ~s["carried"]
    s.loc[has, "began"] = np.minimum(s["gen_start"] + queued, s["gen_end"])[has]
    return s


TOUCH_S = 1e-3  # a request that starts within this (or 2 % of the median sample) of another's end took its slot


def _cap(s: pd.DataFrame, notes: list[str]) -> int | None:
    """Continuous batching with a cap, recognised from the recorded samples (each served from `began`
    to `gen_end`): per engine and step, the most requests served at once. An engine's step that had
    more requests than that, where every request that ended while others had yet to start was
    followed at once by a start (no slot stayed free while a request waited: not static batches one
    after another), queued for a slot. When most such engine steps did, the cap is the most requests
    any engine served at once, and each sample's work is counted from `began` (its queue time out);
    None otherwise (a static batch, continuous batching that never queued, or engines not recorded)."""
    if s.empty or s["worker_rank"].isna().all():
        return None
    keys = ["step", "worker_rank"]
    x = s[s["worker_rank"].notna()]
    tol = max(TOUCH_S, 0.02 * float(np.median(x["gen_end"] - x["began"])))
    events = pd.concat([x[keys].assign(t=x["began"], d=1), x[keys].assign(t=x["gen_end"] - tol, d=-1)])
    events = events.sort_values([*keys, "t", "d"], kind="stable")
    most = events.groupby(keys)["d"].cumsum().groupby([events[k] for k in keys]).max()
    count = x.groupby(keys).size()
    split = count > most  # requests of this engine's step did not all run at once
    if not split.any():
        return None
    # every end before the group's last start must meet a start (a freed slot taken at once)
    last = x.groupby(keys)["began"].transform("max")
    ends = x.loc[x["gen_end"] < last - tol, [*keys, "gen_end"]].rename(columns={"gen_end": "t"}).sort_values("t")
    starts = x[[*keys, "began"]].rename(columns={"began": "t"}).assign(met=True).sort_values("t")
    met = pd.merge_asof(ends, starts, on="t", by=keys, direction="nearest", tolerance=tol)["met"].notna()
    idle = met.groupby([ends[k].to_numpy() for k in keys]).all() if len(ends) else pd.Series(dtype=bool)
    conserving = pd.Series(True, index=count.index)
    conserving.loc[idle.index[~idle.to_numpy()]] = False
    queued = split & conserving
    if queued.sum() * 2 < split.sum():
        return None
    cap = int(most.max())
    s["work"] = (s["gen_end"] - s["began"]).where(~s["carried"], s["work"]).clip(lower=0.0)
    notes.append(f"continuous batching: each engine ran at most {cap} requests at once and the rest waited for a slot "
                 f"({int(queued.sum())} of {len(count)} engine batches queued); replayed with that cap")
    return cap


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
        rollout_workers=1 if scenario.pd else cal.workers if scenario.rollout_workers is None else scenario.rollout_workers,
        partial=scenario.partial, placement=scenario.placement or "disaggregated", sync_s=scenario.sync_s,
        pd=scenario.pd, kv_bandwidth=scenario.kv_bandwidth or (cal.kv_bandwidth if scenario.pd else None))


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
    out["pd_parts"] = np.zeros((reps, len(PD_TERMS)))
    for i in range(steps):
        j = order[:, i]
        start = np.maximum(free, ready[:, max(0, i - k)][:, None])
        if colocated:
            start = np.maximum(start, trainer[:, None])
        version = (ready[:, None, : i + 1] <= start[:, :, None]).sum(axis=2) - 1
        if scenario.pd:
            took, ages_of, kept, parts = _split(cal, j, scenario, rng, version)
            out["pd_parts"] += parts
        else:
            took, ages_of, kept = carry.batch(j, version, rng) if carry else _static(cal.works[j], n, rng, version, cal.cap)
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


def _static(works: np.ndarray, n: int, rng: np.random.Generator, version: np.ndarray, cap: int | None = None):
    """Each replay's step samples (R × M, NaN padding) dealt out at random to n engines (as even as
    can be), each engine's share one static batch that ends with its longest sample; with a `cap`
    (continuous batching), an engine runs at most `cap` of its share at once, in the order dealt,
    each waiting one taking the first slot that frees, and its batch ends when its last request
    does. Returns (R × n batch times, R × n × M/n weight versions, R × n sample counts); a rollout
    recorded as one piece goes to engine 0 whole."""
    reps, m = works.shape
    if cap and cap < -(-int(np.isfinite(works).sum(axis=1).max(initial=0)) // n):
        return _capped(works, n, rng, version, cap)
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


def _capped(works: np.ndarray, n: int, rng: np.random.Generator, version: np.ndarray, cap: int):
    """`_static` with a cap: list scheduling of each engine's share on `cap` slots."""
    reps, m = works.shape
    keys = np.where(np.isfinite(works), rng.random(works.shape), np.inf)
    dealt = np.take_along_axis(works, np.argsort(keys, axis=1), axis=1)  # samples first, padding last
    width = -(-m // n) * n
    dealt = np.pad(dealt, ((0, 0), (0, width - m)), constant_values=np.nan).reshape(reps, width // n, n)
    slots = np.zeros((reps, n, cap))  # when each slot of each engine frees
    for p in range(width // n):  # engine e's p-th request takes its earliest free slot
        w = dealt[:, p, :]
        first = np.argmin(slots, axis=2)[:, :, None]
        freed = np.take_along_axis(slots, first, axis=2)[:, :, 0]
        np.put_along_axis(slots, first, np.where(np.isfinite(w), freed + w, freed)[:, :, None], axis=2)
    kept = np.isfinite(dealt).sum(axis=1)
    versions = np.where(kept > 0, version, np.nan)[:, :, None]
    return slots.max(axis=2), np.where(np.isfinite(dealt.transpose(0, 2, 1)), versions, np.nan), kept


def _split(cal: Calibration, j: np.ndarray, sc: Scenario, rng: np.random.Generator, version: np.ndarray):
    """A step's requests through P prefill engines, one KV link and the decode engines (the module
    doc), as one static batch: (R × 1 batch time, R × 1 × samples weight versions, R × 1 sample
    counts, R × 3 how long the request that finished last spent in prefill, on the link, decoding).
    A step without requests takes its recorded batch time."""
    req = cal.requests
    pre, dec, kv = req["prefill_s"][j], req["decode_s"][j], req["kv_bytes"][j] / _bandwidth(cal, sc)
    reps, m = pre.shape
    n_p = sc.pd[0]
    order = np.argsort(np.where(np.isfinite(pre), rng.random(pre.shape), np.inf), axis=1)  # dealt at random
    width = -(-m // n_p) * n_p
    pre, dec, kv = (np.pad(np.take_along_axis(a, order, axis=1), ((0, 0), (0, width - m)), constant_values=np.nan)
                    for a in (pre, dec, kv))
    # engine k prefills dealt positions k, k + P, ... one after another
    filled = np.cumsum(np.nan_to_num(pre).reshape(reps, width // n_p, n_p), axis=1).reshape(reps, width)
    filled = np.where(np.isfinite(pre), filled, np.inf)
    by = np.argsort(filled, axis=1, kind="stable")  # the link takes them as their prefill ends
    filled, dec, kv = (np.take_along_axis(a, by, axis=1) for a in (filled, dec, kv))
    kv = np.nan_to_num(kv)
    sent = np.cumsum(kv, axis=1)  # a_k = max(a_(k-1), e_k) + t_k, unrolled: C_k + max over j <= k of (e_j - C_(j-1))
    arrived = sent + np.maximum.accumulate(filled - (sent - kv), axis=1)
    ended = np.where(np.isfinite(filled), arrived + dec, -np.inf)
    if cal.cap:  # the run's engines ran at most `cap` requests at once: so does each decode engine
        ended = _decode_capped(arrived, dec, sc.pd[1], cal.cap)
    last = np.argmax(ended, axis=1)[:, None]
    took = np.take_along_axis(ended, last, axis=1)[:, 0]
    at = lambda a: np.take_along_axis(a, last, axis=1)[:, 0]  # noqa: E731 - the last request's
    parts = np.stack([at(filled), at(arrived) - at(filled), at(ended) - at(arrived)], axis=1)
    recorded = np.nanmax(np.where(np.isfinite(cal.works[j]), cal.works[j], -np.inf), axis=1)
    has = np.isfinite(took)
    took = np.where(has, took, np.maximum(recorded, 0.0))
    parts = np.where(has[:, None], parts, 0.0)
    kept = np.isfinite(cal.works[j]).sum(axis=1, keepdims=True)
    ages_of = np.where(np.isfinite(cal.works[j]), version[:, :1], np.nan)[:, None, :]
    return took[:, None], ages_of, kept, parts


def _decode_capped(arrived: np.ndarray, dec: np.ndarray, n_d: int, cap: int) -> np.ndarray:
    """Each request's end (R × requests, in the order the link delivered them; -inf for padding)
    when the link hands them to the D decode engines in turn and each engine decodes at most `cap`
    at once, first come first served: a request starts when its KV arrived and a slot is free."""
    reps, m = arrived.shape
    slots = np.zeros((reps, n_d, cap))
    ended = np.full((reps, m), -np.inf)
    for p in range(m):
        engine = slots[:, p % n_d, :]  # a view: updated in place
        first = np.argmin(engine, axis=1)[:, None]
        start = np.maximum(arrived[:, p], np.take_along_axis(engine, first, axis=1)[:, 0])
        has = np.isfinite(arrived[:, p])
        end = np.where(has, start + np.nan_to_num(dec[:, p]), np.take_along_axis(engine, first, axis=1)[:, 0])
        np.put_along_axis(engine, first, end[:, None], axis=1)
        ended[:, p] = np.where(has, end, -np.inf)
    return ended


def _bandwidth(cal: Calibration, sc: Scenario) -> float:
    """B_KV: the scenario's, else the run's (given or measured)."""
    return float(sc.kv_bandwidth or cal.kv_bandwidth)


def _refusal(cal: Calibration, sc: Scenario) -> str | None:
    """Why `sc` cannot be predicted from this run (one line), or None."""
    if sc.partial and cal.cap and not sc.pd:
        return (f"cannot predict partial rollouts: this run's engines batch continuously (at most {cal.cap} requests "
                "at once, the rest queue), and partial rollouts replay static batches")
    if not sc.pd:
        return None
    if min(sc.pd) < 1:
        return "a prefill/decode split needs at least one prefill and one decode engine"
    if sc.partial:
        return "a prefill/decode split replays static batches: partial rollouts cannot be combined with it"
    if cal.requests is None:
        return f"cannot predict a prefill/decode split: {cal.requests_missing}"
    if not (sc.kv_bandwidth or cal.kv_bandwidth):
        return ("cannot predict a prefill/decode split: no KV link bandwidth (no KV transfer recorded): give "
                "--kv-bandwidth BYTES_PER_S")
    return None


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

    Returns a dict: scenario (a label of every knob), staleness, rollout_workers, partial, placement, sync_s, pd,
    kv_bandwidth (resolved), cap (the recorded cap of continuous batching each engine keeps; None: static batches);
    predicted_step_s (median over replays of each replay's median step period), interval_s ([5 %,
    95 %] of it), staleness_mean, staleness_max (of trained samples, median over replays),
    rollout_util, trainer_util (share of the time each pool was busy), tail_share (share of the
    rollout spent after the median sample finished), trainer_waited_share (share of steps on which
    the trainer waited for the rollout), binding (which constraint sets the period: under a split, `prefill`,
    `KV link` or `decode` when the rollout does), pd_shares (under a split: the share of the last
    request's time in each of those), why (a sentence), notes. Raises `Refused` when the run
    cannot tell (a split without engine request spans, model config or KV bandwidth).
    """
    sc = resolve(cal, scenario)
    refused = _refusal(cal, sc)
    if refused:
        raise Refused(refused)
    rng = np.random.default_rng(seed)
    n = min(max(len(cal.steps), MIN_STEPS), MAX_STEPS)
    replicates = max(20, min(replicates, int(WORK / (n * cal.works.shape[1]))))
    out = simulate(cal, sc, rng.integers(0, len(cal.steps), (replicates, n)), rng)
    warm = min(n - 2, sc.staleness + 2)  # the pipeline fills over the first steps
    period = np.median(np.diff(out["ends"], axis=1)[:, warm:], axis=1)
    span = out["ends"][:, -1]
    row = {"scenario": sc.label(), "staleness": sc.staleness, "rollout_workers": sc.rollout_workers,
           "partial": sc.partial, "placement": sc.placement, "sync_s": sc.sync_s,
           "pd": list(sc.pd) if sc.pd else None, "kv_bandwidth": sc.kv_bandwidth, "cap": cal.cap,
           "predicted_step_s": float(np.median(period)),
           "interval_s": [float(np.quantile(period, 0.05)), float(np.quantile(period, 0.95))],
           "staleness_mean": float(np.median(out["age_sum"] / np.maximum(out["age_n"], 1))),
           "staleness_max": int(round(float(np.median(out["age_max"])))),
           "rollout_util": float(np.median(out["rollout_busy"] / (span * sc.rollout_workers))),
           "trainer_util": float(np.median(out["trainer_busy"] / span)),
           "tail_share": float(np.median(out["tail_s"].sum(axis=1) / np.maximum(out["rollout_s"].sum(axis=1), 1e-12))),
           "trainer_waited_share": float(np.median(out["waited"][:, warm:].mean(axis=1)))}
    if sc.pd:
        parts = out["pd_parts"] / np.maximum(out["pd_parts"].sum(axis=1, keepdims=True), 1e-12)
        row["pd_shares"] = dict(zip(PD_TERMS, (float(v) for v in np.median(parts, axis=0))))
    return row | _binding(cal, sc, row) | {"notes": list(cal.notes)}


def _binding(cal: Calibration, sc: Scenario, row: dict) -> dict:
    """Which constraint sets the period, named by the cost model's terms, and why: what the trainer
    waited for step by step (a few slow steps do not decide it, as they would a mean)."""
    tail = ("partial rollouts end each batch when its share of samples is in" if sc.partial else
            f"each engine runs at most {cal.cap} requests at once (continuous batching, as recorded): the rest of its "
            "share waits for a slot, and its batch ends with its last request" if cal.cap else
            f"the longest sample of each batch: {row['tail_share']:.0%} of the rollout comes after the median sample")
    if sc.pd:
        shares = row["pd_shares"]
        term = max(shares, key=shares.get)
        tail = (f"{term} holds the rollout: the request that finished each step last spent {shares['prefill']:.0%} of "
                f"its time in prefill (behind the other prompts of {sc.pd[0]} prefill engine{'s' if sc.pd[0] > 1 else ''}), "
                f"{shares['KV link']:.0%} on the KV link ({_mean_kv(cal)} per request at {rate_text(_bandwidth(cal, sc))}) "
                f"and {shares['decode']:.0%} decoding ("
                + (f"a decode engine runs at most {cal.cap} requests at once, as the run's engines did)" if cal.cap else
                   "a decode engine takes every request it is sent at once)"))
        rollout_binds = sc.staleness == 0 or sc.placement == "colocated" or row["trainer_waited_share"] >= BOUND
        if rollout_binds:
            return {"binding": term, "why": tail} if sc.staleness == 0 or sc.placement == "colocated" else {
                "binding": term, "why": f"the trainer waits for the rollout on {row['trainer_waited_share']:.0%} of steps; {tail}"}
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
           per_step: pd.DataFrame | None = None, summary: dict | None = None,
           skip_refused: bool = False) -> pd.DataFrame:
    """Per scenario, `predict`'s figures, after a row for the recorded run replayed as recorded
    (`recorded_step_s`: its own median step period, to judge the replay by).

    Returns one row per scenario with the columns of `predict` (scenario: "as recorded", or the knobs
    asked; schedule: every knob, as resolved) and recorded_step_s, analytic_s
    (max(t_R, t_T) + t_W for an async scenario, t_sync for a synchronous one, from the medians).
    `per_step`, `summary`: `cost_model()` and `cost_summary()` of the same steps, when the caller has them.
    `skip_refused`: leave out a scenario this run cannot predict (its reason among the notes) instead of
    raising `Refused`.
    """
    return table(calibrate(con, steps, per_step=per_step, summary=summary), scenarios, replicates=replicates,
                 skip_refused=skip_refused)


def _mean_kv(cal: Calibration) -> str:
    return size_text(float(np.nanmean(cal.requests["kv_bytes"])))


def _split_rollout(cal: Calibration, sc: Scenario) -> float:
    """The serving formula's rollout under a split: a step's M requests at the slowest stage's rate,
    max(M / (n_P μ_P), M · S_KV / B_KV, the longest decode: a decode engine takes all it is sent),
    plus the rollout's own overhead; the median over recorded steps."""
    req = cal.requests
    m = np.isfinite(req["prefill_s"]).sum(axis=1)
    prefill = np.nansum(req["prefill_s"], axis=1) / sc.pd[0]  # M / (n_P μ_P), μ_P = 1 / mean prefill
    link = np.nansum(req["kv_bytes"], axis=1) / _bandwidth(cal, sc)
    decode = np.nanmax(np.where(np.isfinite(req["decode_s"]), req["decode_s"], 0.0), axis=1)
    rollout = np.where(m > 0, np.maximum.reduce([prefill, link, decode]) + cal.overhead, np.nan)
    return float(np.nanmedian(rollout))


def _analytic(cal: Calibration, sc: Scenario) -> float:
    """The cost model's formula for the scenario: t_sync = t_R + t_T + t_W for a synchronous or
    colocated one, max(t_R, t_T) + t_W for an async one (t_W: the scenario's sync cost if given;
    t_R's rollout the split's, `_split_rollout`, under `pd`)."""
    r, t = cal.terms.get("t_R", 0.0), cal.terms.get("t_T", 0.0)
    if sc.pd:
        r = r - cal.terms.get("t_rollout", 0.0) + _split_rollout(cal, sc)
    w = cal.terms.get("t_W", 0.0) if sc.sync_s is None else sc.sync_s
    return r + t + w if sc.staleness == 0 or sc.placement == "colocated" else max(r, t) + w


def table(cal: Calibration, scenarios: list[Scenario], *, replicates: int = REPLICATES,
          skip_refused: bool = False) -> pd.DataFrame:
    """`whatif` on a calibration already made (the dashboard keeps one per run and step range)."""
    if not len(cal.steps):
        return pd.DataFrame()
    recorded = float(np.nanmedian(cal.period)) if np.isfinite(cal.period).any() else None
    rows, skipped = [], []
    for i, sc in enumerate([Scenario()] + list(scenarios)):
        try:
            row = predict(cal, sc, replicates=replicates)
        except Refused as e:
            if not skip_refused:
                raise
            skipped.append(f"{sc.label()}: {e}")
            continue
        row["schedule"] = row["scenario"] + (f", at most {cal.cap} requests an engine at once" if cal.cap else "")
        row["scenario"] = "as recorded" if i == 0 else sc.label()
        row["analytic_s"] = _analytic(cal, resolve(cal, sc))
        row["recorded_step_s"] = recorded
        rows.append(row)
    for row in rows:
        row["notes"] = row["notes"] + skipped
    return pd.DataFrame(rows)
