"""What slime logs about each rollout, computed from the samples of any run, the way slime does.

slime computes these from a rollout's samples (slime/observability/rollout_metrics.py at commit
624b824a: `compute_metrics_from_samples`, `compute_perf_metrics_from_samples`; metric_utils.py:
`compute_statistics`, `compute_pass_rate`; train_metric_utils.py `log_rollout_data` with
megatron_utils/cp_utils.py `get_sum_of_sample_mean` for the train side). Here they come from the
`samples` table (rows with `in_batch` false, the earlier part of a carried-over sample, are left
out: slime counts a sample in the rollout it is trained in), the request spans and frozen batches,
so an imported slime run and a run traced with rltrace give the same numbers. Optional sample
columns (a traced run may log them with `log_samples`): `effective_response_len` (sum of the
loss mask), `cached_tokens` / `total_prompt_tokens` (prefix cache), `non_generation_time`,
`repetition`, `spec_accept_rate` / `spec_accept_length`.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import pandas as pd

from rltrace.analysis import _groups
from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis.engine_requests import table as requests_table

#: SGLang request fields slime summarises (`_SGLANG_REQUEST_PERF_FIELDS`): output name, span attribute.
REQUEST_FIELDS = (("e2e_latency", "e2e_latency"), ("queue_time", "queue_time"), ("decode_throughput", "decode_throughput"))
STATS = ("mean", "median", "max", "min")
TRAIN_MEANS = (("log_probs", "train_log_probs"), ("rollout_log_probs", "rollout_log_probs"), ("ref_log_probs", "train_ref_log_probs"))


def _columns(con, table: str) -> set[str]:
    try:
        return {r[0] for r in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()}
    except Exception:  # noqa: BLE001 - the table does not exist in this run
        return set()


def _absent(value) -> bool:
    """None, NaN or NA (a step whose batch lacks the column), as opposed to an array."""
    return value is None or (np.ndim(value) == 0 and bool(pd.isna(value)))


def _pass_ks(group_size: int) -> list[int]:
    """The k of slime's `compute_pass_rate`: 1, 2, 4, ... up to the group size."""
    return [2**i for i in range(int(math.log2(group_size)) + 1)]


def _pass_estimate(n: int, c: int, k: int) -> float:
    """slime's pass@k estimate for one group of n samples with c correct: 1 - C(n - c, k) / C(n, k)."""
    return 1.0 if n - c < k else 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _samples(con, steps: Steps) -> pd.DataFrame:
    cols = _columns(con, "samples")
    if not cols:
        return pd.DataFrame()
    wanted = ["step", "group_id", "response_len", "finish_reason", "reward"]  # ordered by sample_id, not read
    wanted += [c for c in ("effective_response_len", "cached_tokens", "total_prompt_tokens", "non_generation_time",
                           "repetition", "spec_accept_rate", "spec_accept_length", "in_batch") if c in cols]
    where, params = step_filter(steps)
    keep = "in_batch IS NOT false" if "in_batch" in cols else "true"
    return con.sql(  # through Arrow: text columns convert several times faster than with .df()
        f"SELECT {', '.join(wanted)} FROM samples WHERE {where} AND {keep} ORDER BY step, group_id, sample_id",
        params=params,
    ).to_arrow_table().to_pandas()


