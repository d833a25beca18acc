"""What profiling costs a training loop.

1. Step overhead with the watchdog armed and nothing triggering, against the same loop recorded
   by rltrace without profiling (goal: ratio ~1.0). Each step is four phases around a small CPU
   job; the two setups alternate, round after round, and the median of each is compared.
2. py-spy's sampling cost on the profiled process: a fixed CPU job timed alone and while
   `py-spy record` samples the process (default rate 100/s, and 1000/s for scale).

    python benchmarks/bench_profiling.py [--steps 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import rltrace
from rltrace.profiling.policy import pyspy_executable

PHASES = ("rollout", "reward", "train", "weight_sync")


def cpu_job(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def loop_seconds(run_dir: Path, profile, steps: int, job: int) -> tuple[float, float]:
    """(CPU seconds of this thread, wall seconds) per step of a loop of four phases per step.

    The thread's CPU time is what the training thread pays, and it is not inflated by other
    processes competing for the cores; wall time is shown too."""
    rltrace.init(run_dir, profile=profile)
    cpu, wall = time.thread_time(), time.perf_counter()
    for step in range(steps):
        with rltrace.phase("step", step=step):
            for name in PHASES:
                with rltrace.phase(name):
                    cpu_job(job)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    rltrace.shutdown()
    return cpu / steps, wall / steps


def phase_overhead(root: Path, steps: int, rounds: int, job: int) -> dict[str, list[tuple[float, float]]]:
    armed = {"slow": 3, "hang_timeout": 600, "after": 600}  # armed; nothing in this loop is slow
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "armed": []}
    loop_seconds(root / "warm", False, 20, job)
    for r in range(rounds):
        results["plain"].append(loop_seconds(root / f"plain{r}", False, steps, job))
        results["armed"].append(loop_seconds(root / f"armed{r}", armed, steps, job))
    return results


def hook_cost(root: Path, calls: int = 100_000) -> float:
    """Microseconds of the watchdog's on_start + on_end for one phase, called directly."""
    from rltrace.profiling import watchdog_of

    run = rltrace.init(root / "hooks", profile={"slow": 3})
    watchdog = watchdog_of(run)
    span = run.tracer.start_span("reward", attributes={"rl.phase": "reward", "rl.step": 1})
    span.end()
    start = time.thread_time()
    for _ in range(calls):
        watchdog.on_start(span)
        watchdog.on_end(span)
    cost = (time.thread_time() - start) / calls * 1e6
    rltrace.shutdown()
    return cost


def timed_job(iterations: int, rate: int | None, pyspy: str, out: Path) -> tuple[float, float | None]:
    """(wall seconds of cpu_job(iterations), py-spy's CPU seconds per second attached or None),
    while py-spy samples this process at `rate` (None: alone).

    In blocking mode py-spy reads the process while it is paused, so its CPU share bounds the
    share of time the process is stopped: a measure that other jobs on the machine do not blur."""
    proc = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    attached = time.perf_counter()
    if rate is not None:
        command = [pyspy, "record", "--pid", str(os.getpid()), "--rate", str(rate), "--format", "speedscope"]
        proc = subprocess.Popen(command + ["--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # py-spy attaches and starts sampling; the baseline sleeps too (a sleeper is favoured on waking)
    start = time.perf_counter()
    cpu_job(iterations)
    elapsed = time.perf_counter() - start
    if proc is None:
        return elapsed, None
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spy_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, spy_cpu / (time.perf_counter() - attached)


def pyspy_overhead(root: Path, rounds: int, iterations: int) -> dict[int | None, list[tuple[float, float | None]]]:
    pyspy = pyspy_executable(None)
    times: dict[int | None, list[tuple[float, float | None]]] = {None: [], 100: [], 1000: []}
    for r in range(rounds):
        for rate in times:
            times[rate].append(timed_job(iterations, rate, pyspy, root / f"pyspy{r}-{rate}.json"))
    return times


def _row(table: Table, label: str, values: list[float], base: list[float], scale: float, unit: str) -> None:
    best, median = min(values), statistics.median(values)
    table.add_row(
        label,
        f"{best * scale:.3f} {unit}",
        f"{median * scale:.3f} {unit}",
        f"{best / min(base):.3f}",
        f"{median / statistics.median(base):.3f}",
    )


def _table(title: str, first: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in (first, "best", "median", "ratio (best)", "ratio (median)"):
        t.add_column(col, justify="left" if col == first else "right")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps per measured loop")
    parser.add_argument("--rounds", type=int, default=21, help="alternating rounds")
    parser.add_argument("--job", type=int, default=2000, help="cpu_job iterations per phase (~100-200 us)")
    parser.add_argument("--pyspy-iterations", type=int, default=5_000_000, help="CPU job timed under py-spy")
    parser.add_argument("--pyspy-rounds", type=int, default=15, help="alternating rounds of the py-spy measurement")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        loop = phase_overhead(root, args.steps, args.rounds, args.job)
        hooks = hook_cost(root)
        spy = pyspy_overhead(root, args.pyspy_rounds, args.pyspy_iterations)

    t = _table(
        f"Per step, watchdog armed and nothing triggering ({args.steps} steps x 5 phases, {args.rounds} rounds)",
        "setup",
    )
    plain_cpu, armed_cpu = [c for c, _ in loop["plain"]], [c for c, _ in loop["armed"]]
    _row(t, "rltrace, no profiling (baseline): thread CPU", plain_cpu, plain_cpu, 1e3, "ms")
    _row(t, "rltrace + armed watchdog: thread CPU", armed_cpu, plain_cpu, 1e3, "ms")
    plain_wall, armed_wall = [w for _, w in loop["plain"]], [w for _, w in loop["armed"]]
    _row(t, "rltrace, no profiling (baseline): wall", plain_wall, plain_wall, 1e3, "ms")
    _row(t, "rltrace + armed watchdog: wall", armed_wall, plain_wall, 1e3, "ms")
    console.print(t)
    console.print(f"watchdog on_start + on_end, called directly: {hooks:.2f} us per phase (thread CPU)")

    t = _table(f"py-spy sampling the process: {args.pyspy_iterations:,}-iteration CPU job, wall s", "py-spy")
    base = [wall for wall, _ in spy[None]]
    shares = []
    for rate, results in spy.items():
        label = (
            "not attached (baseline)"
            if rate is None
            else f"record --rate {rate}" + (" (default)" if rate == 100 else "")
        )
        _row(t, label, [wall for wall, _ in results], base, 1, "s")
        if rate is not None:
            shares.append(f"--rate {rate}: {statistics.median(share for _, share in results):.2%}")
    console.print(t)
    console.print(
        "py-spy CPU time per second attached (bounds the share of time the process is paused): " + ", ".join(shares)
    )
    console.print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
