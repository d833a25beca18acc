"""Debug replay of the demo: what a step freezes, and entry points that rerun a frozen batch.

train.py freezes a step's batch every `--freeze-every` steps and on anomalies (a reward drop,
bad text), then pins the checkpoints it needs. Rerun it (docs/replay.md, docs/demo.md):

    rltrace replay show runs/demo --step 10 --flagged
    rltrace replay run runs/demo --step 10 --entry examples.tiny_grpo.replay:reward
    rltrace replay run runs/demo --step 10 --entry examples.tiny_grpo.replay:render_prompts
    rltrace replay run runs/demo --step 10 --entry examples.tiny_grpo.replay:logprobs --repeat 2
    rltrace replay compare runs/demo --step 10 --entry examples.tiny_grpo.replay:logprobs \\
        --entry examples.tiny_grpo.replay:logprobs_bf16
    rltrace replay decompose runs/async --step 10 --entry examples.tiny_grpo.replay:logprobs_at
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

import rltrace.replay
from examples.tiny_grpo import grpo
from examples.tiny_grpo.policy import load_checkpoint, response_logprobs
from examples.tiny_grpo.task import Problem, reward as task_reward
from examples.tiny_grpo.system.tokenizer import ASSISTANT, SPECIAL_TOKENS, Tokenizer

PINNED = "frozen"  # checkpoints/frozen/: the versions frozen batches need, never pruned


# --- freezing (called from train.py) ----------------------------------------------------------
def freezer(cfg) -> rltrace.replay.Freezer:
    """Freeze every `--freeze-every` steps (0: never on a schedule) and on anomalies (a reward drop, bad text)."""
    return rltrace.replay.Freezer(rltrace.replay.FreezePolicy(every=cfg.freeze_every or None, reward_drop=0.3,
                                                              bad_text=True))


def freeze(freezer: rltrace.replay.Freezer, step: int, samples, rewards: list[float], *, policy, tokenizer: Tokenizer,
           ckpt: Path, version: int, cfg) -> None:
    """Offer the step's batch to `freezer` (written on its own thread, never waited for); when it is
    kept, pin the checkpoints a rerun needs."""
    if freezer.step(step, rows(samples, rewards, cfg.group_size), batch_meta=batch_meta(tokenizer, ckpt, version, cfg),
                    metrics={"reward_mean": sum(rewards) / len(rewards)}):
        pin_checkpoints(policy, ckpt, version, {s.weight_version for s in samples})


def rows(samples, rewards: list[float], group_size: int) -> list[dict]:
    """One dict per sample, in rltrace.replay's column names (the lists are the loop's own)."""
    advantages = grpo.group_advantages(torch.tensor(rewards), group_size).tolist()  # sync point (in "step")
    return [
        {
            "sample_id": s.sample_id,
            "group_id": s.group_id,
            "prompt_tokens": s.prompt_tokens,
            "response_tokens": s.completion.tokens,
            "rollout_log_probs": s.completion.logprobs,
            "reward": rewards[i],
            "advantages": advantages[i],
            "weight_version": s.weight_version,
            "finish_reason": s.completion.finish_reason,
            "prompt_text": s.prompt_text,
            "response_text": s.response_text,
            "metadata": {"digits": s.problem.digits, "worker_rank": s.worker_rank},
        }
        for i, s in enumerate(samples)
    ]


def batch_meta(tokenizer: Tokenizer, ckpt: Path, version: int, cfg) -> dict:
    """v_t, the tokenizer, the checkpoint of v_t and what the bad-text flags need to know."""
    return {
        "weight_version": version,
        "tokenizer": tokenizer,
        "checkpoint": str(ckpt / PINNED / f"policy_v{version:06d}.pt"),
        "max_response_len": cfg.max_new_tokens,
        "special_token_ids": sorted(tokenizer.special_ids),
        "eos_token_ids": [tokenizer.eos_id],
        "special_tokens": list(SPECIAL_TOKENS),
        "generation_prompt": ASSISTANT,
        "temperature": cfg.temperature,
        "rollout_precision": cfg.rollout_precision,
    }


def pin_checkpoints(policy, ckpt: Path, version: int, versions: set[int]) -> None:
    """Keep the checkpoints of v_t and of every v_s in `checkpoints/frozen/` (hard links: no copy).

    Runs before the step's update, so `policy` still holds version `version`: when the run keeps
    no per-version checkpoints (colocated sync), a copy of its weights is saved by a thread, so
    the step does not wait for the disk."""
    pinned = ckpt / PINNED
    pinned.mkdir(exist_ok=True)
    config = pinned / "model_config.json"
    if not config.exists():
        os.link(ckpt / "model_config.json", config)
    for v in sorted(versions | {version}):
        target, source = pinned / f"policy_v{v:06d}.pt", ckpt / f"policy_v{v:06d}.pt"
        if target.exists():
            continue
        if source.exists():
            os.link(source, target)
        elif v == version:
            state = {name: t.detach().clone() for name, t in policy.state_dict().items()}
            threading.Thread(target=_save_state, args=(state, target), name="replay-checkpoint").start()


def _save_state(state: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


# --- entry points for `rltrace replay run` ----------------------------------------------------
def _policy(batch, path: str | Path, dtype: torch.dtype = torch.float32):
    policy, tokenizer = load_checkpoint(path)
    name, digest = rltrace.replay.tokenizer_identity(tokenizer)
    if digest != batch.meta["tokenizer_hash"]:
        raise ValueError(f"checkpoint {path} has tokenizer {name} ({digest[:12]}…), not the batch's ({batch.meta['tokenizer_hash'][:12]}…)")
    return policy.to(dtype), tokenizer


def reward(batch):
    """The task's reward recomputed from the stored response texts."""
    problems = [Problem(m["digits"]) for m in batch["metadata"]]
    return {"reward": [task_reward(p, text) for p, text in zip(problems, batch["response_text"])]}


def render_prompts(batch):
    """The prompts as the chat template renders them: compared with the stored `prompt_tokens`,
    a template bug (`--bad-template`) shows as a difference in every sample."""
    tokenizer = Tokenizer()
    return {"prompt_tokens": [tokenizer.encode(tokenizer.chat_prompt(f"reverse {m['digits']}")) for m in batch["metadata"]]}


def _logprobs(batch, path, dtype: torch.dtype) -> dict:
    policy, tokenizer = _policy(batch, path, dtype)
    with torch.no_grad():
        logp = response_logprobs(policy, batch["prompt_tokens"], batch["response_tokens"], pad_id=tokenizer.pad_id,
                                 temperature=batch.extra["temperature"])
    return {"log_probs": logp}


def logprobs(batch):
    """The trainer's fp32 forward at the batch's checkpoint (v_t): log p of each response token."""
    return _logprobs(batch, batch.meta["checkpoint"], torch.float32)


def logprobs_bf16(batch):
    """The same forward with bf16 weights: another engine, repeatable but not aligned with fp32."""
    return _logprobs(batch, batch.meta["checkpoint"], torch.bfloat16)


def logprobs_at(batch, weight_version: int):
    """log p under checkpoint `weight_version` (`rltrace replay decompose` calls it for v_t and each v_s)."""
    return _logprobs(batch, Path(batch.meta["checkpoint"]).parent / f"policy_v{int(weight_version):06d}.pt", torch.float32)
