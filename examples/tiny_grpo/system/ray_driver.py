"""Disaggregated placement, seen from the process you start: Ray, the actors, progress, hangs.

    driver (this process: records nothing)
      ├─ TrainerActor   role=trainer   warm-up, GRPO steps, weight sync   (ray_actors.py)
      └─ RolloutActor×N role=rollout   generation                         (ray_actors.py)

The driver starts Ray and the actors, hands the workers' handles to the trainer and polls the
trainer for progress events (warm-up done, one row per step), which it prints. Hangs are bounded
twice: the trainer bounds every wait on a worker by `--hang-timeout` (its `wait` span ends with
ERROR and it returns exit code 3), and the driver gives up on a trainer that stops answering its
polls for as long. Either way every actor is asked to flush what it recorded (a hung span stays
open in the store) before Ray shuts down.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from examples.tiny_grpo.system.placement import close_actors
from examples.tiny_grpo.system.worker import RolloutSettings

POLL_S = 0.5  # how often the driver asks the trainer for progress
STARTUP_S = 120.0  # the trainer's process may take this long to start on a loaded machine


def run_on_ray(cfg, display) -> tuple[int, str]:
    """Run the trainer and `cfg.rollout_workers` workers as Ray actors; returns (exit code, problem)."""
    import ray

    from examples.tiny_grpo.system.ray_actors import RolloutActor, TrainerActor

    out = Path(cfg.out).resolve()  # actors may start in another working directory
    cfg = dataclasses.replace(cfg, out=str(out))
    (out / "weight_sync").mkdir(exist_ok=True)
    # Local actors inherit this process's environment (RLTRACE_*, PYTHONPATH) and find `examples`
    # through its working directory; on a cluster pass a runtime_env.
    ray.init(num_cpus=cfg.rollout_workers + 1, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    try:
        display.status("starting Ray actors")
        settings = RolloutSettings.from_config(cfg)
        worker = ray.remote(RolloutActor).options(num_cpus=1, max_concurrency=4)
        workers = [worker.remote(cfg.out, i, cfg.rollout_workers, settings, str(out / "weight_sync"),
                                 cfg.torch_threads) for i in range(cfg.rollout_workers)]
        trainer = ray.remote(TrainerActor).options(num_cpus=1, max_concurrency=2).remote(cfg)
        exit_code, problem = _follow(trainer, trainer.train.remote(workers), cfg.hang_timeout, display)
        if exit_code != 0:
            close_actors([trainer, *workers])
        return exit_code, problem
    finally:
        ray.shutdown()


def _follow(trainer, done, hang_timeout: float, display) -> tuple[int, str]:
    """Replay the trainer's progress until `done` (its `train` call) finishes or it stops answering."""
    import ray
    from ray.exceptions import GetTimeoutError

    seen, answer_within = 0, max(hang_timeout, STARTUP_S)
    while True:
        finished, _ = ray.wait([done], timeout=POLL_S)
        try:
            events = ray.get(trainer.progress.remote(seen), timeout=answer_within)
        except GetTimeoutError:
            return 3, f"the trainer did not answer the driver within {answer_within:g} s"
        display.replay(events)
        seen, answer_within = seen + len(events), hang_timeout
        if finished:
            exit_code, problem = ray.get(done)
            return exit_code, problem
