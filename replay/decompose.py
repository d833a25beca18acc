"""Where train/rollout mismatch comes from: parameter staleness vs the same-version engine gap.

For a sample generated under weight version v_s and trained at v_t, per response token:

    log p_{v_t} - log q_{v_s} = [log p_{v_t} - log p_{v_s}]   parameter staleness  (S)
                              + [log p_{v_s} - log q_{v_s}]   same-version engine gap  (E)

q is the rollout engine (the batch's `rollout_log_probs`), p the training engine, recomputed by an
entry point called as `entry(batch, weight_version=v)` once for v_t and once per distinct v_s
(it loads the checkpoint of version v). Deterministic kernels shrink E, never S. Each term's
share is its part of sum |S| + sum |E| over masked response tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rltrace.replay.diff import as_float64, rows_of
from rltrace.replay.errors import ReplayError


@dataclass
class Decomposition:
    tokens: int = 0
    samples: int = 0
    mean_abs_total: float = 0.0  # mean |log p_vt - log q_vs|: train_rollout_logprob_abs_diff
    mean_abs_staleness: float = 0.0  # mean |S|
    mean_abs_engine: float = 0.0  # mean |E|
    mean_staleness: float = 0.0  # signed means
    mean_engine: float = 0.0
    share_staleness: float = 0.0  # sum|S| / (sum|S| + sum|E|)
    share_engine: float = 0.0
    by_age: list[dict] = field(default_factory=list)  # per d = v_t - v_s: samples, tokens, mean |S|, mean |E|
    top_samples: list[dict] = field(default_factory=list)


def versions_of(batch) -> tuple[int, list[int]]:
    """(v_t, v_s per sample) of a batch, or a ReplayError naming the missing field."""
    v_t = batch.meta.get("train_version")
    if v_t is None:
        raise ReplayError(f"{batch.path}: field train_version is empty; freeze with batch_meta={{'weight_version': v_t}}")
    if "weight_version" in batch:
        v_s = [None if v is None else int(v) for v in rows_of(batch["weight_version"], len(batch))]
    elif "weight_versions" in batch:
        v_s = [None if not v else int(min(v)) for v in rows_of(batch["weight_versions"], len(batch))]
    else:
        raise ReplayError(f"{batch.path}: no weight_version column (v_s per sample); it is needed to decompose mismatch")
    if any(v is None for v in v_s):
        raise ReplayError(f"{batch.path}: field weight_version is empty for sample {v_s.index(None)}")
    return int(v_t), v_s


def decompose(batch, logprobs_at: Callable[[int], Any], *, top: int = 5) -> Decomposition:
    """Split the batch's mismatch into staleness and engine terms.

    `logprobs_at(v)` returns per-sample log-probs of the response tokens under version v
    (a [B, T] tensor or a list of per-sample arrays), e.g. from an entry point's result.
    """
    if "rollout_log_probs" not in batch:
        raise ReplayError(f"{batch.path}: no rollout_log_probs column (log q under v_s); it is needed to decompose mismatch")
    n = len(batch)
    v_t, v_s = versions_of(batch)
    q = rows_of(batch["rollout_log_probs"], n)
    mask = rows_of(batch["loss_mask"], n) if "loss_mask" in batch else [None] * n
    p_t = rows_of(logprobs_at(v_t), n)
    p_s_by_version = {v: rows_of(logprobs_at(v), n) if v != v_t else p_t for v in sorted(set(v_s))}
    out = Decomposition()
    sums = {"S": 0.0, "E": 0.0, "T": 0.0, "s": 0.0, "e": 0.0}
    ages: dict[int, dict] = {}
    per_sample = []
    for i in range(n):
        arrays = [as_float64(x) for x in (p_t[i], p_s_by_version[v_s[i]][i], q[i])]
        if any(a is None for a in arrays):
            continue
        m = min(len(a) for a in arrays)
        keep = np.ones(m, dtype=bool)
        mk = as_float64(mask[i])
        if mk is not None:
            keep[: min(m, len(mk))] &= mk[:m] != 0
        pt, ps, qs = (a[:m][keep] for a in arrays)
        s, e = pt - ps, ps - qs
        out.samples += 1
        out.tokens += len(s)
        sums["S"] += float(np.abs(s).sum())
        sums["E"] += float(np.abs(e).sum())
        sums["T"] += float(np.abs(pt - qs).sum())
        sums["s"] += float(s.sum())
        sums["e"] += float(e.sum())
        age = ages.setdefault(v_t - v_s[i], {"age": v_t - v_s[i], "samples": 0, "tokens": 0, "S": 0.0, "E": 0.0})
        age["samples"] += 1
        age["tokens"] += len(s)
        age["S"] += float(np.abs(s).sum())
        age["E"] += float(np.abs(e).sum())
        if len(s):
            per_sample.append({"sample_index": i, "v_s": v_s[i], "mean_abs_staleness": float(np.abs(s).mean()), "mean_abs_engine": float(np.abs(e).mean())})
    if out.tokens:
        out.mean_abs_staleness = sums["S"] / out.tokens
        out.mean_abs_engine = sums["E"] / out.tokens
        out.mean_abs_total = sums["T"] / out.tokens
        out.mean_staleness = sums["s"] / out.tokens
        out.mean_engine = sums["e"] / out.tokens
        both = sums["S"] + sums["E"]
        out.share_staleness = sums["S"] / both if both else 0.0
        out.share_engine = sums["E"] / both if both else 0.0
    out.by_age = [
        {"age": a["age"], "samples": a["samples"], "tokens": a["tokens"],
         "mean_abs_staleness": a["S"] / max(a["tokens"], 1), "mean_abs_engine": a["E"] / max(a["tokens"], 1)}
        for a in sorted(ages.values(), key=lambda a: a["age"])
    ]
    per_sample.sort(key=lambda r: -(r["mean_abs_staleness"] + r["mean_abs_engine"]))
    out.top_samples = per_sample[:top]
    return out
