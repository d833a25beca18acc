"""Dashboard pages on a 1M-span run, timed with Streamlit's AppTest (server side: queries, analyses,
figures; not the browser's drawing).

    python benchmarks/bench_ui.py [--spans 1000000] [--dir /tmp/rltrace-bench-ui]

Target: every page renders in under 2 s on a 1M-span run. For each page, "first" is
a script run after clearing every Streamlit cache (new connection, every query computed),
"cached" the run right after it. Baseline in the same process: the same page on a small run
(~10,000 spans), i.e. what Streamlit and the page cost before the run's size counts.

The runs are bench_analysis.py's synthetic runs (10 processes, ~10,000 spans a step, samples and
metrics), plus 4 frozen batches of 256 samples (real `rltrace.replay.freeze`) and 20 profiles
with 15 top frames each (rows in the store schemas), compacted with `rltrace compact` (merged
parts + stored per-step summaries).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import streamlit as st
from rich.console import Console
from rich.table import Table
from streamlit.testing.v1 import AppTest

import rltrace
import rltrace.replay
from bench_analysis import generate
from rltrace import _names, store
from rltrace.cli import main as cli
from rltrace.store.parts import write_part
from ui.state import PAGES  # every page the dashboard has

APP = Path(__file__).resolve().parents[1] / "ui" / "app.py"
TARGET_S = 2.0
BATCHES, BATCH_SAMPLES = 4, 256  # frozen batches added to each run, samples in each
PROFILES, FRAMES = 20, 15  # profiles attached to the longest spans, top frames of each


def add_batches(run_dir: Path, rng: np.random.Generator) -> None:
    """Frozen batches through the real API: tokens and both engines' per-token log-probs."""
    rltrace.init(run_dir, role="bench-freezer", rank=0)
    for k in range(BATCHES):
        samples = []
        for i in range(BATCH_SAMPLES):
            n = int(rng.integers(200, 400))
            rollout = -rng.exponential(1.0, n).astype(np.float32)
            samples.append({"sample_id": i, "reward": float(rng.random() < 0.5), "response_tokens": rng.integers(0, 32000, n),
                            "rollout_log_probs": rollout, "train_log_probs": rollout + rng.normal(0, 1e-3, n).astype(np.float32),
                            "loss_mask": np.ones(n, np.int8), "response_text": "x" * n})
        rltrace.replay.freeze(10 * k + 1, samples, trigger="every_n")
        rltrace.replay.flush()
    rltrace.shutdown()


def add_profiles(run_dir: Path) -> None:
    """Profile rows (and their top frames) in the store schemas, attached to the longest spans."""
    longest = store.open(run_dir).execute(
        "SELECT trace_id, span_id, phase, step, process_id, role, rank FROM spans ORDER BY duration_s DESC LIMIT ?",
        [PROFILES]).fetchall()
    rows, frames = [], []
    for n, (trace_id, span_id, phase, step, process_id, role, rank) in enumerate(longest):
        rows.append({"profile_id": f"p{n:04d}", "trace_id": trace_id, "span_id": span_id, "phase": phase, "step": step,
                     "process_id": process_id, "role": role, "rank": rank, "kind": "pyspy_record", "trigger": "slow",
                     "status": "ok", "reason": "bench", "samples": 500})
        frames += [{"profile_id": f"p{n:04d}", "rank": r, "frame": f"fn_{r}", "file": "bench.py", "line": r,
                    "self_share": 0.5 / (r + 1), "total_share": 1.0 / (r + 1), "samples": 100 // (r + 1)} for r in range(FRAMES)]
    write_part(run_dir / _names.PROFILES.folder, "bench.parquet", pa.Table.from_pylist(rows, schema=_names.PROFILES_SCHEMA),
               _names.PROFILES)
    write_part(run_dir / _names.PROFILE_FRAMES.folder, "bench.parquet",
               pa.Table.from_pylist(frames, schema=_names.PROFILE_FRAMES_SCHEMA), _names.PROFILE_FRAMES)


def make_run(root: Path, spans: int) -> Path:
    run_dir = root / f"run-{spans}"
    if not (run_dir / "summary").is_dir():  # reuse a finished run; otherwise build it again
        shutil.rmtree(run_dir, ignore_errors=True)
        generate(run_dir, spans)
        add_batches(run_dir, np.random.default_rng(0))
        cli(["compact", str(run_dir)])
        add_profiles(run_dir)
    return run_dir


def time_pages(run_dir: Path, repeat: int) -> dict[str, tuple[float, float]]:
    """Per page: median seconds of the first (caches cleared) and the cached script run."""
    os.environ["RLTRACE_UI_RUNS"] = str(run_dir)
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.run()  # imports, and the sidebar's run info
    out = {}
    for page in PAGES:
        first, cached = [], []
        for _ in range(repeat):
            st.cache_data.clear()
            st.cache_resource.clear()
            at.switch_page(PAGES[page])
            t = time.perf_counter()
            at.run()
            first.append(time.perf_counter() - t)
            t = time.perf_counter()
            at.run()
            cached.append(time.perf_counter() - t)
            assert not at.exception, f"{page}: {[e.message for e in at.exception]}"
        out[page] = (statistics.median(first), statistics.median(cached))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans", type=int, default=1_000_000)
    p.add_argument("--baseline-spans", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3, help="runs per page (medians)")
    p.add_argument("--dir", default="/tmp/rltrace-bench-ui")
    args = p.parse_args()
    root = Path(args.dir)
    t = time.perf_counter()
    big, small = make_run(root, args.spans), make_run(root, args.baseline_spans)
    setup = time.perf_counter() - t
    time_pages(small, 1)  # warm up: imports and first-use costs land here, not on a page
    base = time_pages(small, args.repeat)
    big_t = time_pages(big, args.repeat)

    table = Table(title=f"bench_ui: {args.spans:,} spans vs {args.baseline_spans:,} (baseline), "
                        f"{os.cpu_count()} cores, medians of {args.repeat}; runs ready in {setup:.0f} s")
    for col in ("page", "target", "first", "cached", "baseline first", "baseline cached", "first / baseline", "ok"):
        table.add_column(col, justify="left" if col == "page" else "right")
    for page in PAGES:
        (f, c), (bf, bc) = big_t[page], base[page]
        table.add_row(page, f"< {TARGET_S:.0f} s", f"{f:.2f} s", f"{c:.2f} s", f"{bf:.2f} s", f"{bc:.2f} s",
                      f"{f / bf:.1f}x", "yes" if f < TARGET_S and c < TARGET_S else "NO")
    Console().print(table)


if __name__ == "__main__":
    main()
