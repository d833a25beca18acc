"""Analysis at scale: one step's timeline and the full report on a synthetic 10M-span run.

    python benchmarks/bench_analysis.py [--spans 10000000] [--dir /tmp/rltrace-bench]
    python benchmarks/bench_analysis.py --raw --spans 100000000   # a run never compacted
    python benchmarks/bench_analysis.py --names 20000             # span names that carry ids

`--raw` measures what a user meets on a run nobody compacted, as 8 real writer processes leave it
(`rltrace.init`, nested `rltrace.phase`s with attributes, in step with each other; their merged parts,
what they write beside them, and what the last one stores at exit): `rltrace report` on a machine
that never reported on it (empty summary cache) against a DuckDB `GROUP BY step, phase` over the
same spans (open + query), both as commands, its peak memory, the same without what the last writer
stored (earlier releases) and what storing it cost, and a live run's second report after one more
step was flushed (the summary cache computes only that step). `--direct`: the run written straight
as Parquet instead (seconds, not minutes; no writer exits, so nothing stored).
`--names N`: a service whose N request spans each have their own name (`Req <id>`, with a
`decode` child), as instrumentations that put ids in span names give, against the same run with
one name for all: the report should cost about the same.
`--received`: the run as two receivers (`rltrace collect`) store it, one request of 2,000 spans
stored by both: the report with copies folded on read against the same with them not looked for.
`--engine-meta`: generate spans carry attributes as a traced run's do (a sample id, ~80 bytes; one
in 30 SGLang's request meta, ~190 bytes), so reading attribute text costs what it does there.

Targets: one step's timeline query < 0.3 s; the full report < 10 s on 2 cores.
Baselines measured in the same run: the timeline query on the run before compaction (many
unsorted parts), and the report computing its per-step summaries from the spans (what a run
that was never compacted costs) instead of reading the ones `rltrace compact` stored.

Without `--raw` (and with `--direct`) the run is written straight as Arrow tables in the store
schema (no OTel on the way); with `--raw` by the writers, in the same shape: per step,
a trainer (step container, train with forward/backward micro-batches, optimizer, weight_sync),
8 rollout workers (a rollout span over 4 threads of short generate spans, one straggler) and a
reward worker (reward with per-sample score spans): ~10,000 spans a step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rltrace import _names, analysis, report, store
from rltrace.cli import main as cli
from rltrace.store import digest, layout, merge
from rltrace.store.parts import received_from, write_part

STEP_NS = 10 * 10**9
T0 = 1_700_000_000 * 10**9
PROCS = [("trainer", 0)] + [("rollout", r) for r in range(6)] + [("reward", 0)]  # 8 processes
WORKERS = range(1, 7)
PHASES = ["step", "train", "forward", "backward", "optimizer", "weight_sync", "rollout", "generate", "reward", "score"]


def _template(rng) -> dict[str, np.ndarray]:
    """One step's spans: relative times (ns), process, thread, phase and parent index."""
    rows = []  # (proc, thread, phase, start, end, parent)

    def add(proc, thread, phase, start, end, parent=-1) -> int:
        rows.append((proc, thread, phase, int(start), int(end), parent))
        return len(rows) - 1

    ms = 10**6
    step = add(0, 1, "step", 0, 9500 * ms)
    train = add(0, 1, "train", 6000 * ms, 9000 * ms, step)
    for i in range(200):
        t = 6000 * ms + i * 14 * ms
        add(0, 1, "forward", t, t + 5 * ms, train)
        add(0, 1, "backward", t + 5 * ms, t + 14 * ms, train)
    add(0, 1, "optimizer", 8800 * ms, 9000 * ms, train)
    add(0, 1, "weight_sync", 9000 * ms, 9500 * ms, step)
    for w in WORKERS:
        roll = add(w, 1, "rollout", 0, 5000 * ms, step)
        for thread in range(2, 6):
            t = 0
            for _ in range(383):
                dur = int(rng.uniform(9, 12) * ms)
                add(w, thread, "generate", t, t + dur, roll)
                t += dur + 1000
    rows[-1] = rows[-1][:4] + (5000 * ms,) + rows[-1][5:]  # a straggler sets the rollout's end
    reward = len(PROCS) - 1
    rew = add(reward, 1, "reward", 5000 * ms, 6000 * ms, step)
    for i in range(385):
        add(reward, 1, "score", 5000 * ms + i * 2 * ms, 5000 * ms + i * 2 * ms + ms, rew)
    cols = list(zip(*rows))
    return {k: np.asarray(v, np.int64) if k != "phase" else np.asarray([PHASES.index(p) for p in v])
            for k, v in zip(("proc", "thread", "phase", "start", "end", "parent"), cols)}


