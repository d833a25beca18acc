"""A GPU-shaped RL loop whose engines sleep: the timing of a real post-training loop without a GPU.

    python -m examples.sleeping_loop runs/sleep --staleness 1 --rollout-workers 2

Each step draws `batch` response lengths from a lognormal (long-tailed, as real generations are),
splits them over the rollout engines and lets each engine "decode" its share as one static batch:
a sample finishes after `len × tok_s`, the batch when its longest sample does. The trainer
scores (reward), trains (`train_s + train_per_sample_s × batch`) and syncs weights, each a sleep.
Engines run on their own threads, so the schedule is real: with `staleness` K an engine starts
the batch of step i as soon as it finished its last one and weights of version >= i - K exist
(K = 0 is the synchronous loop); `partial` over-samples by that factor and ends each batch when
its share of samples finished, carrying the unfinished ones (with their tokens so far) into the
engine's next batch. Every phase is an rltrace span; every sample a row with its generation times,
length, weight version and engine: what `rltrace whatif` calibrates on (benchmarks/bench_whatif.py).
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

import rltrace


@dataclass
class Shape:
    """The loop's costs (seconds) and sizes; the defaults are the validation benchmark's."""

    steps: int = 40
    batch: int = 32
    rollout_workers: int = 1
    staleness: int = 0  # K: a batch may be generated with weights up to K versions old (0: synchronous)
    partial: float | None = None  # over-sampling factor of partial rollouts (None: off)
    tok_s: float = 1.6e-4  # decode time per token
    overhead_s: float = 0.002  # per engine batch (launch, prefill)
    median_tokens: float = 200.0
    sigma: float = 0.6  # lognormal spread of response lengths
    max_tokens: int = 2048
    reward_s: float = 0.005
    train_s: float = 0.060
    train_per_sample_s: float = 0.001
    sync_s: float = 0.015
    seed: int = 0


def _sleep_until(deadline: float) -> None:
    """Sleep to a perf_counter deadline (not for a duration: a late wake-up is not added up step after step)."""
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


class _Versions:
    """The newest weight version the engines can load, and a way to wait for one."""

    def __init__(self):
        self.version, self._cond = 0, threading.Condition()

    def publish(self, version: int) -> None:
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def wait_for(self, version: int) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.version >= version)
            return self.version


class _Engine(threading.Thread):
    """One rollout engine: generates its share of each step's batch, as one static batch."""

    def __init__(self, rank: int, shape: Shape, versions: _Versions, results: dict, done: threading.Condition):
        super().__init__(name=f"engine-{rank}", daemon=True)
        self.rank, self.shape, self.versions, self.results, self.done = rank, shape, versions, results, done
        self.rng = np.random.default_rng(shape.seed * 1009 + rank)
        self.share = len(range(rank, shape.batch, shape.rollout_workers))
        self.carry: list[dict] = []  # partial rollouts: unfinished samples, with what they have left
        self.next_id = 0

    def _lengths(self, n: int) -> np.ndarray:
        s = self.shape
        return np.minimum(np.ceil(self.rng.lognormal(math.log(s.median_tokens), s.sigma, n)), s.max_tokens)

    def run(self) -> None:
        s = self.shape
        for step in range(s.steps):
            version = self.versions.wait_for(step - s.staleness)
            with rltrace.phase("generate", step=step, weight_version=version, samples=self.share):
                start = time.perf_counter()
                _sleep_until(start + s.overhead_s)
                samples = self._batch(step, version, time.time(), time.perf_counter())
            with self.done:
                self.results.setdefault(step, []).extend(samples)
                self.done.notify_all()

    def _batch(self, step: int, version: int, wall0: float, t0: float) -> list[dict]:
        """Decode one batch: every slot's sample from now; returns the samples that finished in it."""
        s = self.shape
        slots = self.share if s.partial is None else math.ceil(self.share * s.partial)
        fresh = self._lengths(max(0, slots - len(self.carry)))
        for n in fresh:
            self.carry.append({"sample_id": f"{self.rank}-{self.next_id}", "response_len": int(n), "left": int(n),
                               "weight_version": version, "gen_start": wall0})
            self.next_id += 1
        batch, self.carry = self.carry, []
        finish = np.array([x["left"] * s.tok_s for x in batch])
        cut = float(np.sort(finish)[self.share - 1]) if s.partial is not None else float(finish.max())
        _sleep_until(t0 + cut)
        out = []
        for x, f in zip(batch, finish):
            if f <= cut:
                out.append({**{k: v for k, v in x.items() if k != "left"}, "gen_end": wall0 + f,
                            "worker_rank": self.rank, "train_version": step})
            else:  # partial rollout: aborted at the cut, resumed in the next batch with its tokens so far
                x["left"] -= int(cut / s.tok_s)
                self.carry.append(x)
        return out


def run(out: str, shape: Shape | None = None) -> dict:
    """Record one run of the loop into `out`; returns {"period_s": median time between step ends
    once the pipeline filled (after the first K + 2 steps), "staleness_mean", "staleness_max"}, as
    the loop itself measured them."""
    s = shape or Shape()
    rltrace.init(out, role="trainer", config=s.__dict__)
    versions, results, done = _Versions(), {}, threading.Condition()
    engines = [_Engine(r, s, versions, results, done) for r in range(s.rollout_workers)]
    for e in engines:
        e.start()
    ends, ages = [], []
    try:
        for step in range(s.steps):
            with rltrace.phase("step", step=step, weight_version=step):
                with done:
                    if len(results.get(step, ())) < s.batch:
                        with rltrace.phase("wait", waiting_for="rollout"):
                            done.wait_for(lambda: len(results.get(step, ())) >= s.batch)
                    samples = results.pop(step)
                for name, seconds in (("reward", s.reward_s), ("train", s.train_s + s.train_per_sample_s * len(samples))):
                    with rltrace.phase(name, samples=len(samples)):
                        _sleep_until(time.perf_counter() + seconds)
                with rltrace.phase("weight_sync", weight_version=step + 1, bytes=1 << 20, method="sleep"):
                    _sleep_until(time.perf_counter() + s.sync_s)
                versions.publish(step + 1)
            rltrace.log_samples(step, samples)
            ends.append(time.perf_counter())
            ages += [step - x["weight_version"] for x in samples]
    finally:
        versions.publish(s.steps + s.staleness + 1)  # nobody waits on weights after the last step
        for e in engines:
            e.join(5)
        rltrace.shutdown()
    skip = min(len(ends) - 2, 2 + s.staleness)
    return {"period_s": float(np.median(np.diff(ends)[skip:])), "staleness_mean": float(np.mean(ages)),
            "staleness_max": int(max(ages))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.sleeping_loop", description=__doc__.splitlines()[0])
    p.add_argument("out")
    for f in ("steps", "batch", "rollout_workers", "staleness", "seed"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(Shape, f))
    p.add_argument("--partial", type=float, default=None, help="over-sampling factor of partial rollouts")
    a = vars(p.parse_args(argv))
    print(run(a.pop("out"), Shape(**a)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
