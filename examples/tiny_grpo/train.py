"""Tiny GRPO, instrumented with rltrace: rollout -> reward -> train -> weight sync, step after step.

    python -m examples.tiny_grpo --out runs/demo                  # colocated, sync (about a minute)
    python -m examples.tiny_grpo --out runs/async --placement disaggregated --mode async
    rltrace info runs/demo

Every knob is a field of `Config` below (each is also a `--flag`). The loop is `train()`: a short
supervised warm-up teaches the answer format, then each step generates groups of answers, scores
them, takes one GRPO update and sends the new weights to the rollout engine. Colocated, it runs
in this process; disaggregated, in a Ray actor of its own (ray_driver.py starts it).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

import rltrace
import rltrace.replay
from examples.tiny_grpo import grpo, replay, weight_sync
from examples.tiny_grpo.display import Display
from examples.tiny_grpo.placement import LocalRollout, RolloutTimeout
from examples.tiny_grpo.policy import Policy, PolicyConfig, pack, save_checkpoint, token_logprobs, write_model_config
from examples.tiny_grpo.task import ProblemSource, reward, slow_verifier
from examples.tiny_grpo.tokenizer import Tokenizer
from examples.tiny_grpo.worker import STRAGGLER_TOKENS, RolloutSettings


def knob(default, help: str, **argparse_kwargs):
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass
class Config:
    out: str = knob("runs/demo", "run directory (the rltrace store, checkpoints, summary)")
    steps: int = knob(60, "GRPO steps after the warm-up")
    seed: int = knob(0, "seeds the model, the problems and the sampling")
    placement: str = knob("colocated", "colocated: one process; disaggregated: rollout workers as Ray actors",
                          choices=("colocated", "disaggregated"))
    mode: str = knob("sync", "async lets workers keep generating while the trainer trains (disaggregated only)",
                     choices=("sync", "async"))
    rollout_workers: int = knob(1, "number of rollout worker processes (disaggregated)")
    # task and sampling
    prompts_per_step: int = knob(8, "GRPO groups per step (distinct problems)")
    group_size: int = knob(8, "samples per problem; advantages are normalised within a group")
    digits: int = knob(5, "digits per problem (the task: reverse them)")
    max_new_tokens: int = knob(12, "token budget of a normal answer (5 digits + <|eos|> need 6)")
    temperature: float = knob(1.0, "sampling temperature (the trainer's log-probs use the same)")
    top_p: float = knob(1.0, "nucleus sampling threshold")
    rollout_precision: str = knob("fp32", "precision of the rollout engine's weights and KV cache",
                                  choices=("fp32", "bf16"))
    # model and optimisation
    n_layer: int = knob(2, "transformer layers")
    n_embd: int = knob(160, "model width (2 x 160: 0.65M parameters)")
    lr: float = knob(1e-3, "GRPO learning rate (AdamW)")
    warmup_lr: float = knob(1e-3, "supervised warm-up learning rate")
    warmup_batch: int = knob(16, "problems per supervised warm-up batch")
    warmup_target_loss: float = knob(1.4, "warm up until the smoothed supervised loss is below this")
    warmup_max_steps: int = knob(300, "give up warming up after this many batches")
    clip_eps: float = knob(0.2, "PPO ratio clip")
    tis_cap: float = knob(2.0, "truncated importance sampling cap on p_train / q_rollout")
    kl_coef: float = knob(0.0, "weight of k3 KL to the warmed-up reference policy (0: off)")
    updates_per_batch: int = knob(1, "optimizer steps per rollout batch (>1 makes the clip matter)")
    grad_clip: float = knob(1.0, "max gradient norm")
    torch_threads: int = knob(1, "torch threads per process (trainer and each worker)")
    # async and weight sync
    max_staleness: int = knob(None, "async: drop groups older than this many versions (default: keep all)", type=int)
    queue_steps: int = knob(2, "async: each worker queues at most this many steps of finished groups")
    sync_method: str = knob(None, "weight transfer: copy (colocated; default), object_store (default), disk, gloo",
                            choices=("copy", "object_store", "disk", "gloo"))
    slow_sync: bool = knob(False, "fault: cap the weight transfer at --slow-sync-bandwidth")
    slow_sync_bandwidth: float = knob(1e6, "bytes/s of the throttled link under --slow-sync")
    save_checkpoints: bool = knob(False, "save every weight version to checkpoints/ (always on in async)")
    keep_checkpoints: int = knob(4, "keep the newest K version checkpoints")
    freeze_every: int = knob(20, "debug replay: freeze the step's batch every N steps (0: only on anomalies)")
    # faults (see docs/demo.md for what each looks like in rltrace)
    slow_reward: float = knob(0.0, "fault: this fraction of reward calls run slow_verifier (~0.5 s of CPU)")
    straggler: bool = knob(False, "fault: one sample per batch ignores <|eos|> and runs to 96 tokens")
    bad_template: bool = knob(False, "fault: the chat template drops the <|assistant|> generation prompt")
    hang_after: int = knob(None, "fault: a rollout worker stops answering at this step", type=int)
    hang_timeout: float = knob(20.0, "seconds the trainer waits for a rollout worker before giving up")
    overwrite: bool = knob(False, "replace --out if it already holds an rltrace run")


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m examples.tiny_grpo",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in fields(Config):
        flag, meta = "--" + f.name.replace("_", "-"), dict(f.metadata)
        if isinstance(f.default, bool):
            parser.add_argument(flag, action="store_true", help=meta["help"])
        else:
            meta.setdefault("type", type(f.default) if f.default is not None else str)
            parser.add_argument(flag, default=f.default, **meta)
    cfg = Config(**vars(parser.parse_args(argv)))
    problem = validate(cfg)
    if problem:
        parser.error(problem)
    return cfg


def validate(cfg: Config) -> str | None:
    """What is wrong with `cfg`, as one line naming the flag, or None. Fills the default sync method."""
    colocated = cfg.placement == "colocated"
    if not colocated and importlib.util.find_spec("ray") is None:
        return "--placement disaggregated needs Ray: pip install 'rltrace[ray]' (or run colocated)"
    if cfg.sync_method is None:
        cfg.sync_method = "copy" if colocated else "object_store"
    if colocated and cfg.mode == "async":
        return "--mode async needs --placement disaggregated (colocated rollout and training take turns)"
    if colocated != (cfg.sync_method == "copy"):
        return f"--sync-method {cfg.sync_method} does not fit --placement {cfg.placement} (copy is colocated-only)"
    for name in ("steps", "prompts_per_step", "rollout_workers", "digits", "max_new_tokens", "keep_checkpoints",
                 "updates_per_batch", "torch_threads", "queue_steps", "warmup_batch"):
        if getattr(cfg, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}"
    if cfg.freeze_every < 0:
        return f"--freeze-every must be >= 0 (0: freeze only on anomalies), got {cfg.freeze_every}"
    if cfg.group_size < 2:
        return f"--group-size must be >= 2 (advantages compare samples of a group), got {cfg.group_size}"
    if not 0.0 <= cfg.slow_reward <= 1.0:
        return f"--slow-reward is a fraction of reward calls in [0, 1], got {cfg.slow_reward}"
    if not 0.0 < cfg.top_p <= 1.0 or cfg.temperature <= 0:
        return "--top-p must be in (0, 1] and --temperature > 0"
    if cfg.max_staleness is not None and cfg.max_staleness < 0:
        return f"--max-staleness must be >= 0, got {cfg.max_staleness}"
    if 11 + cfg.digits + max(cfg.max_new_tokens, STRAGGLER_TOKENS) > PolicyConfig.block_size:
        return "--digits and --max-new-tokens leave no room in the 128-token context"
    return None


def _refuse(message: str):
    print(f"tiny_grpo: {message}", file=sys.stderr)
    raise SystemExit(2)


def prepare_out(cfg: Config) -> Path:
    """Make `--out` ready: refuse to mix into an existing run unless --overwrite replaces it."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        _refuse(f"--out {out} is a file; pass a directory")
    if out.exists() and (out / "run.json").exists():
        if not cfg.overwrite:
            _refuse(f"{out} already holds an rltrace run; pass --overwrite to replace it or choose another --out")
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        _refuse(f"{out} exists, is not empty and is not an rltrace run; choose another --out")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    return out


