"""The GRPO objective and the train/rollout mismatch statistics, one formula per function.

Notation (per response token): `logp` = trainer log-prob now (with grad), `old_logp` = trainer
log-prob before this batch's first update, `rollout_logp` = the engine's log q at generation.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage: each reward normalised within its group of `group_size` samples of one prompt.
    A group whose samples all score the same gets zero advantage (nothing to learn from it)."""
    groups = rewards.view(-1, group_size)
    mean, std = groups.mean(1, keepdim=True), groups.std(1, keepdim=True)
    return ((groups - mean) / (std + eps)).view(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def mismatch(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, tis_cap: float) -> dict:
    """Train/rollout mismatch over response tokens (the standard mismatch step scalars).

    - `train_rollout_logprob_abs_diff` = mean |log p - log q|
    - `mismatch_k3` = mean (r - 1 - log r), r = p/q: the k3 estimator of KL(q || p), >= 0
    - `tis_mean`, `tis_clipfrac`: truncated importance weight w = p/q, its mean and the fraction
      above `tis_cap` (those tokens are down-weighted by the clip)
    - `per_sample_abs_diff` (B,): mean |log p - log q| of each sample

    Sync point: every `.item()` / `.tolist()` here waits for the forward that made `old_logp`
    (train.py calls this inside its `forward` phase, so the wait is counted there).
    """
    log_ratio = (old_logp - rollout_logp) * mask
    ratio = log_ratio.exp()
    per_sample = (log_ratio.abs().sum(1) / mask.sum(1).clamp(min=1)).tolist()  # sync point (in "forward")
    return {
        "train_rollout_logprob_abs_diff": masked_mean(log_ratio.abs(), mask).item(),  # sync points (in "forward")
        "mismatch_k3": masked_mean(ratio - 1 - log_ratio, mask).item(),
        "tis_mean": masked_mean(ratio, mask).item(),
        "tis_clipfrac": masked_mean((ratio > tis_cap).float(), mask).item(),
        "per_sample_abs_diff": per_sample,
    }


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    tis_cap: float,
) -> torch.Tensor:
    """Clipped policy-gradient loss with truncated importance sampling (TIS), token-mean.

    loss = -mean_t[ min(w, C) * min(rho * A, clip(rho, 1-eps, 1+eps) * A) ]
    with rho = p_now / p_old (moves away from 1 after the first update on a batch) and
    w = p_old / q, the correction for sampling from the rollout engine (mismatch and staleness).
    """
    rho = (logp - old_logp).exp()
    adv = advantages[:, None]
    surrogate = torch.minimum(rho * adv, rho.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    tis = (old_logp - rollout_logp).exp().clamp(max=tis_cap)
    return -masked_mean(tis * surrogate, mask)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(policy || reference) on the policy's own samples: e^(ref-p) - (ref-p) - 1."""
    diff = ref_logp - logp
    return masked_mean(diff.exp() - diff - 1, mask)
