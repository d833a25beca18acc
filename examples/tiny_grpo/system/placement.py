"""Where the rollout runs, seen from the trainer: one interface, two placements.

Both offer `rollout(n_groups, step, version)` and `sync_weights(policy, version)` to train.py.

- `LocalRollout` (colocated): the engine lives in the trainer's process and generates on its own
  thread; the trainer waits for it (a `wait` span) and syncs weights by copying (`copy`).
- `RayRollout` (disaggregated, used inside the trainer's actor): N `RolloutActor` processes. `sync`
  mode asks them to generate each step; `async` mode lets them generate continuously and takes
  finished groups from their queues. Weights travel by `object_store`, `disk` or `gloo`.

Every blocking call is bounded by `timeout` and recorded as a `wait` span with `waiting_for`;
a worker that does not answer in time raises `RolloutTimeout`.
"""

from __future__ import annotations

import datetime
import queue
import socket
import threading
from pathlib import Path

import rltrace
from examples.tiny_grpo.system import weight_sync
from examples.tiny_grpo.system.worker import RolloutSettings, RolloutWorker, Sample


class RolloutTimeout(RuntimeError):
    """A rollout worker did not answer within the timeout (`--hang-timeout`)."""


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class LocalRollout:
    """Colocated: generation on a thread of this process, weights copied in memory."""

    method = "copy"

    def __init__(self, settings: RolloutSettings, *, timeout: float, bandwidth: float | None = None):
        self.worker = RolloutWorker(settings)
        self.timeout, self.bandwidth = timeout, bandwidth
        self._jobs: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, name="rollout-engine", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            n_groups, step, carrier = job
            try:
                with rltrace.attach(carrier):
                    result = self.worker.generate(n_groups, step)
            except Exception as exc:
                result = exc
            self._results.put(result)

    def rollout(self, n_groups: int, step: int, version: int) -> tuple[list[Sample], int]:
        """This step's samples (all at `version`) and the number of stale groups dropped (0)."""
        self._jobs.put((n_groups, step, rltrace.inject()))
        with rltrace.phase("wait", waiting_for="generate"):
            try:
                result = self._results.get(timeout=self.timeout)
            except queue.Empty:
                message = f"the rollout engine did not finish step {step} within {self.timeout:g} s"
                raise RolloutTimeout(message) from None
        if isinstance(result, Exception):
            raise result
        return result, 0

    def sync_weights(self, policy, version: int) -> int:
        """Copy the policy's weights into the engine as version `version`; returns bytes copied."""
        sender, throttle = rltrace.inject(), weight_sync.Throttle(self.bandwidth)
        load = lambda chunk: self.worker.load_weights(chunk, version, sender)  # noqa: E731
        return weight_sync.copy_into(load, weight_sync.named_weights(policy), throttle)

    def start(self) -> None:
        pass  # colocated generation runs only when asked

    def close(self) -> None:
        self._jobs.put(None)