# --- the phases ---------------------------------------------------------------------------------
def warmup(policy: Policy, tokenizer: Tokenizer, cfg: Config) -> tuple[int, float]:
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
        smoothed = loss.item() if smoothed is None else 0.8 * smoothed + 0.2 * loss.item()
        if smoothed < cfg.warmup_target_loss:
            break
    return batches, smoothed


def score(samples, rng: random.Random, slow_fraction: float) -> list[float]:
    """One reward call per sample; a `slow_fraction` of them go through the slow verifier."""
    return [
        (slow_verifier if rng.random() < slow_fraction else reward)(s.problem, s.response_text) for s in samples
    ]


def train_step(policy, ref, opt, samples, rewards, cfg: Config, pad_id: int) -> dict:
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
                stats = grpo.mismatch(old_logp, rollout_logp, mask, cfg.tis_cap)
            loss = grpo.policy_loss(logp, old_logp, rollout_logp, advantages, mask,
                                    clip_eps=cfg.clip_eps, tis_cap=cfg.tis_cap)
            if ref_logp is not None:
                kl = grpo.kl_k3(logp, ref_logp, mask)
                loss = loss + cfg.kl_coef * kl
                stats["kl_ref"] = kl.item()
        with rltrace.phase("backward", update=update):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with rltrace.phase("optimizer", update=update):
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            opt.step()
    stats.update(loss=loss.item(), grad_norm=grad_norm.item(), advantages=advantages.tolist())
    return stats


