"""Freeze and load of a 1024 x 2048-token batch, side by side with torch.save / torch.load.

    python benchmarks/bench_replay.py [--samples 1024] [--response-len 2048] [--repeats 5]

Measures, on the same batch and the same disk, torch and rltrace back to back in each repeat (the
machine is shared, so only ratios within one run mean anything; a ratio is the median of the
per-repeat ratios):
  freeze throughput  batch bytes / (freeze call + conversion + write, until the part is on disk)
                     vs batch bytes / torch.save                          goal >= 0.5x
  load throughput    batch bytes / (rltrace.replay.load + decoding every column)
                     vs batch bytes / torch.load(weights_only=True)       goal >= 0.33x
  caller cost        time the training thread spends in freeze()          goal <= 5 ms (median)
                     (idle writer, and while the writer converts the previous batch); the
                     max and the thread's CPU time are shown too: on a shared machine the max
                     includes preemption by other processes and the GIL held by the writer
Both layouts are measured: one [B, T] tensor per column ("columns") and one dict per sample
with ragged per-sample tensors ("rows").

    python benchmarks/bench_replay.py --demo-steps 30

instead runs the tiny GRPO demo (colocated, seed 0) in this process and reports the CPU time of
each piece of its debug replay (building the rows, the Freezer's decision, pinning checkpoints,
the writer thread, the checkpoint thread) as a share of the steps' CPU time.

    python benchmarks/bench_replay.py --batches 1000

instead freezes 1,000 small batches (one a step) and times `replay.load` of one step against
`replay list`'s read of every batch's footer and first row (what loading one step cost before it
read only that step's parts), medians of --repeats.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import rltrace
import rltrace.replay as replay

GOALS = {"freeze": 0.5, "load": 0.33}


def make_batch(n: int, response_len: int, prompt_len: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "prompt_tokens": torch.randint(0, 151_000, (n, prompt_len), generator=g),
        "response_tokens": torch.randint(0, 151_000, (n, response_len), generator=g),
        "loss_mask": torch.ones(n, response_len, dtype=torch.int32),
        "rollout_log_probs": -torch.rand(n, response_len, generator=g) * 5,
        "advantages": torch.randn(n, 1, generator=g).expand(n, response_len).contiguous(),
        "reward": torch.rand(n, generator=g),
    }


def as_rows(batch: dict[str, torch.Tensor], seed: int = 0) -> list[dict]:
    """One dict per sample with ragged responses (lengths between half and all of T)."""
    g = torch.Generator().manual_seed(seed)
    n, t = batch["response_tokens"].shape
    lengths = torch.randint(t // 2, t + 1, (n,), generator=g).tolist()
    return [
        {
            "prompt_tokens": batch["prompt_tokens"][i].clone(),
            "response_tokens": batch["response_tokens"][i, : lengths[i]].clone(),
            "loss_mask": batch["loss_mask"][i, : lengths[i]].clone(),
            "rollout_log_probs": batch["rollout_log_probs"][i, : lengths[i]].clone(),
            "reward": float(batch["reward"][i]),
        }
        for i in range(n)
    ]


def nbytes(samples) -> int:
    rows = samples if isinstance(samples, list) else [samples]
    return sum(v.numel() * v.element_size() for row in rows for v in row.values() if isinstance(v, torch.Tensor))


def _torch_round(samples, pt: Path, times: dict) -> None:
    t0 = time.perf_counter()
    torch.save(samples, pt)
    times["save"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    loaded = torch.load(pt, weights_only=True)
    times["torch_load"].append(time.perf_counter() - t0)
    del loaded


def _rltrace_round(samples, run_dir: Path, step: int, times: dict) -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    replay.freeze(step, samples)
    t1, c1 = time.perf_counter(), time.thread_time()
    replay.flush()
    times["call"].append(t1 - t0)
    times["call_cpu"].append(c1 - c0)
    times["freeze"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    batch = replay.load(run_dir, step)
    for name in batch.columns:
        batch[name]
    times["load"].append(time.perf_counter() - t0)


def measure(samples, work: Path, repeats: int) -> dict[str, list[float]]:
    """Each repeat runs torch and rltrace back to back (alternating which goes first), so the
    per-repeat ratios see the same machine load."""
    times: dict[str, list[float]] = {k: [] for k in ("save", "torch_load", "freeze", "load", "call", "call_cpu", "call_busy")}
    pt, run_dir = work / "batch.pt", work / "run"
    for step in range(repeats):
        if step % 2:
            _rltrace_round(samples, run_dir, step, times)
            _torch_round(samples, pt, times)
        else:
            _torch_round(samples, pt, times)
            _rltrace_round(samples, run_dir, step, times)
        replay.freeze(10_000 + step, samples)  # the writer is now busy converting this one
        t0 = time.perf_counter()
        replay.freeze(20_000 + step, samples)
        times["call_busy"].append(time.perf_counter() - t0)
        replay.flush()
        for part in (run_dir / "batches").glob("*.parquet"):
            part.unlink()
    return times


def report(layout: str, size: int, times: dict[str, list[float]]) -> list[tuple]:
    """Throughputs from medians; ratios as the median of per-repeat ratios (paired under the same load)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = size / 1e6
    freeze_ratio = statistics.median(s / f for s, f in zip(times["save"], times["freeze"]))
    load_ratio = statistics.median(t / ours for t, ours in zip(times["torch_load"], times["load"]))
    return [
        ("freeze MB/s", layout, mb / med["freeze"], mb / med["save"], freeze_ratio, GOALS["freeze"], ">="),
        ("load MB/s", layout, mb / med["load"], mb / med["torch_load"], load_ratio, GOALS["load"], ">="),
        ("freeze() call ms", layout, 1e3 * med["call"], 1e3 * max(times["call"]), 1e3 * med["call_cpu"], 5.0, "<="),
        ("freeze() call ms, writer busy", layout, 1e3 * med["call_busy"], 1e3 * max(times["call_busy"]), None, 5.0, "<="),
    ]