class RayRollout:
    """Disaggregated: rollout workers as Ray actors (started by the driver, see ray_driver.py), sync or async."""

    def __init__(self, actors: list, *, mode: str, method: str, sync_dir: Path, timeout: float,
                 max_staleness: int | None, queue_groups: int, groups_per_step: int, bandwidth: float | None = None):
        self.actors, self.mode, self.method, self.timeout = actors, mode, method, timeout
        self.bandwidth = bandwidth
        self.max_staleness, self.groups_per_step, self.queue_groups = max_staleness, groups_per_step, queue_groups
        self.sync_dir = Path(sync_dir)
        self._ready = [a.ready.remote() for a in self.actors]  # workers start while the trainer warms up

    def _wait_ready(self) -> None:
        with rltrace.phase("wait", waiting_for="startup"):
            self._get(self._ready, "start", timeout=max(self.timeout, 120.0))
            if self.method == "gloo":
                self._init_gloo()
        self._ready = None

    def start(self) -> None:
        """Async: from now on every worker generates continuously (call after the first weight sync)."""
        if self.mode == "async":
            shares = _shares(self.groups_per_step, len(self.actors))
            capacities = _shares(self.queue_groups, len(self.actors))
            self._get([a.start_producing.remote(k, max(c, k)) for a, k, c in zip(self.actors, shares, capacities)],
                      "start producing")

    def _init_gloo(self) -> None:
        import torch.distributed as dist

        with socket.socket() as s:  # a free loopback port for the rendezvous
            s.bind(("127.0.0.1", 0))
            address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        world = len(self.actors) + 1
        joined = [a.init_gloo.remote(address, world, self.timeout) for a in self.actors]
        dist.init_process_group("gloo", init_method=address, rank=0, world_size=world,
                                timeout=datetime.timedelta(seconds=self.timeout))
        self._get(joined, "gloo init")

    def _get(self, refs: list, what: str, timeout: float | None = None):
        import ray
        from ray.exceptions import GetTimeoutError, RayTaskError

        timeout = self.timeout if timeout is None else timeout
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise RolloutTimeout(f"rollout worker(s) did not answer '{what}' within {timeout:g} s") from None
        except RayTaskError as exc:
            if isinstance(exc.cause, TimeoutError):
                raise RolloutTimeout(f"rollout worker(s) did not answer '{what}': {exc.cause}") from None
            raise

    def rollout(self, n_groups: int, step: int, version: int) -> tuple[list[Sample], int]:
        """This step's samples and the number of groups dropped as too stale (async only)."""
        shares = _shares(n_groups, len(self.actors))
        if self.mode == "sync":
            carrier = rltrace.inject()
            refs = [a.generate.remote(k, step, carrier) for a, k in zip(self.actors, shares)]
            with rltrace.phase("wait", waiting_for="generate"):
                results = self._get(refs, f"generate at step {step}")
            return [s for samples in results for s in samples], 0
        min_version = 0 if self.max_staleness is None else version - self.max_staleness
        refs = [a.take.remote(k, min_version, self.timeout) for a, k in zip(self.actors, shares)]
        with rltrace.phase("wait", waiting_for="generate"):
            results = self._get(refs, f"take groups at step {step}", timeout=self.timeout + 5)
        return [s for samples, _ in results for s in samples], sum(dropped for _, dropped in results)

    def sync_weights(self, policy, version: int) -> int:
        """Send the policy's weights as version `version` to every worker and wait until each has
        loaded them; returns bytes sent."""
        if self._ready is not None:
            self._wait_ready()
        named, throttle = weight_sync.named_weights(policy), weight_sync.Throttle(self.bandwidth)
        carrier = rltrace.inject()
        payload: dict = {}
        if self.method == "object_store":
            payload["refs"] = weight_sync.put_object_store(named, throttle)
            sent = weight_sync.nbytes(named)
        elif self.method == "disk":
            sent = weight_sync.write_disk(named, self.sync_dir, version, throttle)
        refs = [a.receive_weights.remote(self.method, payload, version, carrier) for a in self.actors]
        if self.method == "gloo":
            sent = weight_sync.broadcast_gloo(named, throttle)
        with rltrace.phase("wait", waiting_for="weight_load"):
            self._get(refs, f"load weights v{version}")
        if self.method == "disk":
            weight_sync.sync_file(self.sync_dir, version).unlink(missing_ok=True)
        return sent

    def close(self) -> None:
        """Flush the workers' telemetry (best effort: a hung worker may not answer); leave the gloo group."""
        close_actors(self.actors)
        if self.method == "gloo" and self._ready is None:
            import torch.distributed as dist

            dist.destroy_process_group()


def close_actors(actors: list, timeout: float = 10.0) -> None:
    """Ask each actor to flush its spans and rows to the store; a hung one has flushed what ended."""
    import ray

    try:
        ray.get([a.close.remote() for a in actors], timeout=timeout)
    except Exception:  # a hung or dead actor: its store parts were flushed while it ran
        pass