def _ids(values: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pc.cast(pa.array(values), pa.string()), width, "0")


def _trace_ids(values: np.ndarray) -> pa.Array:
    """16-byte trace ids (big-endian) of these integers, at once."""
    raw = np.zeros((len(values), 2), ">u8")
    raw[:, 1] = values
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(values), [None, pa.py_buffer(raw.tobytes())])


def _meta(rng, n: int) -> pa.Array:
    """SGLang's meta on a request span, as a traced engine records it (~190 bytes of JSON)."""
    def num(values) -> pa.Array:
        return pc.cast(pa.array(values), pa.string())

    prompt = rng.integers(200, 2000, n)
    pieces = ['{"e2e_latency": ', num(np.round(rng.uniform(0.5, 30, n), 6)), ', "queue_time": ',
              num(np.round(rng.uniform(0, 2, n), 6)), ', "decode_throughput": ', num(np.round(rng.uniform(20, 200, n), 3)),
              ', "prompt_tokens": ', num(prompt), ', "cached_tokens": ', num(rng.integers(0, 200, n)),
              ', "completion_tokens": ', num(rng.integers(50, 4000, n)), ', "rid": "', _ids(rng.integers(0, 2**62, n), 32),
              '"}']
    return pc.binary_join_element_wise(*pieces, "")


