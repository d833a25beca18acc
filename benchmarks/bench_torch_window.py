"""What a torch.profiler window costs a CPU train step, and whether that cost lands inside a span.

    python benchmarks/bench_torch_window.py [--steps 24] [--windows 8-17] [--repeats 2] [--before DIR]

A loop shaped like the README's (sibling phases `rollout`, `train`, `weight_sync` per step, no
step container; a small MLP trained on CPU, torch on one thread), each step timed by the loop's
own clock. Per step: its wall time and the part of it inside no span (the loop's time minus the
union of the step's spans). Two variants in fresh processes, rounds alternating: no window
(baseline) and a torch.profiler window on each `train` phase of steps `--windows`
(`RLTRACE_TORCH_PROFILE=train:A-B`). Figures are medians over the window steps. `--before DIR`:
the same two variants again with DIR (an older checkout, e.g. `git archive REV | tar -x -C DIR`)
first on PYTHONPATH, in the same rounds: that release against this one in one sitting.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(run_dir: str, steps: int, out: str) -> None:
    """The traced loop; writes [(step, start_ns, end_ns), ...] of the loop's own clock to `out`."""
    import torch

    import rltrace

    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                 torch.nn.Linear(512, 1))
    engine = copy.deepcopy(policy)  # the rollout's copy of the weights, synced each step
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-4)
    rltrace.init(run_dir, role="trainer", rank=0)
    clock = []
    for step in range(steps):
        start = time.time_ns()
        with rltrace.phase("rollout", step=step), torch.no_grad():
            batch = torch.randn(256, 256)
            target = engine(batch)
        with rltrace.phase("train", step=step):
            for _ in range(4):
                loss = (policy(batch) - target).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with rltrace.phase("weight_sync", step=step):
            engine.load_state_dict(policy.state_dict())
        clock.append((step, start, time.time_ns()))
    rltrace.shutdown()
    Path(out).write_text(json.dumps(clock))


def measure(run_dir: Path, clock: list, steps: set[int]) -> tuple[list[float], list[float], list[float]]:
    """Per step of `steps`: wall ms, ms inside no span, ms of the train span."""
    from rltrace import store

    con = store.open(run_dir)
    try:
        spans = con.execute("SELECT step, name, start_ns, end_ns FROM spans WHERE end_ns IS NOT NULL").fetchall()
    finally:
        con.close()
    wall, outside, train = [], [], []
    for step, start, end in clock:
        if step not in steps:
            continue
        inside = sorted((max(s, start), min(e, end)) for _, _, s, e in spans if e > start and s < end)
        covered, reach = 0, start
        for s, e in inside:  # the union of the step's spans, clipped to the loop's clock
            if e > reach:
                covered += e - max(s, reach)
                reach = e
        wall.append((end - start) / 1e6)
        outside.append((end - start - covered) / 1e6)
        train += [(e - s) / 1e6 for st, name, s, e in spans if st == step and name == "train"]
    return wall, outside, train


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--windows", default="8-17", help="steps whose train phase is profiled (A-B)")
    parser.add_argument("--repeats", type=int, default=2, help="processes per variant, alternating")
    parser.add_argument("--before", metavar="DIR", help="an older checkout to measure in the same rounds")
    parser.add_argument("--child", nargs=2, metavar=("RUN_DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.steps, args.child[1])
        return 0
    first, last = (int(x) for x in args.windows.split("-"))
    window_steps = set(range(first, last + 1))
    here = str(Path(__file__).resolve().parents[1])
    variants = [(f"{who}, {what}", path, what == "window") for who, path in
                ((("before", str(Path(args.before).resolve())),) if args.before else ()) + (("now", here),)
                for what in ("no window", "window")]
    results: dict[str, tuple[list, list, list]] = {name: ([], [], []) for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for k, (name, path, window) in enumerate(variants if r % 2 == 0 else variants[::-1]):
                run_dir, out = Path(tmp) / f"run-{r}-{k}", Path(tmp) / f"clock-{r}-{k}.json"
                env = {k: v for k, v in os.environ.items() if not k.startswith("RLTRACE_")}
                env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
                if window:
                    env["RLTRACE_TORCH_PROFILE"] = f"train:{args.windows}"
                subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", str(run_dir), str(out)],
                               env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for into, got in zip(results[name], measure(run_dir, json.loads(out.read_text()), window_steps)):
                    into += got
    base_wall = statistics.median(results["now, no window"][0])
    print(f"steps {args.windows} of {args.steps}, {args.repeats} process(es) a variant, medians in ms; "
          f"ratio: step wall time over now without a window")
    print(f"{'variant':<22}{'step wall':>10}{'ratio':>8}{'train span':>12}{'outside every span':>20}")
    for name, (wall, outside, train) in results.items():
        print(f"{name:<22}{statistics.median(wall):>10.1f}{statistics.median(wall) / base_wall:>8.2f}"
              f"{statistics.median(train):>12.1f}{statistics.median(outside):>20.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