def _sample_table(s: pd.DataFrame) -> pd.DataFrame:
    """Per step of the samples (sorted by step, group_id, sample_id), the numbers slime logs for a
    rollout: one vectorised pass over every step (see `_groups`), no loop per step."""
    group, keys = _groups.codes(s["step"].to_numpy())
    n = len(keys)
    size = _groups.counts(group, n)
    rewards = s["reward"].to_numpy(float, na_value=np.nan)
    has_reward = ~np.isnan(rewards)
    rewarded = _groups.any_per(group, n, has_reward)
    total = _groups.reduce(np.where(has_reward, rewards, 0.0), group, n, {"sum": lambda b: b.sum(axis=1)})["sum"]
    cols: dict = {
        "step": (keys.astype(np.int64), None),
        "samples": (size, None),
        "reward_mean": (_groups.column(total / np.maximum(_groups.counts(group, n, has_reward), 1), rewarded), None),
        # absent (not 0) for a step whose samples logged no finish_reason: nothing says they were cut
        "truncated_ratio": (_groups.counts(group, n, (s["finish_reason"] == "length").to_numpy(bool)) / size,
                            _groups.any_per(group, n, s["finish_reason"].notna().to_numpy(bool))),
    }
    lengths = s["response_len"]
    if "effective_response_len" in s:
        lengths = s["effective_response_len"].fillna(lengths)
    lengths = lengths.to_numpy(float, na_value=np.nan)
    known = ~np.isnan(lengths)
    stats = _groups.reduce(lengths, group, n, _groups.STATS, keep=known)
    present = _groups.any_per(group, n, known)
    cols |= {f"response_len_{k}": (v, present) for k, v in stats.items()}
    cols |= _rewards_by_group(s, group, n, rewards, has_reward)
    if "repetition" in s:
        rep = s["repetition"]
        frac = _groups.reduce(rep.fillna(False).astype(int).to_numpy(float), group, n, {"mean": _mean})["mean"]
        cols["repetition_frac"] = (frac, _groups.any_per(group, n, rep.notna().to_numpy(bool)))
    if "cached_tokens" in s:
        cached = s["cached_tokens"]
        prompt = s["total_prompt_tokens"] if "total_prompt_tokens" in s else pd.Series(0, index=s.index)
        sums = {"sum": lambda b: b.sum(axis=1)}
        c = _groups.reduce(cached.fillna(0).to_numpy(float), group, n, sums)["sum"]
        t = _groups.reduce(prompt.fillna(0).to_numpy(float), group, n, sums)["sum"]
        present = _groups.any_per(group, n, cached.notna().to_numpy(bool))
        with np.errstate(divide="ignore", invalid="ignore"):
            cols["prefix_cache_hit_rate"] = (np.where(t > 0, c / t, 0.0), present)
        cols["avg_cached_tokens_per_sample"] = (c / size, present)
    if "non_generation_time" in s:
        ngt = s["non_generation_time"].to_numpy(float, na_value=np.nan)
        known = ~np.isnan(ngt)
        top = _groups.reduce(ngt, group, n, {"max": _groups.STATS["max"]}, keep=known)["max"]
        present = _groups.any_per(group, n, known) & (top > 0)
        stats = _groups.reduce(np.where(known, ngt, 0.0), group, n, _groups.STATS)
        cols |= {f"non_generation_time_{k}": (v, present) for k, v in stats.items()}
    if "spec_accept_rate" in s:
        rate = s["spec_accept_rate"].fillna(0).to_numpy(float)
        length = s["spec_accept_length"].fillna(0).to_numpy(float)
        present = _groups.any_per(group, n, rate > 0)
        cols["spec_accept_rate"] = (_groups.reduce(rate, group, n, {"mean": _mean})["mean"], present)
        cols["spec_accept_length"] = (_groups.reduce(length, group, n, {"mean": _mean})["mean"], present)
    return _groups.frame(cols)


def _mean(block: np.ndarray) -> np.ndarray:
    """`Series.sum() / len`, as slime divides by the number of samples."""
    return block.sum(axis=1) / block.shape[1]


