"""What joining engine requests to their sample groups costs the prefix-cache figure
(docs/analysis.md, "Prefix cache and HiCache").

    python benchmarks/bench_stale_groups.py [--requests 40000] [--dir /tmp/rltrace-bench-groups]

A synthetic run: two weight versions, the second sync recorded as not flushing; after it, groups of
8 requests on one engine (1,000-token prompts, the group's first hitting 200 tokens, the others
1,000). Two runs alike but for the join: in one each request's span is a child of its caller's
`generate` span carrying `rl.group_id` (as `rltrace.inject()` makes it), in the other the request
spans have no parent (no join possible: every hit counted whole). Timed: `serving.prefix_cache` on
the run's request rows (the engine-requests table built before), CPU seconds, the median of 3.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rltrace import store
from rltrace.analysis import serving
from rltrace.testing import RunBuilder

GROUP = 8


def build(run_dir: Path, n: int, joined: bool) -> None:
    b = RunBuilder(run_dir)
    trainer = b.process("trainer")
    trainer.span("weight_sync", 0.0, 0.1, step=0, weight_version=1)
    trainer.span("weight_sync", 1.0, 1.1, step=1, weight_version=2, cache_flushed=False)
    trainer.span("rollout", 1.2, 1.2 + n * 0.001 + 1, step=2)
    engine = b.process("vllm", 0)
    engine.span("generate", 0.5, 0.6, prompt_tokens=1000, cached_tokens=0, e2e_latency=0.1)
    for k in range(n):
        t = 1.2 + k * 0.001
        caller = trainer.span("generate", t, t + 0.0009, step=2, group_id=k // GROUP) if joined else None
        engine.span("engine", t, t + 0.0009, parent=caller, name="llm_request", prompt_tokens=1000,
                    cached_tokens=200 if k % GROUP == 0 else 1000, e2e_latency=0.0009)
    b.write()


def measure(run_dir: Path) -> tuple[float, dict]:
    times, figure = [], None
    for _ in range(3):
        con = store.open(run_dir)
        req = serving.engine_requests(con, columns=serving._COLUMNS)
        start = time.process_time()
        figure, _ = serving.prefix_cache(req, lambda rows: serving.groups_of(con, rows))
        times.append(time.process_time() - start)
    return statistics.median(times), figure


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=40_000)
    p.add_argument("--dir", type=Path, default=Path("/tmp/rltrace-bench-groups"))
    a = p.parse_args()
    for joined in (False, True):
        run_dir = a.dir / ("joined" if joined else "alone")
        if not run_dir.exists():
            build(run_dir, a.requests, joined)
        cpu, f = measure(run_dir)
        print(f"{'joined to groups' if joined else 'no trace context'}: prefix_cache {cpu * 1000:,.0f} ms CPU; "
              f"{f['stale_cached_tokens']:,.0f} stale tokens, {f['stale_kind']}")


if __name__ == "__main__":
    main()
