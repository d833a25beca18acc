"""What the slime live hook costs slime's rollout: per trace event, and per returned rollout.

slime's own trace utilities (from the checkout named by RLTRACE_SLIME_SRC) record the spans of a
sample the way its rollout does (`generate_and_rm` around `sglang_generate` with SGLang's
attributes and `reward_model`), with and without the hook, in one process, interleaved; the
hook's work at the end of a rollout (the `samples` rows of its samples) is timed apart.

    RLTRACE_SLIME_SRC=/path/to/slime python benchmarks/bench_slime_hook.py [--samples 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.replay import slime_run  # noqa: E402

META = {"prompt_tokens": 300, "completion_tokens": 200, "cached_tokens": 128, "queue_time": 0.01, "e2e_latency": 2.0,
        "decode_throughput": 100.0, "finish_reason": {"type": "stop"}, "id": "r", "weight_version": "3"}


def samples(n: int):
    """`n` slime samples, each traced the way slime's rollout traces one (6 events)."""
    from slime.observability import trace_utils as tu
    from slime.utils.types import Sample

    out = []
    for i in range(n):
        s = Sample(index=i, group_index=i // 8, prompt="q", tokens=[1] * 500, response_length=200, reward=1.0)
        with tu.trace_span(s, "generate_and_rm"):
            with tu.trace_span(s, "sglang_generate") as span:
                span.update(tu.build_sglang_meta_trace_attrs(META))
            with tu.trace_span(s, "reward_model"):
                pass
        out.append(s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()
    if not slime_run.available():
        sys.exit(slime_run.MISSING)
    slime_run.Slime()
    import rltrace
    from rltrace.integrations import slime as hook

    rltrace.init(Path(tempfile.mkdtemp()) / "run")
    per_event = {"slime alone": [], "with the hook": []}
    for _ in range(a.rounds):
        for name in per_event:
            (hook.instrument if name == "with the hook" else hook.uninstrument)()
            t = time.perf_counter()
            samples(a.samples)
            per_event[name].append((time.perf_counter() - t) / (6 * a.samples) * 1e6)
    hook.instrument()
    ended = []
    for _ in range(a.rounds):
        batch = samples(a.samples)
        hook.live.begin(0)
        t = time.perf_counter()
        hook.live.end(0, batch)
        ended.append((time.perf_counter() - t) / a.samples * 1e6)
    hook.uninstrument()
    rltrace.shutdown()
    base, hooked = statistics.median(per_event["slime alone"]), statistics.median(per_event["with the hook"])
    print(f"| case | slime alone | with the hook | ratio |\n| --- | --- | --- | --- |")
    print(f"| one trace event (median of {a.rounds} x {6 * a.samples}) | {base:.1f} µs | {hooked:.1f} µs | {hooked / base:.2f} |")
    print(f"| samples rows at the end of a rollout, per sample | - | {statistics.median(ended):.1f} µs | - |")


if __name__ == "__main__":
    main()
