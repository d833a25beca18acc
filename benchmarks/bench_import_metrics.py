"""`rltrace import metrics` of a long verl run: 10,000 steps x 200 scalars (2 million values).

    python benchmarks/bench_import_metrics.py [--steps 10000] [--scalars 200] [--baseline-records 200000]

Writes the log once with the real `torch.utils.tensorboard.SummaryWriter` (one event per scalar,
as verl's tracking does; 10 of the names are verl's `timing_s/*` stages) and verl's JSONL layout
(`{"step": N, "data": {...}}`), then times `import_metrics` end to end (read, map, write metrics
parts and stage spans) for each. Goal: under 10 s on 2 cores.

Baseline, measured in the same run on the same file: tensorboard's own Python event reader
(`EventFileLoader`, which checks every record's CRC in pure Python and parses one event at a
time) over the first `--baseline-records` records, extrapolated to the whole file; the ratio is
baseline time / rltrace time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step", "testing", "save_checkpoint")


def record(step: int, n: int) -> dict[str, float]:
    data = {f"timing_s/{s}": 0.1 + (step % 7) * 0.01 + i * 0.001 for i, s in enumerate(STAGES)}
    data.update({f"actor/metric_{k}": float(step * k % 97) for k in range(n - len(data))})
    return data


def write_logs(folder: Path, steps: int, n: int) -> tuple[Path, Path]:
    from torch.utils.tensorboard import SummaryWriter

    tb, jsonl = folder / "tb", folder / "log.jsonl"
    writer = SummaryWriter(str(tb), max_queue=10_000, flush_secs=3600)
    with open(jsonl, "w") as f:
        for gs in range(1, steps + 1):
            data = record(gs, n)
            for key, value in data.items():
                writer.add_scalar(key, value, gs)
            f.write(json.dumps({"step": gs, "data": data}) + "\n")
    writer.close()
    return tb, jsonl


def baseline(tb: Path, limit: int) -> tuple[float, int]:
    """Seconds per record of tensorboard's EventFileLoader over the first `limit` records."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (event,) = tb.glob("*tfevents*")
    started, n = time.perf_counter(), 0
    for ev in EventFileLoader(str(event)).Load():
        for _ in ev.summary.value:
            pass
        n += 1
        if n >= limit:
            break
    return (time.perf_counter() - started) / n, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--scalars", type=int, default=200)
    ap.add_argument("--baseline-records", type=int, default=200_000)
    ap.add_argument("--logs", type=Path, help="keep the generated logs in this folder and reuse them on the next run")
    args = ap.parse_args()
    from rltrace.importers.metrics import import_metrics

    work = Path(tempfile.mkdtemp(prefix="rltrace-bench-import-"))
    try:
        started = time.perf_counter()
        logs = args.logs or work
        if args.logs and (logs / "log.jsonl").exists():
            tb, jsonl = logs / "tb", logs / "log.jsonl"
        else:
            logs.mkdir(parents=True, exist_ok=True)
            tb, jsonl = write_logs(logs, args.steps, args.scalars)
        print(f"wrote {args.steps:,} steps x {args.scalars} scalars in {time.perf_counter() - started:.0f} s "
              f"(TensorBoard {sum(f.stat().st_size for f in tb.iterdir()) / 1e6:.0f} MB, JSONL {jsonl.stat().st_size / 1e6:.0f} MB)")
        per_record, n = baseline(tb, args.baseline_records)
        records = args.steps * args.scalars
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the machine is shared)")
        print(f"| log | rltrace import metrics: wall (CPU) | goal | tensorboard EventFileLoader, extrapolated from {n:,} records | ratio |")
        print("| --- | --- | --- | --- | --- |")
        for name, path in (("TensorBoard", tb), ("JSONL", jsonl)):
            out = work / f"run-{name}"
            started, cpu = time.perf_counter(), time.process_time()
            result = import_metrics([path], out)
            took, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert result["steps"] == args.steps and result["spans"] == args.steps * 10, result
            base = per_record * records
            cells = (f"{base:.1f} s", f"{base / took:.1f}x") if name == "TensorBoard" else ("-", "-")
            print(f"| {name} | **{took:.1f} s** ({cpu:.1f} s CPU; {records / took / 1e6:.2f} M scalars/s) | < 10 s "
                  f"| {cells[0]} | {cells[1]} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
