"""`rltrace import metrics` of a long verl run: 10,000 steps x 200 scalars (2 million values).

    python benchmarks/bench_import_metrics.py [--steps 10000] [--scalars 200] [--baseline-records 200000]
                                              [--repeat 3] [--logs DIR]

Writes the log once with the real `torch.utils.tensorboard.SummaryWriter` (one event per scalar,
as verl's tracking does; 10 of the names are verl's `timing_s/*` stages) and verl's JSONL layout
(`{"step": N, "data": {...}}`), then times `import_metrics` end to end (read, map, write metrics
parts and stage spans) for each, `--repeat` times (median and slowest wall time, median CPU time).
Goal: under 10 s on 2 cores.

Baselines, measured in the same run on the same files: for TensorBoard, tensorboard's own Python
event reader (`EventFileLoader`, which checks every record's CRC in pure Python and parses one
event at a time) over the first `--baseline-records` records, extrapolated to the whole file; for
JSONL, the same import with every record read by Python's `json` (the importer's own route for
JSONL that holds text values, and how every JSONL file was read before). The ratio is baseline
time / rltrace's median wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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


def baseline_tensorboard(tb: Path, limit: int, records: int) -> tuple[float, str]:
    """tensorboard's EventFileLoader over the first `limit` records, extrapolated to `records`."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (event,) = tb.glob("*tfevents*")
    started, n = time.perf_counter(), 0
    for ev in EventFileLoader(str(event)).Load():
        for _ in ev.summary.value:
            pass
        n += 1
        if n >= limit:
            break
    return (time.perf_counter() - started) / n * records, f"tensorboard `EventFileLoader` (from {n:,} records)"


def baseline_jsonl(path: Path, out: Path) -> tuple[float, str]:
    """The same import with every record read by Python's `json` (the importer's route for JSONL holding text values)."""
    from rltrace.importers import textlogs
    from rltrace.importers.metrics import import_metrics

    columns, textlogs._columns = textlogs._columns, lambda table: None  # Arrow's tables refused: record by record
    try:
        started = time.perf_counter()
        import_metrics([path], out)
        return time.perf_counter() - started, "the same import, records read one by one by Python's `json`"
    finally:
        textlogs._columns = columns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--scalars", type=int, default=200)
    ap.add_argument("--baseline-records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3, help="imports of each log (median and slowest are shown)")
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
        records = args.steps * args.scalars
        load = os.getloadavg()[0]
        rows = []
        for name, path, base in (("TensorBoard", tb, lambda: baseline_tensorboard(tb, args.baseline_records, records)),
                                 ("JSONL", jsonl, lambda: baseline_jsonl(jsonl, work / "run-baseline"))):
            walls, cpus = [], []
            for i in range(args.repeat):
                out = work / f"run-{name}-{i}"
                started, cpu = time.perf_counter(), time.process_time()
                result = import_metrics([path], out)
                walls.append(time.perf_counter() - started)
                cpus.append(time.process_time() - cpu)
                assert result["steps"] == args.steps and result["spans"] == args.steps * 10, result
                assert result["metrics"] == records, result
                shutil.rmtree(out)
            base_s, base_name = base()
            rows.append((name, statistics.median(walls), max(walls), statistics.median(cpus), base_name, base_s))
        load = max(load, os.getloadavg()[0])
        print(f"load average up to {load:.1f} on {os.cpu_count()} cores (the machine is shared); {args.repeat} imports of each log")
        print("| log | rltrace import metrics: wall, median (slowest) | CPU | goal | baseline, same run | baseline | ratio |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, wall, slowest, cpu, base_name, base_s in rows:
            print(f"| {name} | **{wall:.1f} s** ({slowest:.1f} s; {records / wall / 1e6:.2f} M scalars/s) | {cpu:.1f} s "
                  f"| < 10 s | {base_name} | {base_s:.1f} s | {base_s / wall:.1f}x |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