def demo_cost(steps: int, work: Path) -> None:
    """CPU time of each replay piece in a real demo run, as a share of the steps' CPU time."""
    import collections
    import functools
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: examples/
    import examples.tiny_grpo.replay as demo_replay
    from examples.tiny_grpo.system import cli
    from rltrace.replay import freezer, writer

    spent: collections.Counter[str] = collections.Counter()

    def timed(owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - start

        setattr(owner, name, wrapper)

    timed(demo_replay, "rows", "rows() (training thread)")
    timed(demo_replay, "batch_meta", "batch_meta() (training thread)")
    timed(freezer.Freezer, "step", "Freezer.step (training thread)")
    timed(demo_replay, "pin_checkpoints", "pin_checkpoints (training thread)")
    timed(writer.BatchWriter, "_write", "conversion + write (writer thread)")
    timed(demo_replay, "_save_state", "v_t checkpoint (its thread)")
    out = work / "demo"
    cli.main(["--out", str(out), "--steps", str(steps), "--seed", "0"])
    rows = json.loads((out / "demo_summary.json").read_text())["steps"]
    cpu = sum(r["cpu_seconds"] for r in rows)
    frozen = len(list((out / "batches").glob("*.parquet")))
    print(f"\ntiny GRPO demo, {steps} steps, {frozen} batches frozen; step CPU {1e3 * cpu / steps:.1f} ms (all threads)\n")
    print(f"{'piece':38} {'ms/step':>8} {'share':>7}")
    for label, seconds in spent.items():
        print(f"{label:38} {1e3 * seconds / steps:8.2f} {seconds / cpu:7.2%}")
    total = sum(spent.values())
    print(f"{'all of debug replay':38} {1e3 * total / steps:8.2f} {total / cpu:7.2%}")


def many_batches(n: int, work: Path, repeats: int) -> None:
    from rltrace.replay.browse import list_batches

    rltrace.init(work / "run")
    for step in range(n):
        replay.freeze(step, {"response_ids": torch.ones(4, 16, dtype=torch.long), "reward": torch.rand(4)})
        replay.flush()
    rltrace.shutdown()
    one, every = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        replay.load(work / "run", n // 2)
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        list_batches(work / "run")
        every.append(time.perf_counter() - t0)
    a, b = statistics.median(one) * 1e3, statistics.median(every) * 1e3
    print(f"\n{n:,} frozen batches, median of {repeats}")
    print(f"{'load one step (ms)':24} {a:9.1f}\n{'read every batch (ms)':24} {b:9.1f}  (baseline)\n{'ratio':24} {a / b:9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--response-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--demo-steps", type=int, default=None, help="measure replay's share of a tiny GRPO demo run instead")
    parser.add_argument("--batches", type=int, default=None, help="time loading one step of a run of this many batches instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_replay_", dir=args.dir))
    if args.batches:
        try:
            many_batches(args.batches, work, args.repeats)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    if args.demo_steps:
        try:
            demo_cost(args.demo_steps, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        rltrace.init(work / "run", flush_interval=60)
        batch = make_batch(args.samples, args.response_len)
        rows = as_rows(batch)
        table = []
        for layout, samples in (("columns", batch), ("rows", rows)):
            replay.freeze(99_999, samples)  # warm up imports and the writer thread
            replay.flush()
            table += report(layout, nbytes(samples), measure(samples, work, args.repeats))
        rltrace.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbatch: {args.samples} samples x {args.response_len} response tokens (+256 prompt), "
          f"{nbytes(batch) / 1e6:.0f} MB as tensors; median of {args.repeats} repeats\n")
    print(f"{'metric':32} {'layout':8} {'rltrace':>9} {'torch':>9} {'ratio':>7} {'goal':>7}  ok")
    for metric, layout, ours, theirs, ratio, goal, sense in table:
        if sense == ">=":
            print(f"{metric:32} {layout:8} {ours:9.1f} {theirs:9.1f} {ratio:7.2f} {sense}{goal:5.2f}  {'yes' if ratio >= goal else 'NO'}")
        else:
            extra = f"max {theirs:.1f}" + (f", CPU {ratio:.2f}" if ratio is not None else "")
            print(f"{metric:32} {layout:8} {ours:9.2f} {'':9} {'':7} {sense}{goal:5.1f}  {'yes' if ours <= goal else 'NO'}   ({extra})")


if __name__ == "__main__":
    main()
