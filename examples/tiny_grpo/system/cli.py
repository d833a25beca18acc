"""`python -m examples.tiny_grpo`: the demo's flags, their checks, the run folder, and `main`.

Every knob is a field of `Config` (each is also a `--flag`); `main` picks the placement (the
rollout on a thread of this process, or Ray actors) and hands it to train.py's loop.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from examples.tiny_grpo.policy import PolicyConfig
from examples.tiny_grpo.system.display import Display
from examples.tiny_grpo.system.placement import LocalRollout
from examples.tiny_grpo.system.worker import STRAGGLER_TOKENS, RolloutSettings
from examples.tiny_grpo.train import run_trainer


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
        description="Tiny GRPO, instrumented with rltrace: rollout -> reward -> train -> weight sync, step after step.",
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


#: Written into --out first thing: a folder the demo made is its own to replace, run or not
#: (with RLTRACE_DISABLED=1 it records no run.json, only checkpoints and its summary).
MADE_BY_DEMO = ".tiny_grpo"


def prepare_out(cfg: Config) -> Path:
    """Make `--out` ready: refuse to mix into an existing run unless --overwrite replaces it."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        _refuse(f"--out {out} is a file; pass a directory")
    ours = out.exists() and any((out / name).exists() for name in (MADE_BY_DEMO, "demo_summary.json"))
    if out.exists() and ((out / "run.json").exists() or ours):
        if not cfg.overwrite:
            held = "an rltrace run" if (out / "run.json").exists() else "an earlier demo run"
            _refuse(f"{out} already holds {held}; pass --overwrite to replace it or choose another --out")
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        _refuse(f"{out} exists, is not empty and is not an rltrace run; choose another --out")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    (out / MADE_BY_DEMO).write_text("made by python -m examples.tiny_grpo; --overwrite may replace this folder\n")
    return out


def sync_bandwidth(cfg: Config) -> float | None:
    """Bytes/s the weight transfer is capped at: `--slow-sync-bandwidth` under `--slow-sync`, else None."""
    return cfg.slow_sync_bandwidth if cfg.slow_sync else None


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    out = prepare_out(cfg)
    display = Display(cfg.steps)
    with display:
        if cfg.placement == "colocated":
            local = LocalRollout(RolloutSettings.from_config(cfg), timeout=cfg.hang_timeout,
                                 bandwidth=sync_bandwidth(cfg))
            exit_code, problem = run_trainer(cfg, display, local)
        else:
            from examples.tiny_grpo.system.ray_driver import run_on_ray

            exit_code, problem = run_on_ray(cfg, display)
    if exit_code == 3:
        display.hung(problem, cfg)
    summary = {"config": asdict(cfg), "exit_code": exit_code, "steps": display.rows}
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if exit_code == 0:
        display.finished(out)
    return exit_code
