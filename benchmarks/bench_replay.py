"""Freeze and load of a 1024 x 2048-token batch, side by side with torch.save / torch.load.

    python benchmarks/bench_replay.py [--samples 1024] [--response-len 2048] [--repeats 5]

Measures, on the same batch and the same disk, alternating the two in each repeat (the machine
is shared, so only ratios within one run mean anything):
  freeze throughput  batch bytes / (freeze call + conversion + write, until the part is on disk)
                     vs batch bytes / torch.save                          goal >= 0.5x
  load throughput    batch bytes / (rltrace.replay.load + decoding every column)
                     vs batch bytes / torch.load(weights_only=True)       goal >= 0.33x
  caller cost        time the training thread spends in freeze()          goal <= 5 ms
                     (idle writer, and while the writer converts the previous batch)
Both layouts are measured: one [B, T] tensor per column ("columns") and one dict per sample
with ragged per-sample tensors ("rows").
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


def measure(samples, work: Path, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in ("save", "torch_load", "freeze", "load", "call", "call_busy")}
    pt = work / "batch.pt"
    for step in range(repeats):
        t0 = time.perf_counter()
        torch.save(samples, pt)
        times["save"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loaded = torch.load(pt, weights_only=True)
        times["torch_load"].append(time.perf_counter() - t0)
        del loaded

        t0 = time.perf_counter()
        replay.freeze(step, samples)
        t1 = time.perf_counter()
        replay.flush()
        times["call"].append(t1 - t0)
        times["freeze"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        batch = replay.load(work / "run", step)
        for name in batch.columns:
            batch[name]
        times["load"].append(time.perf_counter() - t0)
        del batch

        replay.freeze(10_000 + step, samples)  # the writer is now busy converting this one
        t0 = time.perf_counter()
        replay.freeze(20_000 + step, samples)
        times["call_busy"].append(time.perf_counter() - t0)
        replay.flush()
        for part in (work / "run" / "batches").glob("*.parquet"):
            part.unlink()
    return times


def report(layout: str, size: int, times: dict[str, list[float]]) -> list[tuple]:
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = size / 1e6
    rows = [
        ("freeze MB/s", layout, mb / med["freeze"], mb / med["save"], med["save"] / med["freeze"], GOALS["freeze"]),
        ("load MB/s", layout, mb / med["load"], mb / med["torch_load"], med["torch_load"] / med["load"], GOALS["load"]),
        ("freeze() call ms", layout, 1e3 * med["call"], None, 1e3 * max(times["call"]), 5.0),
        ("freeze() call ms, writer busy", layout, 1e3 * med["call_busy"], None, 1e3 * max(times["call_busy"]), 5.0),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--response-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_replay_", dir=args.dir))
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
    print(f"{'metric':32} {'layout':8} {'rltrace':>10} {'torch':>10} {'ratio/max':>10} {'goal':>6}  ok")
    for metric, layout, ours, theirs, ratio, goal in table:
        ok = ratio >= goal if theirs is not None else ratio <= goal
        theirs_text = f"{theirs:10.1f}" if theirs is not None else f"{'-':>10}"
        print(f"{metric:32} {layout:8} {ours:10.1f} {theirs_text} {ratio:10.2f} {goal:6.2f}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
