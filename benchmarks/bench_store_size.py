"""Bytes on disk per span once the writers of a run have exited, nobody having compacted it.

    python benchmarks/bench_store_size.py [--processes 8] [--rate 20] [--seconds 25]

Each of `--processes` real processes calls `rltrace.init` and records `--rate` spans a second (a
`generate` phase with a sample id, every 20th inside a `rollout` of its step) for `--seconds`,
then exits. Measured: the run directory's bytes (every file: parts, summaries, process records,
manifest) and the spans folder's, per span. Baseline in the same sitting: the same processes with
`RLTRACE_MERGE_PARTS=0`, which leaves the parts as written (what earlier releases left).
Goal: <= 150 bytes a span with merging.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

WRITER = """
import sys, time, rltrace
run_dir, rank, seconds, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rltrace.init(run_dir, role="rollout", rank=rank)
t0, i = time.monotonic(), 0
while time.monotonic() - t0 < seconds:
    with rltrace.phase("rollout", step=i // 20):
        for _ in range(min(20, max(1, int(rate)))):
            with rltrace.phase("generate", sample_id=f"s{rank}-{i}"):
                i += 1
            time.sleep(1 / rate)
rltrace.shutdown()
"""


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def record(run_dir: Path, processes: int, rate: float, seconds: float, merge: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env["RLTRACE_MERGE_PARTS"] = "1" if merge else "0"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(r), str(seconds), str(rate)], env=env)
             for r in range(processes)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("a writer failed")
    from rltrace import store

    spans = store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone()[0]
    files = sum(1 for p in run_dir.rglob("*") if p.is_file())
    return {"spans": spans, "files": files, "run": _size(run_dir) / spans, "spans_folder": _size(run_dir / "spans") / spans}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--rate", type=float, default=20.0, help="spans a second per process")
    p.add_argument("--seconds", type=float, default=25.0)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rltrace-size-"))
    try:
        plain = record(root / "plain", args.processes, args.rate, args.seconds, merge=False)
        merged = record(root / "merged", args.processes, args.rate, args.seconds, merge=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t = Table(title=f"Bytes on disk per span after exit: {args.processes} processes x {args.rate:g} spans/s x {args.seconds:g} s")
    for col in ("writers", "spans", "files", "run dir B/span", "spans/ B/span", "goal"):
        t.add_column(col, justify="left" if col == "writers" else "right")
    t.add_row("parts left as written (RLTRACE_MERGE_PARTS=0, baseline)", f"{plain['spans']:,}", str(plain["files"]),
              f"{plain['run']:.0f}", f"{plain['spans_folder']:.0f}", "")
    t.add_row("writers merge their own parts (default)", f"{merged['spans']:,}", str(merged["files"]),
              f"{merged['run']:.0f}", f"{merged['spans_folder']:.0f}", "<= 150")
    Console().print(t)
    Console().print(f"ratio merged/plain (run dir): {merged['run'] / plain['run']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
