"""The first implementation of the per-step rollout numbers (a pandas loop per step), kept only to
check the product: `rltrace.analysis.rollout` computes them without a Python loop per step and
must give the same frames, value for value and type for type (tests/analysis/test_rollout.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis.rollout import REQUEST_FIELDS, _columns, train_means

_MENTIONS = " OR ".join(f"contains(attributes, '{a}\"')" for _, a in REQUEST_FIELDS)  # spans that may hold SGLang's meta


def _samples(con, steps: Steps) -> pd.DataFrame:
    cols = _columns(con, "samples")
    if not cols:
        return pd.DataFrame()
    wanted = ["step", "sample_id", "group_id", "response_len", "finish_reason", "reward"]
    wanted += [c for c in ("effective_response_len", "cached_tokens", "total_prompt_tokens", "non_generation_time",
                           "repetition", "spec_accept_rate", "spec_accept_length", "in_batch") if c in cols]
    where, params = step_filter(steps)
    keep = "in_batch IS NOT false" if "in_batch" in cols else "true"
    return con.execute(
        f"SELECT {', '.join(wanted)} FROM samples WHERE {where} AND {keep} ORDER BY step, group_id, sample_id", params
    ).df()


def statistics(values) -> dict[str, float]:
    """slime's `compute_statistics`: mean, median, max, min."""
    v = np.asarray(values, dtype=float)
    return {"mean": float(np.mean(v)), "median": float(np.median(v)), "max": float(np.max(v)), "min": float(np.min(v))}


def pass_at_k(rewards: list[float], group_size: int) -> dict[str, float]:
    """slime's `compute_pass_rate`: pass@k for k = 1, 2, 4, ... up to the group size, a reward of
    exactly 1 counting as a pass, rewards given group after group."""
    if group_size <= 1 or len(rewards) % group_size:
        return {}
    groups = np.asarray(rewards, dtype=float).reshape(-1, group_size)
    correct = np.sum(groups == 1, axis=1)
    out = {}
    for k in (2**i for i in range(int(math.log2(group_size)) + 1)):
        est = [1.0 if group_size - c < k else 1.0 - float(np.prod(1.0 - k / np.arange(group_size - c + 1, group_size + 1)))
               for c in correct]
        out[str(k)] = float(np.mean(est))
    return out


def _sample_metrics(g: pd.DataFrame) -> dict:
    out: dict = {"samples": len(g)}
    rewards = g["reward"]
    out["reward_mean"] = float(rewards.mean()) if rewards.notna().any() else None
    if g["finish_reason"].notna().any():  # no finish_reason logged: nothing says a sample was cut
        out["truncated_ratio"] = float((g["finish_reason"] == "length").mean())
    lengths = g["response_len"]
    if "effective_response_len" in g:
        lengths = g["effective_response_len"].fillna(lengths)
    out.update({f"response_len_{k}": v for k, v in statistics(lengths.dropna()).items()} if lengths.notna().any() else {})
    out["zero_std"], out["pass_at_k"] = {}, {}
    if g["group_id"].notna().all() and rewards.notna().all():
        groups = [grp["reward"].tolist() for _, grp in g.groupby("group_id", sort=True)]
        zero = [str(round(r[0], 1)) for r in groups if all(r[0] == x for x in r)]
        out["zero_std"] = {f"count_{r}": zero.count(r) for r in dict.fromkeys(zero)}
        sizes = {len(r) for r in groups}
        if len(sizes) == 1:
            out["pass_at_k"] = pass_at_k([x for r in groups for x in r], sizes.pop())
    out["zero_std_groups"] = sum(out["zero_std"].values()) if g["group_id"].notna().all() and rewards.notna().all() else None
    if "repetition" in g and g["repetition"].notna().any():
        out["repetition_frac"] = float(g["repetition"].fillna(False).astype(int).mean())
    if "cached_tokens" in g and g["cached_tokens"].notna().any():
        cached, total = g["cached_tokens"].fillna(0).sum(), g["total_prompt_tokens"].fillna(0).sum()
        out["prefix_cache_hit_rate"] = float(cached / total) if total > 0 else 0.0
        out["avg_cached_tokens_per_sample"] = float(cached / len(g))
    if "non_generation_time" in g and g["non_generation_time"].notna().any() and g["non_generation_time"].max() > 0:
        out.update({f"non_generation_time_{k}": v for k, v in statistics(g["non_generation_time"].fillna(0)).items()})
    if "spec_accept_rate" in g and g["spec_accept_rate"].fillna(0).gt(0).any():
        out["spec_accept_rate"] = float(g["spec_accept_rate"].fillna(0).sum() / len(g))
        out["spec_accept_length"] = float(g["spec_accept_length"].fillna(0).sum() / len(g))
    return out