def _rewards_by_group(s: pd.DataFrame, group: np.ndarray, n: int, rewards: np.ndarray, has_reward: np.ndarray) -> dict:
    """zero_std, pass_at_k and zero_std_groups of each step: over its groups (by group_id, in order)
    when every sample has a group and a reward; else {}, {} and None."""
    gid = s["group_id"]
    complete = ~(_groups.any_per(group, n, gid.isna().to_numpy(bool)) | _groups.any_per(group, n, ~has_reward))
    zero_std = [{} for _ in range(n)]
    pass_k = [{} for _ in range(n)]
    zero_groups = np.zeros(n, np.int64)
    rows = complete[group]
    if rows.any():
        step_of, r = group[rows], rewards[rows]
        ids = gid.to_numpy(object)[rows]
        new = np.ones(len(r), bool)
        new[1:] = (step_of[1:] != step_of[:-1]) | (ids[1:] != ids[:-1])
        g = np.cumsum(new) - 1  # group number of each row, in step and group_id order
        ng = int(g[-1]) + 1
        g_step = step_of[new]
        g_size = np.bincount(g, minlength=ng)
        lo = _groups.reduce(r, g, ng, {"min": _groups.STATS["min"]})["min"]
        hi = _groups.reduce(r, g, ng, {"max": _groups.STATS["max"]})["max"]
        zero = np.flatnonzero(lo == hi)  # every reward of the group equal
        first = r[new][zero]
        bits, which = np.unique(first.view(np.int64), return_inverse=True)  # by bits: -0.0 is named apart from 0.0
        names = np.array([f"count_{round(float(v), 1)}" for v in bits.view(np.float64)], dtype=object)[which]
        seen = pd.DataFrame({"step": g_step[zero], "name": names}).groupby(["step", "name"], sort=False).size()
        for (step, name), count in zip(seen.index.tolist(), seen.tolist()):
            zero_std[step][name] = count
        zero_groups = np.bincount(g_step[zero], minlength=n)
        # pass@k where all of a step's groups have one size above 1
        smallest = _groups.reduce(g_size.astype(float), g_step, n, {"min": _groups.STATS["min"]})["min"]
        largest = _groups.reduce(g_size.astype(float), g_step, n, {"max": _groups.STATS["max"]})["max"]
        correct = np.bincount(g, weights=(r == 1), minlength=ng).astype(np.int64)
        for size in np.unique(smallest[(smallest == largest) & (smallest > 1)]).astype(int):
            steps_k = (smallest == size) & (largest == size)
            mine = steps_k[g_step]
            means = {}
            for k in _pass_ks(size):
                est = np.array([_pass_estimate(size, c, k) for c in range(size + 1)])[correct[mine]]
                means[str(k)] = _groups.reduce(est, g_step[mine], n, {"mean": _groups.STATS["mean"]})["mean"]
            for step in np.flatnonzero(steps_k).tolist():
                pass_k[step] = {k: float(v[step]) for k, v in means.items()}
    return {
        "zero_std": (pd.Series(zero_std, dtype=object), None),
        "pass_at_k": (pd.Series(pass_k, dtype=object), None),
        "zero_std_groups": (_zero_groups_column(zero_groups, complete), None),
    }


def _zero_groups_column(counts: np.ndarray, complete: np.ndarray):
    if complete.all():
        return counts.astype(np.int64)
    return _groups.column(counts.astype(float), complete)


#: the last `_requests` frame of each connection (the engine tables both read it: 3M rows at 100M spans)
_LAST_REQUESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _requests(con, steps: Steps) -> pd.DataFrame:
    """The engine requests (`engine_requests`) with a step: step, start_ns, timed (an e2e latency
    or decode_throughput attribute is there, numeric or not) and the fields slime summarises
    under its names (e2e_latency, queue_time, decode_throughput, cached_tokens, prompt_tokens), by
    step and start. Read once per connection (two tables read it: 3M rows at 100M spans)."""
    name = requests_table(con)
    where, params = step_filter(steps)
    last = _LAST_REQUESTS.get(con)
    if last is not None and last[0] == (where, params):
        return last[1]  # callers read it, never change it
    # numbers straight from Arrow (millions of requests at 100M spans)
    table = con.sql(f"""SELECT step, start_ns, timed, e2e_s AS e2e_latency, queue_s AS queue_time, decode_throughput,
                               cached_tokens, prompt_tokens FROM {name}
                        WHERE {where} AND step IS NOT NULL ORDER BY step, start_ns""", params=params).to_arrow_table()
    frame = pd.DataFrame({name: column.to_numpy(zero_copy_only=False) if name != "timed"
                          else column.fill_null(False).to_numpy(zero_copy_only=False)
                          for name, column in zip(table.column_names, table.columns)})
    _LAST_REQUESTS[con] = ((where, params), frame)
    return frame


def engine(con, steps: Steps = None) -> pd.DataFrame:
    """Per step, slime's SGLang request statistics (`_compute_sglang_request_perf_metrics`) over the
    spans that carry SGLang's meta (`e2e_latency`, `queue_time`, `decode_throughput` attributes;
    each request counted in the step it ran in).

    Returns: step, requests, then <field>_<stat> for each field and mean/median/max/min (seconds;
    decode_throughput in tokens/s).
    """
    if not _columns(con, "spans"):
        return pd.DataFrame(columns=["step", "requests"])
    frame = _requests(con, steps)
    if frame.empty:
        return pd.DataFrame(columns=["step", "requests"])
    group, keys = _groups.codes(frame["step"].to_numpy())
    n = len(keys)
    cols: dict = {"step": (keys.astype(np.int64), None), "requests": (_groups.counts(group, n), None)}
    for name, _ in REQUEST_FIELDS:
        values = frame[name].to_numpy(float, na_value=np.nan)
        finite = np.isfinite(values)
        present = _groups.any_per(group, n, finite)
        stats = _groups.reduce(values, group, n, _groups.STATS, keep=finite)
        cols |= {f"{name}_{k}": (v, present) for k, v in stats.items()}
    return _groups.frame(cols)


