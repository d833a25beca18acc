"""A stand-alone process that records into a run, for tests that need real separate processes.

    python -m tests.writer_process RUN_DIR --rank 3 --steps 50 [--seed 1337] [--forever]

It seeds `random` like RL code does, then records `--steps` steps (a step span with a rollout
and a train child, one metric row and `--samples` sample rows each). With `--forever` it first
opens a `train` phase that never ends, then records steps without end, printing
"ended <step> <end_ns>" after each step span so a test can kill it with SIGKILL mid-write and
know which spans had ended when.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import rltrace


def step(i: int, samples: int) -> None:
    with rltrace.phase("step", step=i, weight_version=i):
        with rltrace.phase("rollout"):
            pass
        with rltrace.phase("train"):
            pass
    rltrace.log_metrics(i, loss=float(i))
    if samples:
        rltrace.log_samples(i, [{"sample_id": i * samples + j, "reward": 1.0} for j in range(samples)])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--role", default="trainer")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--flush-interval", type=float, default=None)
    parser.add_argument("--forever", action="store_true")
    args = parser.parse_args()
    if args.seed is not None:
        random.seed(args.seed)  # what every rank of an RL job does
    rltrace.init(args.run_dir, role=args.role, rank=args.rank, flush_interval=args.flush_interval)
    if not args.forever:
        for i in range(args.steps):
            step(i, args.samples)
        rltrace.shutdown()
        return 0
    with rltrace.phase("train", step=-1, note="never ends"):
        i = 0
        while True:
            with rltrace.phase("step", step=i):
                with rltrace.phase("rollout"):
                    pass
            print(f"ended {i} {time.time_ns()}", flush=True)
            i += 1
            time.sleep(0.002)


if __name__ == "__main__":
    sys.exit(main())
