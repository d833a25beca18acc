"""What the report's serving section costs on a synthetic run whose generate spans carry SGLang's
request meta (bench_analysis.py's `--engine-meta` run: one generate span in 30 is a request).

    python benchmarks/bench_serving.py [--spans 10000000] [--dir /tmp/rltrace-bench]

Baseline measured in the same run: the whole report (`report.build`) on a fresh connection with the
sidecars of an earlier report (a live run's next report); against it, the serving section's own
share (`analysis.serving_section` on that connection once the engine-requests table is built) and
the engine-requests table itself (built once per connection; the per-step engine tables read it
too). CPU seconds (all threads), the median of 3; wall seconds vary with the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rltrace import analysis, report, store
from rltrace.analysis.engine_requests import table as requests_table

try:
    from bench_analysis import generate
except ImportError:  # run from the repository root
    from benchmarks.bench_analysis import generate


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spans", type=int, default=10_000_000)
    p.add_argument("--dir", default="/tmp/rltrace-bench")
    args = p.parse_args()
    run_dir = Path(args.dir) / f"run-{args.spans}-meta"
    if not run_dir.exists():
        generate(run_dir, args.spans, meta=True)
    report.build(store.open(run_dir))  # sidecars and summaries cached: what every later report finds
    builds, tables, sections = [], [], []
    for _ in range(3):
        builds.append(_cpu(lambda: report.build(store.open(run_dir))))
        con = store.open(run_dir)
        tables.append(_cpu(lambda: requests_table(con)))
        sections.append(_cpu(lambda: analysis.serving_section(con)))
    con = store.open(run_dir)
    requests = analysis.serving_section(con)["requests"]
    whole = statistics.median(builds)
    t = Table(title=f"Serving section, {args.spans:,} spans, {requests:,} engine requests (CPU s, median of 3)")
    for col in ("what", "CPU s", "share of the report"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row("report.build, sidecars cached (baseline)", f"{whole:.2f}", "100%")
    t.add_row("  engine-requests table (once per connection)", f"{statistics.median(tables):.2f}",
              f"{statistics.median(tables) / whole:.0%}")
    t.add_row("  serving section on that table", f"{statistics.median(sections):.2f}",
              f"{statistics.median(sections) / whole:.0%}")
    Console().print(t)


if __name__ == "__main__":
    main()
