"""`rltrace info` reads every page of every part (so it meets any damage a report would): what that costs.

    python benchmarks/bench_info.py [--spans 2000000] [--dir /tmp/rltrace-bench-info]

The run is bench_analysis's synthetic one with engine-like span attributes (the heaviest column).
Baseline measured in the same run: `info` reading only the columns it shows (as before the page
check). For scale: the full report of the same run (its per-step summaries computed from the spans).
Medians of 3, warm file cache.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import statistics
import time
from pathlib import Path
from unittest import mock

from bench_analysis import generate  # noqa: E402 - benchmarks/ is the script's folder

from rltrace import store
from rltrace.cli import main as cli


def _time(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spans", type=int, default=2_000_000)
    p.add_argument("--dir", default="/tmp/rltrace-bench-info")
    args = p.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    run = root / "run"
    written = generate(run, args.spans, meta=True)
    size = sum(f.stat().st_size for f in run.rglob("*.parquet")) / 2**20
    run_s = str(run)

    def info() -> None:
        assert cli(["info", run_s, "--json"]) == 0

    def info_columns_shown() -> None:
        with mock.patch.object(store, "check_pages", lambda snap: None):
            info()

    def report_raw() -> None:
        snap = store.scan(run_s)
        snap.parts["step_summary"] = []
        from rltrace import report

        report.build(store.connect(snap))

    base = _time(info_columns_shown)
    full = _time(info)
    rep = _time(report_raw, repeat=1)
    print(f"{written:,} spans, {size:.0f} MB of parts")
    print("| command | seconds | vs baseline |")
    print("| --- | --- | --- |")
    print(f"| info, columns it shows only (baseline) | {base:.2f} | 1.0x |")
    print(f"| info, every page of every part | {full:.2f} | {full / base:.1f}x |")
    print(f"| report, summaries from the spans | {rep:.2f} | {rep / base:.1f}x |")
    print(f"page check: {(full - base) / size * 1024:.1f} s per GB of parts")


if __name__ == "__main__":
    main()
