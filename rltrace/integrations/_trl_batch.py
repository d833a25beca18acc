"""What the TRL hooks keep between calls: each generation's samples, rollout log-probs, mismatch sums.

TRL generates a batch once and trains on shuffled slices of it for `steps_per_generation *
num_iterations` micro-steps, so a sample is followed by an id that rides along in the batch
dict (`SAMPLE_ID`), next to its rollout log-probs (`ROLLOUT_LOGPS`). Rows are logged when a
sample is first trained on (its `train_version`); numbers stay tensors until the step ends, so
the training thread pays no device sync of ours inside a step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

SAMPLE_ID = "rltrace_sample_id"  # (B,) int64: rltrace's sample id of each row of the batch
ROLLOUT_LOGPS = "rltrace_rollout_logps"  # (B, T) float32: log q of each completion token at generation
KEYS = (SAMPLE_ID, ROLLOUT_LOGPS)


class LogprobRecorder:
    """A logits processor placed after every warper of `generate`: it sees the distribution tokens are
    sampled from and keeps log q of the token drawn at each position.

    Called once per new token with the final scores; the token drawn from them is the last
    column of `input_ids` at the next call (or of the returned sequences, see `finish`), so
    only one (B, V) log-softmax is held at a time.
    """

    def __init__(self):
        self._pending: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []
        self.prompt_width: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_width is None:
            self.prompt_width = input_ids.shape[1]
        if self._pending is not None:
            self._steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor | None:
        """(B, K) log q of the K tokens generated after the prompt, or None if nothing was recorded."""
        if self.prompt_width is None:
            return None
        k = len(self._steps)
        if self._pending is not None and sequences.shape[1] > self.prompt_width + k:
            self._steps.append(self._pending.gather(1, sequences[:, self.prompt_width + k : self.prompt_width + k + 1]).squeeze(1))
        self._pending = None
        return torch.stack(self._steps, dim=1) if self._steps else None


def padded(rows: list[torch.Tensor] | torch.Tensor | None, width: int, device) -> torch.Tensor | None:
    """Rollout log-probs as a (B, width) float32 tensor, right-padded with 0 (or cut)."""
    if rows is None:
        return None
    if isinstance(rows, torch.Tensor):
        out = rows[:, :width].float()
        if out.shape[1] < width:
            out = torch.nn.functional.pad(out, (0, width - out.shape[1]))
        return out.to(device)
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        values = torch.as_tensor([math.nan if v is None else v for v in row][:width], dtype=torch.float32)
        out[i, : len(values)] = values
    return out.to(device)


@dataclass
class Generation:
    """One call of `_generate_and_score_completions` while it runs."""

    step: int  # optimizer step at generation = weight_version of its samples
    gen_start: float | None = None
    gen_end: float | None = None
    prompt_ids: list | None = None
    completion_ids: list | None = None
    rollout_logps: Any = None  # (B, K) tensor from LogprobRecorder, or per-sample lists from vLLM
    rewards_per_func: torch.Tensor | None = None  # (N_all_processes, F)
    reward_inputs: tuple | None = None  # (inputs, prompts, completions) given to the reward functions
    missing_logprobs: str | None = None  # why this generation has no rollout log-probs, when found while it ran


#: The sums kept per step, in this order (see StepSums.add).
_SUMS = ("abs_diff", "k3", "ratio", "clipped", "tokens")


@dataclass
class StepSums:
    """Mismatch sums of one optimizer step over its micro-batches, as one tensor (no sync until the step ends)."""

    sums: torch.Tensor | None = None  # (5,) in _SUMS order
    sample_ids: list[torch.Tensor] = field(default_factory=list)
    sample_abs_diff: list[torch.Tensor] = field(default_factory=list)

    def add(self, train_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor, tis_cap: float,
            sample_ids: torch.Tensor | None) -> None:
        """Accumulate the demo's mismatch formulas (examples/tiny_grpo/grpo.py) over one micro-batch.

        r = log p - log q per masked completion token; |r|, k3 = e^r - 1 - r, the importance
        weight e^r and whether it exceeds `tis_cap`. Tokens whose log q is NaN are left out.
        """
        with torch.no_grad():
            mask = mask.float() * ~torch.isnan(rollout_logps)
            log_ratio = torch.nan_to_num(train_logps.detach().float() - rollout_logps) * mask
            ratio = log_ratio.exp()
            terms = torch.stack([log_ratio.abs(), ratio - 1 - log_ratio, ratio, (ratio > tis_cap).float(), mask]) * mask
            per_sample = terms.sum(dim=2)  # (5, B)
            total = per_sample.sum(dim=1)
            self.sums = total if self.sums is None else self.sums + total
            if sample_ids is not None:
                self.sample_ids.append(sample_ids.detach())
                self.sample_abs_diff.append(per_sample[0] / per_sample[4].clamp(min=1))

    def metrics(self) -> dict[str, float]:
        """The step scalars (one device sync here, at the step's end)."""
        if self.sums is None:
            return {}
        sums = dict(zip(_SUMS, self.sums.tolist()))
        tokens = sums["tokens"]
        if tokens == 0:
            return {}
        return {
            "train_rollout_logprob_abs_diff": sums["abs_diff"] / tokens,
            "mismatch_k3": sums["k3"] / tokens,
            "tis_mean": sums["ratio"] / tokens,
            "tis_clipfrac": sums["clipped"] / tokens,
        }

    def per_sample(self) -> dict[int, float]:
        """{sample id: mean |log p - log q| of its tokens} for the samples trained on this step."""
        out: dict[int, float] = {}
        for ids, diffs in zip(self.sample_ids, self.sample_abs_diff):
            out.update(zip(ids.tolist(), diffs.tolist()))
        return out


def finish_reason(completion, eos_ids: set[int]) -> str:
    """`stop` when the completion ends with an end-of-sequence (or pad) token, else `length` (TRL's own test)."""
    return "stop" if len(completion) and int(completion[-1]) in eos_ids else "length"


def sample_rows(gen: Generation, *, first_id: int, first_group: int, group_size: int, process_slice: slice,
                func_names: list[str], weights: torch.Tensor, eos_ids: set[int]) -> list[dict]:
    """One `log_samples` row per completion of this process (train_version filled in when trained on)."""
    rewards = gen.rewards_per_func[process_slice].float().cpu() if gen.rewards_per_func is not None else None
    per_func, total = [], []
    if rewards is not None:
        summed = (rewards * weights.cpu().float().unsqueeze(0)).nansum(dim=1)  # TRL's formula, in float32
        summed[torch.isnan(rewards).all(dim=1)] = math.nan
        per_func, total = rewards.tolist(), summed.tolist()
    rows = []
    offset = process_slice.start or 0
    for i, (prompt, completion) in enumerate(zip(gen.prompt_ids, gen.completion_ids)):
        row = {
            "sample_id": first_id + i,
            "group_id": first_group + (offset + i) // group_size,
            "prompt_len": len(prompt),
            "response_len": len(completion),
            "finish_reason": finish_reason(completion, eos_ids),
            "reward": total[i] if total else None,
            "weight_version": gen.step,
            "train_version": None,
            "gen_start": gen.gen_start,
            "gen_end": gen.gen_end,
        }
        if per_func:
            for name, value in zip(func_names, per_func[i]):
                row[f"reward_{name}"] = value
        rows.append(row)
    return rows


def now() -> float:
    return time.time()
