"""What rltrace costs the tiny GRPO demo: step time instrumented vs `RLTRACE_DISABLED=1`.

    python benchmarks/bench_demo_overhead.py [--repeats 3] [--steps 40]

1. End to end: the colocated demo runs `--repeats` times in each of three variants, interleaved
   (forward, then backward order), same seed, so all do identical work (the run is deterministic):
   traced with the demo's default debug replay (a frozen batch every 20 steps), traced without
   periodic freezing, and `RLTRACE_DISABLED=1`. Step time = the demo's own
   per-step wall clock (`demo_summary.json`), first 3 steps dropped. Reported: median wall time
   and mean CPU time (every thread of the process, so rltrace's background writers count) per
   variant, and their ratios (goal: < 1.02). On a shared machine the CPU ratio is the steadier one.
2. In isolation: the exact rltrace calls one demo step makes (11 phases with inject/attach,
   log_metrics with 15 scalars, log_samples with 64 rows of the demo's columns), timed without
   the work and including the background writes (a flush ends the timing), as a fraction of the
   median step time. The machine's noise blurs this one much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]


#: name -> (RLTRACE_DISABLED, extra demo flags). "traced" leaves out the periodic frozen batches
#: (debug replay, an opt-in feature) to show what tracing itself costs.
VARIANTS = {
    "traced, default (replay every 20 steps)": (False, []),
    "traced, no periodic freezing": (False, ["--freeze-every", "0"]),
    "RLTRACE_DISABLED=1": (True, []),
}


def demo_step_times(out: Path, steps: int, disabled: bool, flags: list[str]) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (all threads of the process) of each step after the third."""
    env = dict(os.environ)
    env.pop("RLTRACE_DISABLED", None)
    if disabled:
        env["RLTRACE_DISABLED"] = "1"
    subprocess.run(
        [sys.executable, "-m", "examples.tiny_grpo", "--out", str(out), "--steps", str(steps), "--seed", "0", *flags],
        cwd=REPO, env=env, check=True, capture_output=True, text=True,
    )
    summary = json.loads((out / "demo_summary.json").read_text())
    rows = summary["steps"][3:]
    return [row["seconds"] for row in rows], [row["cpu_seconds"] for row in rows]


def one_step_of_calls(rltrace, step: int, rows: list[dict]) -> None:
    """The rltrace calls of one colocated demo step, in the same nesting, without the work."""
    with rltrace.phase("step", step=step, weight_version=step):
        with rltrace.phase("rollout") as span:
            carrier = rltrace.inject()
            with rltrace.phase("wait", waiting_for="generate"):
                with rltrace.attach(carrier), rltrace.phase("generate", step=step, weight_version=step) as g:
                    g.set(samples=64, precision="fp32")
                    g.set(response_tokens=384)
            span.set(samples=64)
        with rltrace.phase("reward") as span:
            span.set(samples=64)
        with rltrace.phase("train") as span:
            with rltrace.phase("forward", update=0):
                pass
            with rltrace.phase("backward", update=0):
                pass
            with rltrace.phase("optimizer", update=0):
                pass
            span.set(loss=0.1)
        with rltrace.phase("weight_sync", weight_version=step + 1, method="copy") as span:
            span.set(bytes=2_584_960)
    rltrace.log_metrics(step, **{f"metric_{i}": 0.5 for i in range(15)})
    rltrace.log_samples(step, list(rows))


def calls_cost_s(n_steps: int = 300) -> float:
    """Mean seconds of one step's rltrace calls (recording into a temporary run)."""
    import rltrace

    rows = [
        {
            "sample_id": i, "group_id": i // 8, "prompt_len": 15, "response_len": 6, "finish_reason": "stop",
            "reward": 0.5, "weight_version": 3, "train_version": 3, "gen_start": 1.0, "gen_end": 2.0,
            "worker_rank": 0, "advantage": 0.1, "logprob_abs_diff": 1e-7, "prompt_text": "<|bos|>" * 3,
            "response_text": "54321",
        }
        for i in range(64)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        rltrace.init(Path(tmp) / "run", role="trainer")
        for step in range(20):
            one_step_of_calls(rltrace, step, rows)
        start = time.perf_counter()
        for step in range(n_steps):
            one_step_of_calls(rltrace, step, rows)
        rltrace.flush()  # the background writes belong to the cost
        elapsed = time.perf_counter() - start
        rltrace.shutdown()
    return elapsed / n_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant, interleaved")
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps per run")
    args = parser.parse_args()
    console = Console(width=120)
    names = list(VARIANTS)
    wall: dict[str, list[float]] = {v: [] for v in names}
    cpu: dict[str, list[float]] = {v: [] for v in names}
    run_medians: dict[str, list[float]] = {v: [] for v in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for i, variant in enumerate(names if r % 2 == 0 else names[::-1]):
                console.print(f"repeat {r + 1}/{args.repeats}: {variant} ...")
                disabled, flags = VARIANTS[variant]
                w, c = demo_step_times(Path(tmp) / f"{r}-{i}", args.steps, disabled, flags)
                wall[variant].extend(w)
                cpu[variant].extend(c)
                run_medians[variant].append(statistics.median(w))
    base = names[-1]
    off_wall, off_cpu = statistics.median(wall[base]), statistics.mean(cpu[base])
    title = f"tiny GRPO colocated: {args.steps} steps x {args.repeats} runs per variant (first 3 steps dropped)"
    table = Table(title=title)
    for column in ("variant", "steps", "median wall s", "wall vs disabled", "mean CPU s", "CPU vs disabled",
                   "run medians (spread)"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for v in names:
        med, mean_cpu = statistics.median(wall[v]), statistics.mean(cpu[v])
        spread = f"{min(run_medians[v]):.3f}–{max(run_medians[v]):.3f}"
        table.add_row(v, str(len(wall[v])), f"{med:.4f}", f"{med / off_wall:.3f}", f"{mean_cpu:.4f}",
                      f"{mean_cpu / off_cpu:.3f}", spread)
    console.print(table)
    on = statistics.median(wall[names[1]])
    cost = calls_cost_s()
    console.print(
        f"one step's rltrace calls in isolation: {cost * 1e6:.0f} µs = {100 * cost / on:.2f} % of the median "
        f"traced step ({on * 1e3:.0f} ms); goal: overhead < 2 %"
    )


if __name__ == "__main__":
    main()
