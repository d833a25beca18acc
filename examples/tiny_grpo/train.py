"""Tiny GRPO, instrumented with rltrace: rollout -> reward -> train -> weight sync, step after step.

    python -m examples.tiny_grpo --out runs/demo                  # colocated, sync (about a minute)
    python -m examples.tiny_grpo --out runs/async --placement disaggregated --mode async
    rltrace info runs/demo

Read this file top to bottom: `run_trainer` records the trainer process (`rltrace.init`), `train`
is the loop. A short supervised warm-up teaches the answer format, then each step is four phases,
each a `with rltrace.phase(...)` block: generate groups of answers (`rollout`), score them
(`reward`), take one GRPO update (`train`) and send the new weights to the rollout engine
(`weight_sync`). The model is policy.py, the task and its reward task.py, the loss grpo.py.
Everything else (flags, where the rollout runs, how weights travel, Ray, the fault flags, what is
printed) is in system/, behind the `rollout` object and `cfg` (`system/cli.py` lists every flag).

Sync points: on a GPU, `.item()`, `.tolist()` and `bool(tensor)` wait for every queued kernel, so
the time of that work lands in the phase where the value is read. They are marked `# sync point`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

import rltrace
from examples.tiny_grpo import grpo, replay
from examples.tiny_grpo.policy import (
    Policy,
    pack,
    policy_config,
    save_checkpoint,
    save_version,
    token_logprobs,
    write_model_config,
)
from examples.tiny_grpo.system.faults import sometimes_slow
from examples.tiny_grpo.system.placement import RolloutTimeout
from examples.tiny_grpo.system.tokenizer import Tokenizer
from examples.tiny_grpo.task import ProblemSource, reward


def run_trainer(cfg, display, rollout) -> tuple[int, str]:
    """The trainer process's whole life: record as `role="trainer"`, train, flush. Returns the exit
    code (0, or 3 when a rollout worker stopped answering) and what went wrong."""
    rltrace.init(cfg.out, role="trainer", config=cfg)
    try:
        train(cfg, display, rollout)
        return 0, ""
    except RolloutTimeout as exc:
        return 3, str(exc)
    finally:
        rltrace.shutdown()


def train(cfg, display, rollout) -> None:
    """Run the whole demo into `cfg.out` (already prepared); `display.step(row)` gets each step's summary.

    `rollout` is where generation runs (system/placement.py): `rollout.rollout(...)` returns a step's
    samples, `rollout.sync_weights(policy, version)` sends the policy's weights to the engines."""
    ckpt = Path(cfg.out) / "checkpoints"
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    tokenizer = Tokenizer()
    policy = Policy(policy_config(cfg))  # the same model as the engines
    write_model_config(ckpt, policy.config, tokenizer, rollout_precision=cfg.rollout_precision,
                       temperature=cfg.temperature, top_p=cfg.top_p)
    keep_versions = cfg.save_checkpoints or cfg.mode == "async"
    try:
        with rltrace.phase("warmup") as span:
            display.status("supervised warm-up")
            n, loss = warmup(policy, tokenizer, cfg)
            span.set(batches=n, loss=loss)
        display.warmup_done(n, loss)
        ref = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef > 0 else None
        with rltrace.phase("weight_sync", weight_version=0, method=rollout.method) as span:
            span.set(bytes=rollout.sync_weights(policy, 0))
        rollout.start()
        if keep_versions:
            save_version(policy, ckpt, 0, cfg.keep_checkpoints)
        opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
        score = sometimes_slow(reward, cfg.slow_reward, seed=cfg.seed + 13)  # the --slow-reward fault
        freezer = replay.freezer(cfg)  # debug replay: frozen batches are written on their own thread
        version = 0  # weights are at version v during step v; the update makes v + 1
        for step in range(cfg.steps):
            started, cpu_started = time.perf_counter(), time.process_time()
            with rltrace.phase("step", step=step, weight_version=version):
                with rltrace.phase("rollout") as span:
                    samples, dropped = rollout.rollout(cfg.prompts_per_step, step, version)
                    span.set(samples=len(samples))
                with rltrace.phase("reward") as span:
                    rewards = [score(s.problem, s.response_text) for s in samples]
                    span.set(samples=len(samples))
                replay.freeze(freezer, step, samples, rewards, policy=policy, tokenizer=tokenizer, ckpt=ckpt,
                              version=version, cfg=cfg)
                with rltrace.phase("train") as span:
                    stats = train_step(policy, ref, opt, samples, rewards, cfg, tokenizer.pad_id)
                    span.set(loss=stats["loss"])
                version += 1
                with rltrace.phase("weight_sync", weight_version=version, method=rollout.method) as span:
                    span.set(bytes=rollout.sync_weights(policy, version))
                if keep_versions:
                    with rltrace.phase("checkpoint", weight_version=version) as span:
                        span.set(bytes=save_version(policy, ckpt, version, cfg.keep_checkpoints))
            seconds = time.perf_counter() - started
            row = record(step, version - 1, samples, rewards, stats, dropped, seconds)
            row["cpu_seconds"] = time.process_time() - cpu_started  # every thread of this process
            display.step(row)
    finally:
        rollout.close()
    save_checkpoint(policy, ckpt / "policy_final.pt")


