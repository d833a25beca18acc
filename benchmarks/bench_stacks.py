"""What the stack thread (`rltrace.stacks`) costs a traced process, measured side by side.

    python benchmarks/bench_stacks.py [--spans 50000] [--rounds 5]

Per-span cost of `rltrace.phase` with the stack thread on (the default) against off
(`RLTRACE_STACKS=0`), rounds alternating in one process so machine noise hits both alike; the
thread's own work per tick (a stat of the request record and a look at the open spans, once a
second); and one dump of every thread's stack (`rltrace stacks`, or a hang) with 20 threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

from rich.console import Console
from rich.table import Table

import rltrace
from bench_overhead import phase_round  # benchmarks/ is the script's folder: the same loop as the overhead table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=50000, help="spans per round (a round spans several ticks)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    on, off = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for stacks, out in ((True, on), (False, off)) if r % 2 == 0 else ((False, off), (True, on)):
                os.environ["RLTRACE_STACKS"] = "1" if stacks else "0"
                rltrace.init(f"{tmp}/run-{stacks}", role="bench")
                out.append(phase_round(args.spans))
                rltrace.shutdown()
        os.environ["RLTRACE_STACKS"] = "1"
        run = rltrace.init(f"{tmp}/dump", role="bench")
        from rltrace.stacks import StackThread

        thread = next(c for c in run._companions if isinstance(c, StackThread))
        stop = threading.Event()

        def worker(i: int) -> None:
            with rltrace.phase("rollout", step=i):
                stop.wait()

        workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(19)]
        for w in workers:
            w.start()
        time.sleep(0.2)
        ticks = []
        for _ in range(200):
            t0 = time.perf_counter()
            thread.tick()
            ticks.append(time.perf_counter() - t0)
        dumps = []
        for _ in range(10):
            t0 = time.perf_counter()
            thread.dump("request", request_id="bench")
            dumps.append(time.perf_counter() - t0)
        stop.set()
        for w in workers:
            w.join()
        rltrace.shutdown()

    a, b = statistics.median(on), statistics.median(off)
    t = Table(title=f"rltrace.phase, median of {args.rounds} rounds x {args.spans} spans")
    for col in ("what", "µs / span", "ratio"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row("stack thread off (RLTRACE_STACKS=0): baseline", f"{b * 1e6:.2f}", "1.00")
    t.add_row("stack thread on (default)", f"{a * 1e6:.2f}", f"{a / b:.3f}")
    console = Console()
    console.print(t)
    t = Table(title="The stack thread's own work (its thread, not the training loop's)")
    for col in ("what", "median", "max"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row("one tick (once a second): request record stat, open spans, 20 threads",
              f"{statistics.median(ticks) * 1e6:.1f} µs", f"{max(ticks) * 1e6:.1f} µs")
    t.add_row("one dump, 20 threads, written as a part", f"{statistics.median(dumps) * 1e3:.2f} ms",
              f"{max(dumps) * 1e3:.2f} ms")
    console.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
