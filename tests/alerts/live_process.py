"""A process that records a run and then gets stuck in one chosen way, for the watcher's tests.

    python -m tests.alerts.live_process RUN_DIR SCENARIO [--steps 6]

Every scenario first records `--steps` quick steps (step > rollout, reward, train), flushing
after each so the store is live, then:
- stall: opens `train` for the next step and never ends it (no_progress, hang)
- starve: opens a `wait` for rollout that nothing will ever produce (starved)
- silent: keeps a `train` phase open, sleeping; the test kills it with SIGKILL (heartbeat)
- reward_drop: keeps logging steps whose reward_mean falls by 0.1 each (threshold)
It prints "ready" once the quick steps are in the store.
"""

from __future__ import annotations

import argparse
import time

import rltrace


def quick_step(step: int, reward: float = 0.5) -> None:
    with rltrace.phase("step", step=step):
        for name in ("rollout", "reward", "train"):
            with rltrace.phase(name):
                time.sleep(0.05)
    rltrace.log_metrics(step, reward_mean=reward)
    rltrace.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("scenario", choices=("stall", "starve", "silent", "reward_drop"))
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    rltrace.init(args.run_dir, role="trainer", rank=0, flush_interval=0.2)
    for step in range(args.steps):
        quick_step(step)
    print("ready", flush=True)
    if args.scenario == "reward_drop":
        for k, step in enumerate(range(args.steps, args.steps + 10)):
            quick_step(step, reward=0.4 - 0.1 * k)
        rltrace.shutdown()
        return 0
    name, attrs = ("wait", {"waiting_for": "rollout"}) if args.scenario == "starve" else ("train", {})
    with rltrace.phase("step", step=args.steps):
        with rltrace.phase(name, **attrs):
            while True:
                time.sleep(0.2)
                if args.scenario == "silent":
                    rltrace.flush()  # a heartbeat every 0.2 s until it is killed


if __name__ == "__main__":
    raise SystemExit(main())
