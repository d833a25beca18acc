"""Hot-path cost of rltrace against a bare OpenTelemetry SDK span, measured side by side.

    python benchmarks/bench_overhead.py [--spans 20000] [--rounds 7]

Baseline: `tracer.start_as_current_span` on an SDK `TracerProvider` with a `BatchSpanProcessor`
(default settings) and an exporter that does nothing, the cheapest an SDK span can be. rltrace:
`rltrace.phase` with the same attributes, recording to a real run directory (Parquet parts,
open-span records, drop counting). Rounds alternate so machine noise hits both alike; the table
shows medians of per-span cost over rounds and their ratio (goal: <= 1.3x).

Also: the calling thread's cost of `log_samples` with 10,000 rows (goal: < 20 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import pyarrow as pa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from rich.console import Console
from rich.table import Table

import rltrace


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def bare_round(tracer, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        with tracer.start_as_current_span("reward", attributes={"rl.phase": "reward", "rl.step": i, "rl.weight_version": i}):
            pass
    return (time.perf_counter() - t0) / n


def phase_round(n: int) -> float:
    """`rltrace.phase` as a loop uses it, recording or disabled, whichever `init` set up."""
    t0 = time.perf_counter()
    for i in range(n):
        with rltrace.phase("reward", step=i, weight_version=i):
            pass
    return (time.perf_counter() - t0) / n


def sample_rows(n: int) -> list[dict]:
    return [
        {
            "sample_id": i,
            "group_id": i // 8,
            "prompt_len": 40,
            "response_len": 100 + i % 50,
            "finish_reason": "stop",
            "reward": 0.5,
            "weight_version": 3,
            "train_version": 4,
            "gen_start": 1.0,
            "gen_end": 2.0,
        }
        for i in range(n)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=20000, help="spans per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullExporter()))
    tracer = provider.get_tracer("bench")
    with tempfile.TemporaryDirectory() as tmp:
        rltrace.init(f"{tmp}/run", role="bench")
        bare, ours = [], []
        for _ in range(args.rounds):
            bare.append(bare_round(tracer, args.spans))
            ours.append(phase_round(args.spans))
        run = rltrace.current_run()
        dropped = run.spans_dropped
        rows = sample_rows(10_000)
        table = pa.Table.from_pylist(rows)
        samples_list, samples_table = [], []
        for step in range(args.rounds):
            t0 = time.perf_counter()
            rltrace.log_samples(step, rows)
            samples_list.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            rltrace.log_samples(step, table)
            samples_table.append(time.perf_counter() - t0)
            rltrace.flush()
        rltrace.shutdown()
        rltrace.init(f"{tmp}/off", disabled=True)
        off = [phase_round(args.spans) for _ in range(args.rounds)]
        rltrace.shutdown()
    provider.shutdown()

    b, o, d = statistics.median(bare), statistics.median(ours), statistics.median(off)
    t = Table(title=f"Per-span cost, median of {args.rounds} rounds x {args.spans} spans")
    for col in ("what", "µs / span", "ratio to bare OTel", "goal"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row("bare OTel SDK span (BatchSpanProcessor, null exporter)", f"{b * 1e6:.1f}", "1.00", "")
    t.add_row("rltrace.phase (Parquet store, open-span records)", f"{o * 1e6:.1f}", f"{o / b:.2f}", "<= 1.3")
    t.add_row("rltrace.phase with RLTRACE_DISABLED", f"{d * 1e6:.2f}", f"{d / b:.3f}", "~0")
    console = Console()
    console.print(t)
    if dropped:
        console.print(f"[yellow]rltrace dropped {dropped} spans during the flood (counted in the store)[/]")
    t = Table(title="log_samples(step, 10,000 rows): calling thread's cost")
    for col in ("input", "median ms", "max ms", "goal"):
        t.add_column(col, justify="left" if col == "input" else "right")
    t.add_row("list of dicts", f"{statistics.median(samples_list) * 1e3:.2f}", f"{max(samples_list) * 1e3:.2f}", "< 20")
    t.add_row("pyarrow.Table", f"{statistics.median(samples_table) * 1e3:.3f}", f"{max(samples_table) * 1e3:.3f}", "< 20")
    console.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
