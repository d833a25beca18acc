"""A loop written from the README as a new user writes one: the README's snippet as it stands.

    python user_loop.py RUN_DIR [STEPS]

The trainer runs rollout -> reward -> train -> weight_sync, passing `step=` only to `rollout`
(the README's code). Two rollout workers are spawned processes that generate under the
trainer's carrier and load the weights each step; worker 1 generates 3x as slowly as worker 0.
The reward is slow every 6 steps: on step 5 it waits on a remote judge (a blocked call), on steps
11, 17, ... it burns CPU (a slow verifier); worker 0's weight load is slow on step 7.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

import rltrace

SLOW_EVERY = 6  # the reward is slow on steps 5, 11, 17, ...
SLEEPY_STEPS = {5}  # ... waiting on a judge on these, burning CPU on the others
SLOW_S = 1.2
SLOW_LOAD_STEP = 7
STARTUP_S = 1.5  # each worker's own start-up, beyond spawning (a fast machine spawns in under a second)


def busy(seconds: float) -> int:
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(500):
            total += i * i
    return total


def slow_verifier(seconds: float) -> int:
    """CPU-bound: the frame a profile of steps 11, 17, ... must name."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(500):
            total += i * i
    return total


def call_remote_judge(seconds: float) -> None:
    """Blocks (a request to a judge service): the frame the profile of step 5 must name."""
    time.sleep(seconds)


def score(samples: list[int], step: int) -> list[float]:
    if step in SLEEPY_STEPS:
        call_remote_judge(SLOW_S)
    elif step % SLOW_EVERY == SLOW_EVERY - 1:
        slow_verifier(SLOW_S)
    else:
        busy(0.01)
    return [1.0 - 1.0 / (1 + s) for s in samples]


def load_weights(seconds: float) -> None:
    """Waits on storage: the frame the profile of worker 0's slow weight load must name."""
    time.sleep(seconds)


def worker(run_dir: str, rank: int, requests, replies) -> None:
    rltrace.init(run_dir, role="rollout", rank=rank)
    time.sleep(STARTUP_S)  # builds its engine: a start-up the report must not call a wait, on any machine
    while (message := requests.get()) is not None:
        kind, carrier, step = message
        if kind == "generate":
            with rltrace.attach(carrier):
                with rltrace.phase("generate"):
                    busy(0.02 * (1 + 2 * rank))
            replies.put(step + rank)
        else:
            with rltrace.phase("weight_load"):
                load_weights(SLOW_S if (rank, step) == (0, SLOW_LOAD_STEP) else 0.005)
            replies.put(0)
    rltrace.shutdown()


def main(run_dir: str, steps: int) -> None:
    rltrace.init(run_dir, role="trainer", rank=0)
    spawn = mp.get_context("spawn")
    replies = spawn.Queue()
    requests = [spawn.Queue() for _ in range(2)]
    workers = [spawn.Process(target=worker, args=(run_dir, rank, q, replies)) for rank, q in enumerate(requests)]
    for w in workers:
        w.start()
    version = 0
    for step in range(steps):
        with rltrace.phase("rollout", step=step, weight_version=version):
            carrier = rltrace.inject()
            for q in requests:
                q.put(("generate", carrier, step))
            samples = [replies.get() for _ in requests]
        with rltrace.phase("reward"):
            rewards = score(samples, step)
        with rltrace.phase("train"):
            loss = busy(0.02) and 1.0 / (1 + step)
        with rltrace.phase("weight_sync", method="queue") as sync:
            for q in requests:
                q.put(("load", None, step))
            for _ in requests:
                replies.get()
            version += 1
            sync.set(bytes=1024)
        rltrace.log_metrics(step, reward_mean=sum(rewards) / len(rewards), loss=loss)
        rltrace.log_samples(step, [{"sample_id": i, "reward": r, "weight_version": version - 1}
                                   for i, r in enumerate(rewards)])
    for q in requests:
        q.put(None)
    for w in workers:
        w.join()
    rltrace.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