def engine_summary(con, steps: Steps = None, *, rollout_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per step, the rollout engine's own numbers: what explains a slow generation.

    Returns: step, requests, prefix_cache_hit_rate (cached prompt tokens / prompt tokens: the
    samples' prefix-cache columns, else the requests' `cached_tokens` / `prompt_tokens`),
    queue_share (sum of request queue_time / sum of e2e_latency), decode_throughput_p50/p90/p99
    (tokens/s per request), spec_accept_rate (mean over samples, when speculative decoding ran).
    `rollout_table`: the `rollout()` table of the same steps, when the caller has it already.
    """
    steps_seen, cols = [np.zeros(0, np.int64)], {}
    if _columns(con, "spans"):
        req = _requests(con, steps)
        req = req[req["timed"].to_numpy(bool)]
        group, keys = _groups.codes(req["step"].to_numpy())
        n = len(keys)
        q, e, t, c, p = (req[k].to_numpy(float, na_value=np.nan)
                         for k in ("queue_time", "e2e_latency", "decode_throughput", "cached_tokens", "prompt_tokens"))
        total = {"sum": lambda b: b.sum(axis=1)}
        both = ~np.isnan(q) & ~np.isnan(e)
        qs, es = (_groups.reduce(x, group, n, total, keep=both)["sum"] for x in (q, e))
        timed = ~np.isnan(t)
        pct = {f"decode_throughput_p{x}": (lambda b, x=x: np.percentile(b, x, axis=1)) for x in (50, 90, 99)}
        cached = ~np.isnan(c) & ~np.isnan(p)
        cs, ps = (_groups.reduce(x, group, n, total, keep=cached)["sum"] for x in (c, p))
        with np.errstate(divide="ignore", invalid="ignore"):
            cols = {"requests": (_groups.counts(group, n), np.ones(n, bool)),
                    "queue_share": (qs / es, _groups.any_per(group, n, both) & (es > 0))}
            present = _groups.any_per(group, n, timed)
            cols |= {k: (v, present) for k, v in _groups.reduce(t, group, n, pct, keep=timed).items()}
            cols["prefix_cache_hit_rate"] = (cs / ps, _groups.any_per(group, n, cached) & (ps > 0))
        steps_seen.append(keys.astype(np.int64))
    samples = rollout_table if rollout_table is not None else rollout(con, steps)
    if len(samples):
        steps_seen.append(samples["step"].to_numpy(np.int64))
    every = np.unique(np.concatenate(steps_seen))  # a row for every step with requests or samples
    at = {}
    out: dict = {"step": (every, None)}
    if cols:
        at = np.searchsorted(every, steps_seen[1])
        for name, (values, present) in cols.items():
            out[name] = _spread(values, present, at, len(every))
    if len(samples):  # the samples' own figures win: what slime logs
        where_s = np.searchsorted(every, steps_seen[-1])
        for key in ("prefix_cache_hit_rate", "spec_accept_rate"):
            if key not in samples:
                continue
            value = pd.to_numeric(samples[key], errors="coerce").to_numpy(float, na_value=np.nan)
            mine = _spread(value, ~np.isnan(value), where_s, len(every))
            old = out.get(key, (np.full(len(every), np.nan), np.zeros(len(every), bool)))
            out[key] = (np.where(mine[1], mine[0], old[0]), mine[1] | old[1])
    if not len(every):
        return pd.DataFrame(columns=["step"])
    return _groups.frame(out)


def _spread(values: np.ndarray, present: np.ndarray, at: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group values and presence placed at rows `at` of a table of n rows (absent elsewhere)."""
    full = np.full(n, np.nan) if values.dtype.kind == "f" else np.zeros(n, values.dtype)
    mask = np.zeros(n, bool)
    full[at], mask[at] = values, present
    return full, mask


def train_means(con, steps: Steps = None) -> pd.DataFrame:
    """Per step, slime's train-side rollout means from frozen batches with train fields (an imported
    train dump, or a batch frozen with them): `log_probs`, `rollout_log_probs`, `ref_log_probs` as the
    mean over samples of each sample's loss-masked mean (the denominator is `train_rollout_mask_sums`
    when present, else the mask's sum, at least 1), `entropy` as the mean over every response token.

    Returns: step, samples, log_probs, rollout_log_probs, ref_log_probs, entropy (absent ones NaN).
    """
    cols = _columns(con, "batches")
    present = [(n, c) for n, c in TRAIN_MEANS if c in cols]
    if not cols or not (present or "train_entropy" in cols):
        return pd.DataFrame(columns=["step", "samples"])
    pick = [c for _, c in present] + [c for c in ("train_entropy", "loss_mask", "train_rollout_mask_sums") if c in cols]
    where, params = step_filter(steps)
    frame = con.execute(
        f"""SELECT step, batch_id, {', '.join(pick)} FROM batches WHERE {where}
            AND frozen_ns = (SELECT max(b.frozen_ns) FROM batches b WHERE b.step = batches.step) ORDER BY step, sample_index""",
        params,
    ).df()
    rows = []
    for step, g in frame.groupby("step", sort=True):
        row = {"step": int(step), "samples": len(g)}
        masks = [None if _absent(m) else np.asarray(m, dtype=float) for m in (g["loss_mask"] if "loss_mask" in g else [None] * len(g))]
        denoms = [None if _absent(d) else d for d in (g["train_rollout_mask_sums"] if "train_rollout_mask_sums" in g else [None] * len(g))]
        for name, col in present:
            total, ok = 0.0, True
            for x, m, d in zip(g[col], masks, denoms):
                if _absent(x):
                    ok = False
                    break
                # slime trains on float32 copies (rollout_data_utils._ROLLOUT_DATA_TENSOR_DTYPES)
                x = np.asarray(x, dtype=np.float32 if col == "rollout_log_probs" else None).astype(float)
                m = np.ones_like(x) if m is None or len(m) != len(x) else m
                d = float(np.asarray(d, dtype=float).reshape(-1)[0]) if d is not None else m.sum()
                total += float((x * m).sum()) / max(d, 1.0)
            if ok:
                row[name] = total / len(g)
        if "train_entropy" in g and not any(_absent(x) for x in g["train_entropy"]):
            tokens = np.concatenate([np.asarray(x, dtype=float).reshape(-1) for x in g["train_entropy"]])
            row["entropy"] = float(tokens.mean()) if tokens.size else None
        rows.append(row)
    return pd.DataFrame(rows)


def rollout(con, steps: Steps = None) -> pd.DataFrame:
    """Per step, the numbers slime's rollout logging computes from that rollout's samples.

    Returns: step, samples, reward_mean, truncated_ratio (finish_reason `length`),
    response_len_mean/median/max/min (by loss mask: `effective_response_len` when present),
    pass_at_k ({"1": .., "2": .., ...} up to the group size; a reward of 1 passes), zero_std (counts of
    groups whose rewards are all equal, by reward rounded to 0.1, as slime's `zero_std/count_<r>`),
    zero_std_groups (their total), repetition_frac, prefix_cache_hit_rate,
    avg_cached_tokens_per_sample, non_generation_time_mean/median/max/min (when any is > 0),
    spec_accept_rate / spec_accept_length (when speculative decoding ran), the `engine()` columns
    (e2e_latency_*, queue_time_*, decode_throughput_*, requests) and the `train_means()` columns
    (log_probs, rollout_log_probs, ref_log_probs, entropy). A number a run cannot give is NaN/absent.
    """
    samples = _samples(con, steps)
    frame = _sample_table(samples) if len(samples) else pd.DataFrame(columns=["step", "samples"])
    for extra in (engine(con, steps), train_means(con, steps).drop(columns=["samples"], errors="ignore")):
        if len(extra):
            frame = frame.merge(extra, on="step", how="outer")
    return frame.sort_values("step", ignore_index=True) if len(frame) else frame
