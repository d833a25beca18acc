"""Receiver throughput: spans/s from OTLP/HTTP requests into the store, vs rltrace's own exporter.

    python benchmarks/bench_collect.py [--spans 200000] [--senders 4] [--batch 512]

Both paths store the same spans (RL-shaped: rl.phase, rl.step, rl.weight_version and three
other attributes) in the same sitting:
- baseline: `ParquetSpanExporter.export` on batches of SDK `ReadableSpan`s, as a process's
  `BatchSpanProcessor` calls it (row building + Parquet part per batch; span creation excluded);
- receiver: `--senders` client threads POST pre-encoded protobuf requests of `--batch` spans to
  `rltrace collect` on loopback; timed from the first request until every span is in a part
  (HTTP, protobuf decode, the same row builder, the background writer). Queue large enough that
  nothing is dropped (checked). Encoding the requests is excluded (the sender pays it).
Also prints the bytes per span of the parts each path wrote.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from rltrace import _names
from rltrace.collect import Limits, Receiver
from rltrace.otel.exporter import ParquetSpanExporter
from rltrace.store import layout
from rltrace.store.writer import ProcessInfo

PHASES = ("generate", "generate", "generate", "reward", "forward", "backward")


def make_spans(n: int, resource: Resource, seed: int = 0) -> list[ReadableSpan]:
    """`n` finished SDK spans, one trace per step, phases in a typical rollout-heavy mix."""
    t0 = 1_700_000_000 * 10**9
    rng = random.Random(seed)  # random ids, as SDKs mint them: they do not compress
    traces = [rng.getrandbits(128) for _ in range(n // 1000 + 1)]
    parents = [rng.getrandbits(64) for _ in range(n // 1000 + 1)]
    out = []
    for i in range(n):
        step = i // 1000
        ctx = SpanContext(traces[step], rng.getrandbits(64), False, TraceFlags(TraceFlags.SAMPLED))
        parent = SpanContext(traces[step], parents[step], False)
        start = t0 + i * 1_000_000
        out.append(ReadableSpan(
            name=PHASES[i % len(PHASES)], context=ctx, parent=parent, resource=resource, kind=SpanKind.INTERNAL,
            attributes={_names.PHASE: PHASES[i % len(PHASES)], _names.STEP: step, _names.WEIGHT_VERSION: step,
                        "sample_id": i % 64, "tokens": 128 + i % 300, "gen_ai.request.model": "tiny-0.6m"},
            start_time=start, end_time=start + 800_000,
        ))
    return out


def part_bytes(run_dir: Path) -> tuple[int, int]:
    parts = list((run_dir / _names.SPANS.folder).glob("*.parquet"))
    return sum(p.stat().st_size for p in parts), len(parts)


def bench_exporter(run_dir: Path, spans: list, batch: int) -> float:
    manifest = layout.create_or_join(run_dir, run_name=None, config=None)
    exporter = ParquetSpanExporter(run_dir, ProcessInfo(manifest["run_id"], "rollout", 0, "bench"), "bench")
    t = time.perf_counter()
    for i in range(0, len(spans), batch):
        exporter.export(spans[i:i + batch])
    elapsed = time.perf_counter() - t
    assert exporter.spans_written == len(spans), exporter.spans_written
    return elapsed


def bench_receiver(run_dir: Path, per_sender: list[list], batch: int) -> float:
    bodies = [[encode_spans(s[i:i + batch]).SerializeToString() for i in range(0, len(s), batch)] for s in per_sender]
    total = sum(len(s) for s in per_sender)
    limits = Limits(max_queue_spans=total + 1, max_queue_bytes=2**34, flush_interval=0.5)
    with Receiver(run_dir, "127.0.0.1", 0, limits) as r:
        def send(requests):
            for body in requests:
                req = urllib.request.Request(r.url, data=body, headers={"Content-Type": "application/x-protobuf"})
                with urllib.request.urlopen(req, timeout=300) as resp:
                    assert resp.status == 200

        threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        r.flush()
        elapsed = time.perf_counter() - t
        written = sum(s.written for s in r.senders())
    assert written == total, (written, total)
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spans", type=int, default=200_000)
    p.add_argument("--senders", type=int, default=4)
    p.add_argument("--batch", type=int, default=512)
    args = p.parse_args()
    n = args.spans // args.senders * args.senders
    resources = [Resource.create({"service.name": "rollout", "rl.rank": r}) for r in range(args.senders)]
    per_sender = [make_spans(n // args.senders, res, seed=r) for r, res in enumerate(resources)]
    everything = [s for group in per_sender for s in group]
    root = Path(tempfile.mkdtemp(prefix="rltrace-bench-collect-"))
    try:
        t_exp = bench_exporter(root / "exporter", everything, args.batch)
        t_rcv = bench_receiver(root / "receiver", per_sender, args.batch)
        (b_exp, p_exp), (b_rcv, p_rcv) = part_bytes(root / "exporter"), part_bytes(root / "receiver")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{n} spans, batches of {args.batch}, {args.senders} senders to the receiver")
    print(f"{'path':<42} {'seconds':>8} {'spans/s':>10} {'ratio':>6} {'parts':>6} {'bytes/span':>10}")
    print(f"{'rltrace exporter (ParquetSpanExporter)':<42} {t_exp:8.2f} {n / t_exp:10.0f} {1.0:6.2f} {p_exp:6d} {b_exp / n:10.1f}")
    print(f"{'rltrace collect (OTLP/HTTP protobuf)':<42} {t_rcv:8.2f} {n / t_rcv:10.0f} {t_exp / t_rcv:6.2f} {p_rcv:6d} {b_rcv / n:10.1f}")


if __name__ == "__main__":
    main()
