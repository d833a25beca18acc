"""What `rltrace run` adds to the start of every Python process of a command.

Times `python -c pass` (median of N, interleaved) bare, with rltrace's start-up hook as
`rltrace run` sets it up (entry points handed down by the launcher), and with the hook scanning
the installed distributions itself (a process whose environment differs from the launcher's).

    python benchmarks/bench_launcher_startup.py [-n 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rltrace.cli.run import environment  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=20)
    n = parser.parse_args().n
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RLTRACE_")}
    bare["PYTHONPATH"] = str(REPO)
    launched = environment(Path("/tmp/rltrace-bench-startup"), bare)
    launched["RLTRACE_ENTRY_POINTS"] = subprocess.run(  # as the launcher computes it, in a process like the child
        [sys.executable, "-c", "from rltrace.integrations._load import entry_points_cache as c; print(c())"],
        env=launched, capture_output=True, text=True, check=True).stdout.strip()
    scanning = {k: v for k, v in launched.items() if k != "RLTRACE_ENTRY_POINTS"}
    cases = {"bare python": bare, "rltrace run": launched, "hook, own scan": scanning}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(n):
        for name, env in cases.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["bare python"])
    print(f"{'start-up of python -c pass':28s} {'median':>9s} {'added':>9s} {'ratio':>6s}   (n={n}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f})")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:28s} {med * 1e3:7.0f} ms {(med - base) * 1e3:+7.0f} ms {med / base:6.2f}x")


if __name__ == "__main__":
    main()
