"""The Ray actors of disaggregated mode, each in its own process, all recording into one run.

- `TrainerActor` (`role="trainer"`): the whole training loop of train.py (`run_trainer`), with a `RayRollout`
  over the workers' handles; the driver (ray_driver.py) polls it for progress.
- `RolloutActor` (`role="rollout"`, `rank=i`): a `RolloutWorker`. Calls from the trainer carry its
  trace context (`rltrace.inject()`); the actor continues it with `rltrace.attach(carrier)`, so its
  `generate` and `weight_load` spans are children of the trainer's `rollout` and `weight_sync`
  spans in one trace across the process boundary.
"""

from __future__ import annotations

import datetime
import os
import threading
from pathlib import Path

import torch

import rltrace
from examples.tiny_grpo.system import weight_sync
from examples.tiny_grpo.system.cli import sync_bandwidth
from examples.tiny_grpo.system.display import ProgressLog
from examples.tiny_grpo.system.placement import RayRollout
from examples.tiny_grpo.system.worker import RolloutSettings, RolloutWorker, Sample
from examples.tiny_grpo.train import run_trainer


class TrainerActor:
    """Wrapped with `ray.remote(...)` by the driver. `train` runs the loop on one actor thread while
    `progress` answers the driver's polls on another (`max_concurrency=2`)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.log = ProgressLog()

    def train(self, workers: list) -> tuple[int, str]:
        """The trainer's life (train.run_trainer) over the given rollout actors: (exit code, problem)."""
        threading.current_thread().name = "train-loop"  # a Ray pool thread; spans record this name
        before, cfg = set(threading.enumerate()), self.cfg
        rollout = RayRollout(
            workers, mode=cfg.mode, method=cfg.sync_method, sync_dir=Path(cfg.out) / "weight_sync",
            timeout=cfg.hang_timeout, max_staleness=cfg.max_staleness, groups_per_step=cfg.prompts_per_step,
            queue_groups=cfg.queue_steps * cfg.prompts_per_step, bandwidth=sync_bandwidth(cfg),
        )
        result = run_trainer(cfg, self.log, rollout)
        for thread in set(threading.enumerate()) - before:  # e.g. a replay checkpoint still being saved:
            if not thread.daemon:  # a plain process would wait for it at exit; Ray would kill it
                thread.join()
        return result

    def progress(self, seen: int) -> list[tuple]:
        """Progress events after the first `seen` (see display.ProgressLog)."""
        return self.log.events[seen:]

    def close(self) -> None:
        """Flush this process's spans and rows (the driver's last resort when `train` does not return)."""
        rltrace.shutdown()


class RolloutActor:
    """Wrapped with `ray.remote(...)` by the driver; plain class otherwise."""

    def __init__(self, run_dir: str, rank: int, n_workers: int, settings: RolloutSettings, sync_dir: str, threads: int):
        torch.set_num_threads(threads)  # the trainer and the workers share the machine's cores
        rltrace.init(run_dir, role="rollout", rank=rank)
        self.worker = RolloutWorker(settings, rank, n_workers)
        self.sync_dir = sync_dir

    def ready(self) -> int:
        return os.getpid()

    def init_gloo(self, address: str, world_size: int, timeout_s: float) -> None:
        """Join the trainer's gloo group as rank `1 + worker rank` (the `gloo` sync path)."""
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=address,
            rank=self.worker.rank + 1,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def generate(self, n_groups: int, step: int, carrier: dict) -> list[Sample]:
        """Sync mode: generate now, as a child span of the trainer's rollout span."""
        with rltrace.attach(carrier):
            return self.worker.generate(n_groups, step)

    def start_producing(self, groups_per_batch: int, capacity_groups: int) -> None:
        self.worker.start_producing(groups_per_batch, capacity_groups)

    def take(self, n_groups: int, min_version: int, timeout: float) -> tuple[list[Sample], int]:
        """Async mode: finished groups from the queue (see `RolloutWorker.take`)."""
        return self.worker.take(n_groups, min_version, timeout)

    def receive_weights(self, method: str, payload: dict, version: int, carrier: dict) -> int:
        """Fetch version `version` by `method` and load it into the engine; returns bytes loaded."""
        with rltrace.attach(carrier), rltrace.phase("weight_load", weight_version=version, method=method) as span:
            if method == "object_store":
                named = weight_sync.get_object_store(payload["refs"])
            elif method == "disk":
                named = weight_sync.read_disk(self.sync_dir, version)
            elif method == "gloo":
                named = {n: torch.empty(p.shape) for n, p in self.worker.engine.model.named_parameters()}
                weight_sync.broadcast_gloo(named)
            else:
                raise ValueError(f"unknown sync method {method!r}")
            loaded = self.worker.load_weights(named, version, sender=carrier)
            span.set(bytes=loaded)
        return loaded

    def close(self) -> None:
        """Stop producing and flush this process's spans and rows to the store."""
        self.worker.stop()
        rltrace.shutdown()