def engine(con, steps: Steps = None) -> pd.DataFrame:
    """Per step, slime's SGLang request statistics (`_compute_sglang_request_perf_metrics`) over the
    spans that carry SGLang's meta (`e2e_latency`, `queue_time`, `decode_throughput` attributes;
    each request counted in the step it ran in).

    Returns: step, requests, then <field>_<stat> for each field and mean/median/max/min (seconds;
    decode_throughput in tokens/s).
    """
    if not _columns(con, "spans"):
        return pd.DataFrame(columns=["step", "requests"])
    where, params = step_filter(steps)
    sel = ", ".join(f"TRY_CAST(attr(attributes, '{a}') AS DOUBLE) AS {n}" for n, a in REQUEST_FIELDS)
    any_attr = " OR ".join(f"attr(attributes, '{a}') IS NOT NULL" for _, a in REQUEST_FIELDS)
    frame = con.execute(
        f"SELECT step, {sel} FROM spans WHERE {where} AND step IS NOT NULL AND ({_MENTIONS}) AND ({any_attr}) ORDER BY step, start_ns",
        params,
    ).df()
    rows = []
    for step, g in frame.groupby("step", sort=True):
        row = {"step": int(step), "requests": len(g)}
        for name, _ in REQUEST_FIELDS:
            values = g[name][np.isfinite(g[name].astype(float))]
            if len(values):
                row.update({f"{name}_{k}": v for k, v in statistics(values).items()})
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["step", "requests"])


def engine_summary(con, steps: Steps = None, *, rollout_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per step, the rollout engine's own numbers: what explains a slow generation.

    Returns: step, requests, prefix_cache_hit_rate (cached prompt tokens / prompt tokens: the
    samples' prefix-cache columns, else the requests' `cached_tokens` / `prompt_tokens`),
    queue_share (sum of request queue_time / sum of e2e_latency), decode_throughput_p50/p90/p99
    (tokens/s per request), spec_accept_rate (mean over samples, when speculative decoding ran).
    `rollout_table`: the `rollout()` table of the same steps, when the caller has it already.
    """
    where, params = step_filter(steps)
    rows: dict[int, dict] = {}
    if _columns(con, "spans"):
        req = con.execute(
            f"""SELECT step, TRY_CAST(attr(attributes, 'queue_time') AS DOUBLE) AS q,
                       TRY_CAST(attr(attributes, 'e2e_latency') AS DOUBLE) AS e,
                       TRY_CAST(attr(attributes, 'decode_throughput') AS DOUBLE) AS t,
                       TRY_CAST(attr(attributes, 'cached_tokens') AS DOUBLE) AS c,
                       TRY_CAST(attr(attributes, 'prompt_tokens') AS DOUBLE) AS p
                FROM spans WHERE {where} AND step IS NOT NULL AND ({_MENTIONS})
                AND (attr(attributes, 'e2e_latency') IS NOT NULL OR attr(attributes, 'decode_throughput') IS NOT NULL)""",
            params,
        ).df()
        for step, g in req.groupby("step", sort=True):
            row = rows.setdefault(int(step), {"step": int(step)})
            row["requests"] = len(g)
            both = g.dropna(subset=["q", "e"])
            if len(both) and both["e"].sum() > 0:
                row["queue_share"] = float(both["q"].sum() / both["e"].sum())
            t = g["t"].dropna()
            if len(t):
                row.update({f"decode_throughput_p{q}": float(np.percentile(t, q)) for q in (50, 90, 99)})
            cp = g.dropna(subset=["c", "p"])
            if len(cp) and cp["p"].sum() > 0:
                row["prefix_cache_hit_rate"] = float(cp["c"].sum() / cp["p"].sum())
    samples = rollout_table if rollout_table is not None else rollout(con, steps)
    for rec in samples.to_dict("records") if len(samples) else []:
        row = rows.setdefault(int(rec["step"]), {"step": int(rec["step"])})
        for key in ("prefix_cache_hit_rate", "spec_accept_rate"):
            value = rec.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                row[key] = value
    return pd.DataFrame(sorted(rows.values(), key=lambda r: r["step"]), columns=None if rows else ["step"])


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
    rows = [{"step": int(step), **_sample_metrics(g)} for step, g in samples.groupby("step", sort=True)] if len(samples) else []
    frame = pd.DataFrame(rows, columns=None if rows else ["step", "samples"])
    for extra in (engine(con, steps), train_means(con, steps).drop(columns=["samples"], errors="ignore")):
        if len(extra):
            frame = frame.merge(extra, on="step", how="outer")
    return frame.sort_values("step", ignore_index=True) if len(frame) else frame
