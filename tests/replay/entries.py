"""Entry points for `rltrace replay run` in tests: `--entry tests/replay/entries.py:NAME`."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.replay.tiny import CharTokenizer, load_model, score

_VOCAB = len(CharTokenizer().tokens)


def reward(batch):
    """Recompute each sample's reward from its texts."""
    prompts = [t.split("user\n", 1)[1].split("<|im_end|>", 1)[0] for t in batch["prompt_text"]]
    return {"reward": [score(p, r) for p, r in zip(prompts, batch["response_text"])]}


def _logprobs(batch, path, dtype):
    model = load_model(Path(path), _VOCAB)
    return [model.logprobs(p, r, dtype) for p, r in zip(batch["prompt_tokens"], batch["response_tokens"])]


def logprobs_fp32(batch):
    """The training engine at the batch's checkpoint, in fp32."""
    return {"log_probs": _logprobs(batch, batch.meta["checkpoint"], torch.float32)}


def logprobs_bf16(batch):
    """The same forward with bf16 weights (another engine: not aligned with fp32)."""
    return {"log_probs": _logprobs(batch, batch.meta["checkpoint"], torch.bfloat16)}


def logprobs_at(batch, weight_version):
    """Log-probs under checkpoint `weight_version` (for `rltrace replay decompose`)."""
    path = Path(batch.meta["checkpoint"]).parent / f"v{weight_version}.pt"
    return {"log_probs": _logprobs(batch, path, torch.float32)}


def noisy(batch):
    """Not repeatable: a different result each call."""
    return {"reward": torch.rand(len(batch), dtype=torch.float64)}


def mutating(batch):
    """Modifies its input in place; repeats must not see that."""
    for r in batch["response_tokens"]:
        r.add_(1)
    return {"reward": [float(r.sum()) for r in batch["response_tokens"]]}


def broken(batch):
    raise RuntimeError("the reward server is down")


def wrong_rows(batch):
    return {"reward": [1.0]}