def warmup(policy: Policy, tokenizer: Tokenizer, cfg) -> tuple[int, float]:
    """Supervised warm-up on correct answers until the loss shows the format is learned (a brief pre-training)."""
    problems = ProblemSource(cfg.seed + 7, cfg.digits, cfg.digits)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.warmup_lr, weight_decay=0.0)
    smoothed = None
    for batches in range(1, cfg.warmup_max_steps + 1):
        batch = [problems.next() for _ in range(cfg.warmup_batch)]
        prompts = [tokenizer.encode(tokenizer.chat_prompt(p.user_text)) for p in batch]
        answers = [tokenizer.encode(p.answer) + [tokenizer.eos_id] for p in batch]
        tokens, mask = pack(prompts, answers, tokenizer.pad_id)
        loss = -grpo.masked_mean(token_logprobs(policy, tokens), mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # sync point (in "warmup"): loss.item() waits for this batch's backward and optimizer step
        smoothed = loss.item() if smoothed is None else 0.8 * smoothed + 0.2 * loss.item()
        if smoothed < cfg.warmup_target_loss:
            break
    return batches, smoothed


def train_step(policy, ref, opt, samples, rewards, cfg, pad_id: int) -> dict:
    """One GRPO update on a batch: recompute log-probs (fp32 full forward), loss, backward, step."""
    tokens, mask = pack([s.prompt_tokens for s in samples], [s.completion.tokens for s in samples], pad_id)
    rollout_logp = torch.zeros(mask.shape)
    rollout_logp[mask] = torch.tensor([lp for s in samples for lp in s.completion.logprobs])
    advantages = grpo.group_advantages(torch.tensor(rewards), cfg.group_size)
    ref_logp, stats = None, {}
    if ref is not None:
        with rltrace.phase("forward", model="reference"), torch.no_grad():
            ref_logp = token_logprobs(ref, tokens, cfg.temperature)
    for update in range(cfg.updates_per_batch):
        with rltrace.phase("forward", update=update):
            logp = token_logprobs(policy, tokens, cfg.temperature)
            if update == 0:
                old_logp = logp.detach()
                stats = grpo.mismatch(old_logp, rollout_logp, mask, cfg.tis_cap)  # sync point (in "forward")
            loss = grpo.policy_loss(logp, old_logp, rollout_logp, advantages, mask,
                                    clip_eps=cfg.clip_eps, tis_cap=cfg.tis_cap)
            if ref_logp is not None:
                kl = grpo.kl_k3(logp, ref_logp, mask)
                loss = loss + cfg.kl_coef * kl
                stats["kl_ref"] = kl.item()  # sync point (in "forward"): waits for the forward
        with rltrace.phase("backward", update=update):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with rltrace.phase("optimizer", update=update):
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            opt.step()
    # sync point (in "train"): .item() / .tolist() wait for the last optimizer step
    stats.update(loss=loss.item(), grad_norm=grad_norm.item(), advantages=advantages.tolist())
    return stats


def record(step: int, train_version: int, samples, rewards, stats: dict, dropped: int, seconds: float) -> dict:
    """Log the step's scalars (`log_metrics`) and one row per sample (`log_samples`); returns the scalars.
    Runs after the step's phases, so its `.item()` calls are in no phase."""
    r = torch.tensor(rewards)
    staleness = [train_version - s.weight_version for s in samples]
    response_tokens = sum(len(s.completion.tokens) for s in samples)
    metrics = {
        "reward_mean": r.mean().item(),
        "reward_std": r.std().item(),
        "response_len_mean": response_tokens / len(samples),
        **{k: v for k, v in stats.items() if not isinstance(v, list)},
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "tokens_per_s": response_tokens / seconds,  # response tokens this step / step wall time
        "exact_match": (r == 1.0).float().mean().item(),
        "stale_groups_dropped": dropped,
    }
    rltrace.log_metrics(step, **metrics)
    rltrace.log_samples(step, [
        {
            "sample_id": s.sample_id, "group_id": s.group_id, "prompt_len": len(s.prompt_tokens),
            "response_len": len(s.completion.tokens), "finish_reason": s.completion.finish_reason,
            "reward": rewards[i], "weight_version": s.weight_version, "train_version": train_version,
            "gen_start": s.completion.gen_start, "gen_end": s.completion.gen_end,
            "worker_rank": s.worker_rank, "advantage": stats["advantages"][i],
            "logprob_abs_diff": stats["per_sample_abs_diff"][i],
            "prompt_text": s.prompt_text, "response_text": s.response_text,  # token arrays: frozen batches
        }
        for i, s in enumerate(samples)
    ])
    return {"step": step, "seconds": seconds, **metrics}