def save_version(policy: Policy, folder: Path, version: int, keep: int) -> int:
    """`policy_v{version:06d}.pt`, keeping the newest `keep` of them (for replay); returns bytes written."""
    size = save_checkpoint(policy, folder / f"policy_v{version:06d}.pt")
    for old in sorted(folder.glob("policy_v*.pt"))[:-keep]:
        old.unlink()
    return size


# --- the loop -----------------------------------------------------------------------------------
def run_trainer(cfg: Config, display, rollout) -> tuple[int, str]:
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


def train(cfg: Config, display, rollout) -> None:
    """Run the whole demo into `cfg.out` (already prepared); `display.step(row)` gets each step's summary."""
    ckpt = Path(cfg.out) / "checkpoints"
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    tokenizer = Tokenizer()
    policy = Policy(RolloutSettings.from_config(cfg).policy)  # the same model as the engines
    write_model_config(ckpt, policy.config, tokenizer, rollout_precision=cfg.rollout_precision,
                       temperature=cfg.temperature, top_p=cfg.top_p)
    keep_versions = cfg.save_checkpoints or cfg.mode == "async"
    throttle = lambda: weight_sync.Throttle(cfg.slow_sync_bandwidth if cfg.slow_sync else None)  # noqa: E731
    try:
        with rltrace.phase("warmup") as span:
            display.status("supervised warm-up")
            n, loss = warmup(policy, tokenizer, cfg)
            span.set(batches=n, loss=loss)
        display.warmup_done(n, loss)
        ref = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef > 0 else None
        with rltrace.phase("weight_sync", weight_version=0, method=rollout.method) as span:
            span.set(bytes=rollout.sync_weights(weight_sync.named_weights(policy), 0, throttle()))
        rollout.start()
        if keep_versions:
            save_version(policy, ckpt, 0, cfg.keep_checkpoints)
        opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
        reward_rng = random.Random(cfg.seed + 13)
        freezer = rltrace.replay.Freezer(rltrace.replay.FreezePolicy(  # debug replay: frozen batches are written
            every=cfg.freeze_every or None, reward_drop=0.3, bad_text=True))  # on their own thread, never waited for
        version = 0  # weights are at version v during step v; the update makes v + 1
        for step in range(cfg.steps):
            started, cpu_started = time.perf_counter(), time.process_time()
            with rltrace.phase("step", step=step, weight_version=version):
                with rltrace.phase("rollout") as span:
                    samples, dropped = rollout.rollout(cfg.prompts_per_step, step, version)
                    span.set(samples=len(samples))
                with rltrace.phase("reward") as span:
                    rewards = score(samples, reward_rng, cfg.slow_reward)
                    span.set(samples=len(samples))
                if freezer.step(step, replay.rows(samples, rewards, cfg.group_size), batch_meta=replay.batch_meta(
                        tokenizer, ckpt, version, cfg), metrics={"reward_mean": sum(rewards) / len(rewards)}):
                    replay.pin_checkpoints(policy, ckpt, version, {s.weight_version for s in samples})
                with rltrace.phase("train") as span:
                    stats = train_step(policy, ref, opt, samples, rewards, cfg, tokenizer.pad_id)
                    span.set(loss=stats["loss"])
                version += 1
                with rltrace.phase("weight_sync", weight_version=version, method=rollout.method) as span:
                    span.set(bytes=rollout.sync_weights(weight_sync.named_weights(policy), version, throttle()))
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


def record(step: int, train_version: int, samples, rewards, stats: dict, dropped: int, seconds: float) -> dict:
    """Log the step's scalars (`log_metrics`) and one row per sample (`log_samples`); returns the scalars."""
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


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    out = prepare_out(cfg)
    display = Display(cfg.steps)
    with display:
        if cfg.placement == "colocated":
            local = LocalRollout(RolloutSettings.from_config(cfg), timeout=cfg.hang_timeout)
            exit_code, problem = run_trainer(cfg, display, local)
        else:
            from examples.tiny_grpo.ray_driver import run_on_ray

            exit_code, problem = run_on_ray(cfg, display)
    if exit_code == 3:
        display.hung(problem, cfg)
    summary = {"config": asdict(cfg), "exit_code": exit_code, "steps": display.rows}
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if exit_code == 0:
        display.finished(out)
    return exit_code