def _batch(tpl: dict, steps: range, rng, meta: bool = False) -> pa.Table:
    n, k = len(tpl["start"]), len(steps)
    step = np.repeat(np.asarray(steps, np.int64), n)
    base = np.tile(np.arange(n, dtype=np.int64), k) + (step * n)
    jitter = np.repeat(rng.integers(0, 50 * 10**6, k), n)
    start = T0 + step * STEP_NS + np.tile(tpl["start"], k) + jitter
    end = T0 + step * STEP_NS + np.tile(tpl["end"], k) + jitter
    parent = np.tile(tpl["parent"], k)
    proc = np.tile(tpl["proc"], k)
    phase = np.tile(tpl["phase"], k)
    has_parent = parent >= 0
    parent_ids = pa.array(step * n + parent + 1, pa.int64(), mask=~has_parent)
    roles = [r for r, _ in PROCS]
    process_ids = [f"{r}{rank}-bench-{4000 + i}" for i, (r, rank) in enumerate(PROCS)]
    phase_names = pa.DictionaryArray.from_arrays(pa.array(phase.astype(np.int32)), pa.array(PHASES)).cast(pa.string())
    attributes = pa.array(np.where(phase == PHASES.index("weight_sync"),
                                   json.dumps({"rl.bytes": 2_000_000_000, "rl.method": "nccl"}), "{}"))
    if meta:  # generate spans carry a sample id; one in 30 (about 300 a step: one per request) SGLang's meta too
        generate = phase == PHASES.index("generate")
        sample = pc.binary_join_element_wise('{"rl.sample_id": ', pc.cast(pa.array(base), pa.string()),
                                             ', "rl.group_id": "g-', pc.cast(pa.array(base // 8), pa.string()),
                                             '", "thread.name": "rollout-worker"}', "")
        request = generate & (np.tile(np.arange(n), k) % 30 == 0)
        attributes = pc.if_else(pa.array(generate), sample, attributes)
        attributes = pc.if_else(pa.array(request), _meta(rng, len(phase)), attributes)
    thread = np.tile(tpl["thread"], k)
    cols = {
        "trace_id": _trace_ids(step + 1),
        "span_id": pa.array(base + 1, pa.int64()),
        "parent_span_id": parent_ids,
        "name": phase_names,
        "phase": phase_names,
        "step": pa.array(step),
        "weight_version": pa.array(step),
        "start_ns": pa.array(start),
        "end_ns": pa.array(end),
        "status": pa.array(["UNSET"] * len(step)),
        "status_message": pa.nulls(len(step), pa.string()),
        "kind": pa.array(["INTERNAL"] * len(step)),
        "thread_id": pa.array(thread),
        "thread_name": pc.if_else(pa.array(thread == 1), "MainThread", "worker"),
        "process_id": pa.DictionaryArray.from_arrays(pa.array(proc.astype(np.int32)), pa.array(process_ids)).cast(pa.string()),
        "role": pa.DictionaryArray.from_arrays(pa.array(proc.astype(np.int32)), pa.array(roles)).cast(pa.string()),
        "rank": pa.array(np.array([rank for _, rank in PROCS])[proc]),
        "host": pa.array(["bench"] * len(step)),
        "pid": pa.array(4000 + proc),
        "service_name": pa.array(["rltrace-bench"] * len(step)),
        "attributes": attributes,
        "events": pa.nulls(len(step), pa.string()),
        "links": pa.nulls(len(step), pa.string()),
    }
    return pa.table(cols, schema=_names.SPANS_SCHEMA)


PART_ROWS = 1_000_000  # a process's merged parts, as writers leave them (rltrace.store.merge: up to 2M rows)


def process_ids() -> list[str]:
    return [f"{role}{rank}-bench-{4000 + i}" for i, (role, rank) in enumerate(PROCS)]


def write_as_writers_do(run_dir: Path, table: pa.Table, names: list[str], received: bool = False) -> None:
    """Spans of several processes as their writers leave them once merged: per process, parts
    sorted by (step, start) in 128k-row groups, each with its per-part summary and engine request
    rows (the same code). `received`: as two receivers' merged parts (`rltrace collect`)."""
    proc = table["process_id"]
    for i, process_id in enumerate(process_ids()):
        mine = table.filter(pc.equal(proc, process_id))
        if not mine.num_rows:
            continue
        mine = mine.take(pc.sort_indices(mine, sort_keys=[("step", "ascending"), ("start_ns", "ascending")]))
        name = names[i]
        footer = received_from([f"collector-bench-{i % 2}"]) if received else None
        path = write_part(run_dir / "spans", name, mine, _names.SPANS, footer, write_options={"row_group_size": merge.ROW_GROUP_ROWS})
        merge.write_summary(path.parent, name, digest.build(mine), mine.num_rows)
        merge.write_requests(path.parent, name, mine)


def generate(run_dir: Path, spans: int, seed: int = 0, meta: bool = False, received: bool = False) -> int:
    """A run of about `spans` spans from 8 processes, as their writers leave it when they exit: per
    process, merged parts of up to PART_ROWS spans with their per-part summaries. `received`: as
    two receivers store them, and one request of 2,000 spans stored by both (a resent export)."""
    rng = np.random.default_rng(seed)
    layout.create_or_join(run_dir, run_name="bench", config={"spans": spans})
    tpl = _template(rng)
    n_steps = max(1, spans // len(tpl["start"]))
    busiest = int(np.bincount(tpl["proc"]).max())
    per_part = max(1, PART_ROWS // busiest)
    written = 0
    for k, first in enumerate(range(0, n_steps, per_part)):
        steps = range(first, min(first + per_part, n_steps))
        table = _batch(tpl, steps, rng, meta)
        write_as_writers_do(run_dir, table, [f"{p}-m{k + 1:08d}.parquet" for p in process_ids()], received)
        if received and k == 0:
            resent = table.filter(pc.equal(table["process_id"], process_ids()[1])).slice(0, 2000)
            write_part(run_dir / "spans", "collector-bench-2-00000001.parquet", resent, _names.SPANS,
                       received_from(["collector-bench-2"]))
        written += table.num_rows
        samples = {
            "step": np.repeat(np.asarray(steps), 256),
            "logged_ns": np.repeat(T0 + np.asarray(steps) * STEP_NS, 256),
            "sample_id": np.tile(np.arange(256), len(steps)),
            "response_len": rng.integers(50, 400, 256 * len(steps)),
            "gen_start": np.repeat((T0 + np.asarray(steps) * STEP_NS) / 1e9, 256),
        }
        samples["gen_end"] = samples["gen_start"] + samples["response_len"] / 80.0
        samples["weight_version"] = samples["step"] - rng.integers(0, 3, 256 * len(steps))
        samples["train_version"] = samples["step"]
        write_part(run_dir / "samples", f"bench-{first:08d}.parquet", pa.table(samples), _names.SAMPLES)
        metrics = pa.table({"step": np.repeat(np.asarray(steps), 2), "name": ["reward_mean", "train_rollout_logprob_abs_diff"] * len(steps),
                            "value": rng.uniform(0, 1, 2 * len(steps)),
                            "time_ns": np.repeat(T0 + np.asarray(steps) * STEP_NS + 9 * 10**9, 2)})
        write_part(run_dir / "metrics", f"bench-{first:08d}.parquet", metrics, _names.METRICS_TABLE)
    for i, (role, rank) in enumerate(PROCS):
        process_id = process_ids()[i]
        row = {"process_id": process_id, "role": role, "rank": rank, "host": "bench", "pid": 4000 + i,
               "started_ns": T0, "heartbeat_ns": T0 + n_steps * STEP_NS, "spans_dropped": 0, "rows_dropped": 0}
        table = pa.Table.from_pylist([row], schema=_names.PROCESSES_SCHEMA)
        write_part(run_dir / "processes", f"{process_id}.parquet", table, _names.PROCESSES)
    return written


def _record(run_dir: str, i: int, first: int, steps: int, barrier, meta: bool) -> None:
    """One writer process of `generate_with_writers`: `rltrace.init`, then `steps` steps of the
    template's shape through `rltrace.phase` (nested, with attributes), in step with the others
    (a barrier per stage: rollout, reward, train, as a synchronous RL loop runs), then exit."""
    import contextvars
    import random
    import threading

    import rltrace

    role, rank = PROCS[i]
    rltrace.init(run_dir, role=role, rank=rank)
    rng = random.Random(i)
    for step in range(first, first + steps):
        barrier.wait()  # the step starts: rollout workers generate
        if role == "rollout":
            with rltrace.phase("rollout", step=step, weight_version=step, engine="sglang") as roll:
                def generate(thread: int) -> None:
                    for k in range(383):
                        attrs = {"sample_id": f"{step}-{rank}-{thread}-{k}", "group_id": f"g-{step}-{k // 8}"}
                        if meta and k % 30 == 0:
                            attrs.update(e2e_latency=rng.uniform(0.5, 30), queue_time=rng.uniform(0, 2),
                                         prompt_tokens=rng.randint(200, 2000), cached_tokens=rng.randint(0, 200),
                                         completion_tokens=rng.randint(50, 4000), rid=f"{rng.getrandbits(62):032x}")
                        with rltrace.phase("generate", **attrs):
                            pass
                threads = [threading.Thread(target=contextvars.copy_context().run, args=(generate, t)) for t in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                roll.set(samples=4 * 383)
        barrier.wait()  # rollouts done: the reward worker scores
        if role == "reward":
            with rltrace.phase("reward", step=step, weight_version=step, fn="math_verify"):
                for k in range(385):
                    with rltrace.phase("score", sample_id=f"{step}-{k}"):
                        pass
        barrier.wait()  # scored: the trainer trains and syncs weights
        if role == "trainer":
            with rltrace.phase("step", step=step, weight_version=step):
                with rltrace.phase("train", micro_batches=200):
                    for k in range(200):
                        with rltrace.phase("forward", micro_batch=k):
                            pass
                        with rltrace.phase("backward", micro_batch=k):
                            pass
                    with rltrace.phase("optimizer", lr=1e-6):
                        pass
                with rltrace.phase("weight_sync", bytes=2_000_000_000, method="nccl"):
                    pass
            rltrace.log_metrics(step, reward_mean=rng.random(), train_rollout_logprob_abs_diff=rng.random())
            rltrace.log_samples(step, [{"sample_id": k, "response_len": rng.randint(50, 400)} for k in range(256)])
    rltrace.shutdown()


def generate_with_writers(run_dir: Path, spans: int, meta: bool = False, first: int = 0,
                          env: dict | None = None) -> int:
    """A run of about `spans` spans written by 8 real writer processes (`rltrace.init`, nested
    `rltrace.phase`s with attributes, the template's shape: ~10,000 spans a step), left as they
    leave it when they exit: their own merged parts and what they write beside them, nothing
    compacted. The number of steps written."""
    import multiprocessing

    steps = max(1, spans // len(_template(np.random.default_rng(0))["start"]))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(PROCS))
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        procs = [ctx.Process(target=_record, args=(str(run_dir), i, first, steps, barrier, meta)) for i in range(len(PROCS))]
        for proc in procs:
            proc.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for proc in procs:
        proc.join()
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise RuntimeError(f"{len(failed)} writer processes failed (exit codes {failed})")
    from rltrace.store import last_writer

    last_writer.wait(run_dir, timeout=3600)  # the last one out had the report's summaries stored: done
    return steps


def _time(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _timeline(run_dir: Path, step: int) -> None:
    analysis.step_timeline(store.open(run_dir), step)


def _report(run_dir: Path) -> None:
    report.build(store.open(run_dir))


def _report_raw(run_dir: Path) -> None:
    snap = store.scan(run_dir)
    snap.parts[_names.STEP_SUMMARY.name] = []  # as if never compacted: summaries come from the spans
    report.build(store.connect(snap))


_CHILD = """
import json, resource, sys, time
from rltrace import report, store
t = time.perf_counter()
{body}
print()
print("RESULT", json.dumps({{"seconds": time.perf_counter() - t, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def _child(body: str, cache: Path) -> dict:
    """Run `body` in a fresh interpreter (cold caches, its own peak memory); seconds and peak MB."""
    import subprocess
    import sys

    env = dict(os.environ, RLTRACE_SUMMARY_CACHE_DIR=str(cache))
    code = _CHILD.format(body=body)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.rsplit("RESULT", 1)[1])


def _command(argv: list[str], cache: Path) -> dict:
    """Run a command as a user types it (a fresh interpreter, imports included): seconds, peak MB."""
    import subprocess

    env = dict(os.environ, RLTRACE_SUMMARY_CACHE_DIR=str(cache))
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", *argv], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, check=True)
    seconds, kb = out.stderr.rsplit("TIME", 1)[1].split()
    return {"seconds": float(seconds), "peak_mb": int(kb) / 1024}


def _raw(run_dir: Path, written: int, rows: list, meta: bool = False) -> None:
    """The report on a run as its writers left it (nobody compacted it) against a GROUP BY, as
    commands on a machine that never reported on it (an empty summary cache); the same with what
    the last writer stored at exit set aside (what earlier releases gave), and what storing it cost
    that writer; then a live run's second report, after one more step was flushed."""
    import subprocess
    import sys

    from rltrace.analysis import _parts

    cache = run_dir.parent / f"{run_dir.name}-summaries"
    stored, aside = run_dir / _parts.STORED, run_dir.parent / f"{run_dir.name}-stored-aside"
    # rltrace's bytecode compiled first, as `pip install` leaves it (a checkout run with
    # PYTHONDONTWRITEBYTECODE would compile every module on each command)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(report.__file__).parent.parent)], check=True)
    group_by = [sys.executable, "-c", "import duckdb; duckdb.sql(\"SELECT step, phase, count(*) AS n, "
                f"sum(end_ns - start_ns) AS ns FROM read_parquet('{run_dir}/spans/*.parquet') GROUP BY step, phase\").fetchall()"]
    report_cmd = [str(Path(sys.executable).parent / "rltrace"), "report", str(run_dir), "--json"]
    build = "report.build(store.open({d!r}))".format(d=str(run_dir))

    def cold() -> dict:  # the median of three, each with nothing cached, as the baseline's
        firsts = []
        for _ in range(3):
            shutil.rmtree(cache, ignore_errors=True)
            firsts.append(_command(report_cmd, cache))
        return sorted(firsts, key=lambda r: r["seconds"])[1]

    base = statistics.median(_command(group_by, cache)["seconds"] for _ in range(3))
    first = cold()
    rows.append(("DuckDB GROUP BY step, phase (python -c, a command)", "baseline", f"{base:.2f} s", "", ""))
    rows.append(("rltrace report --json, nothing cached (a command, median of 3)", "<= 8x baseline",
                 f"{first['seconds']:.2f} s", f"{base:.2f} s GROUP BY", f"{first['seconds'] / base:.1f}x"))
    rows.append(("  peak memory of that report", "<= 4 GB (10M), < 8 GB (100M)", f"{first['peak_mb'] / 1024:.2f} GB", "", ""))
    shutil.rmtree(cache, ignore_errors=True)
    inproc = _child(build, cache)  # the same, imports excluded (the figure earlier releases gave)
    shutil.rmtree(cache, ignore_errors=True)
    unfolded = _child(f"report.build(store.connect(store.scan({str(run_dir)!r}, fold=False)))", cache)
    rows.append(("  the same in-process (open + build, imports excluded)", "", f"{inproc['seconds']:.2f} s",
                 f"{unfolded['seconds']:.2f} s copies not looked for", f"{inproc['seconds'] / unfolded['seconds']:.2f}x"))
    if stored.exists():
        shutil.rmtree(aside, ignore_errors=True)
        stored.rename(aside)
        try:
            before = cold()
            shutil.rmtree(cache, ignore_errors=True)
            storing = _child(f"from rltrace.analysis import stored; stored.store({str(run_dir)!r})", cache)
        finally:
            shutil.rmtree(stored, ignore_errors=True)
            aside.rename(stored)
        rows.append(("  the same without what the last writer stored (earlier releases)", "",
                     f"{before['seconds']:.2f} s", f"{base:.2f} s GROUP BY", f"{before['seconds'] / base:.1f}x"))
        rows.append(("  what storing it cost (the process the last writer starts)", "", f"{storing['seconds']:.2f} s", "", ""))
    # one more step flushed by the live run (flush parts, no summary yet); the summary cache holds every earlier step
    tpl = _template(np.random.default_rng(0))
    n_steps = written // len(tpl["start"])
    table = _batch(tpl, range(n_steps, n_steps + 1), np.random.default_rng(1), meta)
    last_end = store.open(run_dir).execute("SELECT max(end_ns) FROM spans").fetchall()[0][0]
    shift = pa.scalar(last_end - (T0 + n_steps * STEP_NS) + 10**9)  # the step follows the run's last span
    for column in ("start_ns", "end_ns"):
        table = table.set_column(table.column_names.index(column), column, pc.add(table[column], shift))
    live = []
    for process_id in process_ids():
        mine = table.filter(pc.equal(table["process_id"], process_id))
        live.append(write_part(run_dir / "spans", f"{process_id}-{n_steps:08d}.parquet", mine, _names.SPANS))
    try:
        second = _child(build, cache)
        second_cmd = _command(report_cmd, cache)
    finally:
        for path in live:
            path.unlink()
    rows.append(("live run: second report after 1 new step (in-process)", "<= 10% of first", f"{second['seconds']:.2f} s",
                 f"{inproc['seconds']:.2f} s first", f"{100 * second['seconds'] / inproc['seconds']:.0f}%"))
    rows.append(("  the same as a command", "", f"{second_cmd['seconds']:.2f} s",
                 f"{first['seconds']:.2f} s first", f"{100 * second_cmd['seconds'] / first['seconds']:.0f}%"))


def _received(run_dir: Path, written: int, rows: list) -> None:
    """The report on a run whose spans all came through two receivers, one request stored by both:
    readers look for copies among their parts and fold them (`store.views.fold_copies`), against
    the same report with copies not looked for (the read path of earlier releases), each in a fresh
    interpreter with nothing cached; then again with what the first reader kept (the copies found,
    the folded part)."""
    cache, kept = run_dir.parent / f"{run_dir.name}-summaries", run_dir.parent / f"{run_dir.name}-kept"
    os.environ["RLTRACE_CACHE_DIR"] = str(kept)  # where readers keep folded parts (children inherit it)
    d = str(run_dir)

    def cold(body: str, keep: bool = False) -> float:
        times = []
        for _ in range(3):
            shutil.rmtree(cache, ignore_errors=True)
            if not keep:
                shutil.rmtree(kept, ignore_errors=True)
            times.append(_child(body, cache)["seconds"])
        return statistics.median(times)

    scan_before = cold(f"store.scan({d!r}, fold=False)")
    scan_after = cold(f"store.scan({d!r})")
    before = cold(f"report.build(store.connect(store.scan({d!r}, fold=False)))")
    after = cold(f"report.build(store.open({d!r}))")
    again = cold(f"report.build(store.open({d!r}))", keep=True)
    counted = store.open(run_dir).execute("SELECT count(*) FROM spans").fetchall()[0][0]
    rows.append((f"open a received run ({written:,} spans stored, {counted:,} once)", "", f"{scan_after:.2f} s",
                 f"{scan_before:.2f} s copies not looked for", f"{scan_after / scan_before:.2f}x"))
    rows.append(("report, copies folded on read (nothing kept yet)", "about the baseline", f"{after:.2f} s",
                 f"{before:.2f} s copies counted", f"{after / before:.2f}x"))
    rows.append(("  the same once a reader kept the folded part", "", f"{again:.2f} s",
                 f"{before:.2f} s copies counted", f"{again / before:.2f}x"))


def _many_names(root: Path, n: int) -> None:
    """The report on a run whose engine spans are named per request, against one name for all."""
    from rltrace.testing import RunBuilder

    rows, seconds = [], {}
    for label, distinct in (("one name", False), (f"{n:,} names", True)):
        run_dir = root / f"names-{n}-{int(distinct)}"
        shutil.rmtree(run_dir, ignore_errors=True)
        b = RunBuilder(run_dir)
        trainer, engine = b.process("trainer"), b.process("engine", rank=None)
        rng = np.random.default_rng(0)
        steps = 20
        for step in range(steps):
            t = 100.0 * step
            trainer.span("wait", t, t + 61, step=step, waiting_for="rollout")
            trainer.span("train", t + 61, t + 95, step=step)
            for i in range(n // steps):
                a, d = t + rng.uniform(0, 90), rng.uniform(0.01, 5)
                name = f"Req {step:04d}{i:08x}" if distinct else "Req"
                request = engine.span(None, a, a + d, step=step, name=name)
                engine.span(None, a + d / 3, a + d / 2, step=step, name="decode", parent=request)
        b.write()
        cache = root / f"names-{n}-{int(distinct)}-summaries"
        shutil.rmtree(cache, ignore_errors=True)
        seconds[label] = _child(f"report.build(store.open({str(run_dir)!r}))", cache)["seconds"]
    base, many = seconds["one name"], seconds[f"{n:,} names"]
    rows.append(("report, every request span named alike (baseline)", "", f"{base:.2f} s", "", ""))
    rows.append((f"report, {n:,} distinct request names", "about the baseline", f"{many:.2f} s",
                 f"{base:.2f} s one name", f"{many / base:.1f}x"))
    _print(rows, 2 * n + 40)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spans", type=int, default=10_000_000)
    p.add_argument("--dir", default="/tmp/rltrace-bench")
    p.add_argument("--reuse", action="store_true", help="reuse a run generated before (skips the uncompacted baseline)")
    p.add_argument("--skip-raw", action="store_true", help="skip the report baseline without summaries (minutes at 10M)")
    p.add_argument("--received", action="store_true",
                   help="only the report on a run that two receivers stored (one request by both), copies folded on read or not")
    p.add_argument("--raw", action="store_true", help="only the never-compacted report against a GROUP BY, and a live run")
    p.add_argument("--direct", action="store_true",
                   help="--raw on a run written straight as Parquet (seconds), not by 8 writer processes (minutes)")
    p.add_argument("--engine-meta", action="store_true",
                   help="generate spans carry attributes (a sample id; one in 30 SGLang's request meta), as a traced run's do")
    p.add_argument("--names", type=int, default=0, help="only the report on N distinct request names against one name")
    args = p.parse_args()
    if args.names:
        return _many_names(Path(args.dir), args.names)
    kind = "-received" if args.received else "-direct" if args.direct or not args.raw else "-writers"
    run_dir = Path(args.dir) / f"run-{args.spans}{'-meta' if args.engine_meta else ''}{kind}"
    rows = []
    before = None
    if not (args.reuse and run_dir.exists()):
        shutil.rmtree(run_dir, ignore_errors=True)
        t = time.perf_counter()
        if args.raw and not args.direct:
            generate_with_writers(run_dir, args.spans, meta=args.engine_meta)
            rows.append(("8 writer processes record the run and exit", "", f"{time.perf_counter() - t:.1f} s", "", ""))
        else:
            generate(run_dir, args.spans, meta=args.engine_meta, received=args.received)
            rows.append(("generate run", "", f"{time.perf_counter() - t:.1f} s", "", ""))
    written = store.open(run_dir).execute("SELECT count(*) FROM spans").fetchall()[0][0]
    if args.received:
        _received(run_dir, sum(p.rows for p in store.scan(run_dir, fold=False).parts["spans"]), rows)
        return _print(rows, written)
    if args.raw:
        _raw(run_dir, written, rows, meta=args.engine_meta)
        return _print(rows, written)
    step = written // 10_000 // 2
    if not args.reuse:
        before = _time(lambda: _timeline(run_dir, step))
    t = time.perf_counter()
    cli(["compact", str(run_dir)])
    rows.append(("rltrace compact (+ summaries)", "", f"{time.perf_counter() - t:.1f} s", "", ""))
    con = store.open(run_dir)
    query = _time(lambda: analysis.step_timeline(con, step))
    after = _time(lambda: _timeline(run_dir, step))
    rows.append(("one step's timeline query", "< 0.3 s", f"{query:.3f} s", "", ""))
    rows.append(("one step's timeline (open + query)", "", f"{after:.3f} s",
                 f"{before:.3f} s uncompacted" if before else "", f"{before / after:.1f}x" if before else ""))
    full = _time(lambda: _report(run_dir), repeat=2)
    raw = None if args.skip_raw else _time(lambda: _report_raw(run_dir), repeat=1)
    rows.append(("full report (open + report.build)", "< 10 s", f"{full:.2f} s",
                 f"{raw:.1f} s without summaries" if raw else "", f"{raw / full:.1f}x" if raw else ""))
    _print(rows, written)


def _print(rows: list, written: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bench_analysis: {written:,} spans, {os.cpu_count()} cores")
    for col in ("what", "target", "measured", "baseline (same run)", "speed-up"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
