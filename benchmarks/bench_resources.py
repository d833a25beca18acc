"""CPU cost of resource sampling (`init(resources=True)`) at its default rate, against no sampling.

    python benchmarks/bench_resources.py [--seconds 8] [--rounds 4] [--interval 1.0]

Each round records into a fresh run for `--seconds` while the main thread sleeps, once with
sampling and once without (alternating, so machine noise hits both alike), and measures the
process's CPU time (every thread: the writer, the heartbeat and the sampler). The difference,
divided by wall time, is what sampling costs as a share of one CPU (goal: < 0.5 %).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

import rltrace


def cpu_share(sample: bool, seconds: float, interval: float) -> float:
    """Share of one CPU this process used while recording for `seconds` with the main thread asleep."""
    with tempfile.TemporaryDirectory() as tmp:
        rltrace.init(tmp, role="bench", resources=sample, resources_interval=interval)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with rltrace.phase("train", step=0):
            time.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        rltrace.shutdown()
    return cpu / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default: the default rate)")
    args = parser.parse_args(argv)
    off, on = [], []
    for _ in range(args.rounds):
        off.append(cpu_share(False, args.seconds, args.interval))
        on.append(cpu_share(True, args.seconds, args.interval))
    off_m, on_m = statistics.median(off), statistics.median(on)
    cost = on_m - off_m
    table = Table(title=f"resource sampling every {args.interval:g} s, {args.rounds} rounds of {args.seconds:g} s")
    for col in ("", "CPU (% of one core, median)", "ratio"):
        table.add_column(col)
    table.add_row("no sampling (baseline)", f"{100 * off_m:.3f} %", "1.00x")
    table.add_row("sampling", f"{100 * on_m:.3f} %", f"{on_m / off_m:.2f}x" if off_m else "-")
    table.add_row("cost of sampling", f"{100 * cost:.3f} %", "goal < 0.5 %")
    Console().print(table)
    return 0 if cost < 0.005 else 1


if __name__ == "__main__":
    sys.exit(main())
