"""`rltrace import metrics PATH... --out RUN_DIR`: the scalar logs a run already wrote, as a run.

Every scalar becomes a `metrics` row under its own name (nothing is dropped for an unknown name),
and the framework's step scalars also get their rltrace name (`critic/rewards/mean` ->
`reward_mean`, see `rltrace._names.METRIC_ALIASES`). Each step's stage timings become spans so the cost
model (t_R, t_T, t_W, async bound, bottleneck) works on a run that was never traced:

    step (the step's wall time, or the sum of its stages when none was logged)
    ├── gen            rollout      laid one after another from the step's start,
    ├── reward         reward       in the framework's order; siblings never overlap
    ├── update_actor   train
    └── update_weights weight_sync

Only the durations are measured: where a stage sits inside its step is made up, so waits, idle
gaps, stragglers and critical paths need traced spans. Every span carries `rl.source = metrics`
and `rl.metric` (the timing it came from). A step ends at the time its timings were logged
(TensorBoard wall time, a JSONL `_timestamp`); without one, steps follow each other.
Step numbers are shifted so rltrace's first step is 0 (verl, OpenRLHF and TRL count from 1).
"""

from __future__ import annotations

import gc
import hashlib
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from rltrace import _names
from rltrace.store import rows
from rltrace.importers import frameworks, readers
from rltrace.importers.readers import MetricsImportError, Scalars

SOURCE = "metrics"  # rl.source of imported spans
SOURCE_ATTR = "rl.source"
METRIC_ATTR = "rl.metric"
_PART_ROWS = 1_000_000  # metrics rows per part file


def import_metrics(paths, out, *, framework: str = "auto",
                   progress: Callable[[str, float, float], None] | None = None) -> dict:
    """Read the logs, map names, write metrics rows and synthesized spans to run dir `out`.

    Returns a dict: framework, files, steps, metrics (rows written, aliases included), spans,
    aliases (rows added under rltrace names), skipped (reason -> count), unmapped (metric names
    that no map knows, kept as they are).
    """
    was_enabled = gc.isenabled()
    gc.disable()  # millions of small objects: the cyclic collector would re-scan them again and again (~25 % of the time)
    try:
        return _import(paths, out, framework, progress)
    finally:
        if was_enabled:
            gc.enable()


def _import(paths, out, framework: str, progress) -> dict:
    from rltrace.replay.slime_trace import write_process
    from rltrace.store.layout import create_or_join
    from rltrace.store.writer import ProcessInfo, write_part

    files = readers.find_logs(paths)
    total = sum(f.stat().st_size for f in files)
    scalars, done = Scalars(), 0
    for f in files:
        base = done
        got = readers.read(f, (lambda n, base=base: progress("reading", base + n, total)) if progress else None)
        scalars.extend(got)
        done += f.stat().st_size
        if progress:
            progress("reading", done, total)
    if not len(scalars):
        raise MetricsImportError(f"no scalars in {', '.join(map(str, files))}")
    names = np.asarray(scalars.name, dtype=object)
    unique = list(dict.fromkeys(scalars.name))
    if framework == "auto":
        framework = frameworks.detect(unique)
        if framework is None:
            raise MetricsImportError(
                f"cannot tell which framework wrote {files[0]} (no verl timing_s/*, slime perf/*_time, OpenRLHF "
                f"timing/* or TRL names): pass --framework {{{','.join(frameworks.FRAMEWORKS)}}}")
    if framework not in frameworks.FRAMEWORKS:
        raise MetricsImportError(f"--framework {framework!r}: choose auto or one of {', '.join(frameworks.FRAMEWORKS)}")
    fw = frameworks.FRAMEWORKS[framework]
    mapped = {n: frameworks.strip(fw, n) for n in unique}

    steps = np.asarray(scalars.step, dtype=np.int64) - fw.step_offset
    values = np.asarray(scalars.value, dtype=np.float64)
    seconds = np.array([np.nan if t is None else t for t in scalars.time_ns], dtype=np.float64)
    known = ~np.isnan(seconds)
    times_ns = np.where(known, seconds * 1e9, 0).astype(np.int64)
    times = pa.array(times_ns, pa.int64(), mask=~known)
    manifest = create_or_join(Path(out), run_name=None, config={"imported_from": "metrics", "framework": framework,
                                                               "paths": [str(f) for f in files]})
    process = ProcessInfo(run_id=manifest["run_id"], role=f"{framework}-import", rank=None, service_name="rltrace-import")

    # metrics: every scalar as logged, then the rltrace names of the mapped ones
    canonical = {n: _names.canonical_metric(m) for n, m in mapped.items()}
    aliases = {n: c for n, c in canonical.items() if c is not None and c != n}
    alias_mask = np.isin(names, list(aliases)) if aliases else np.zeros(len(names), bool)
    alias_names = [aliases[n] for n in names[alias_mask]]
    tables = [_metrics_table(steps, names, values, times, process),
              _metrics_table(steps[alias_mask], np.asarray(alias_names, dtype=object), values[alias_mask],
                             times.filter(pa.array(alias_mask)), process)]
    table = pa.concat_tables([t for t in tables if t.num_rows])
    folder = Path(out) / _names.METRICS_TABLE.folder
    namer = iter(range(10**8))
    for start in range(0, table.num_rows, _PART_ROWS):
        write_part(folder, f"{process.process_id}-{next(namer):08d}.parquet", table.slice(start, _PART_ROWS), _names.METRICS_TABLE)
        if progress:
            progress("writing", min(start + _PART_ROWS, table.num_rows), table.num_rows)

    spans = step_spans(fw, steps, names, values, np.where(known, times_ns, -1), mapped, manifest["run_id"])
    span_table = rows.span_rows_table(spans, process, process.service_name) if spans else None
    if span_table is not None and span_table.num_rows:
        write_part(Path(out) / _names.SPANS.folder, f"{process.process_id}-spans.parquet", span_table, _names.SPANS)
    write_process(Path(out), process, manifest["run_id"], rows=table.num_rows, spans=len(spans))
    known_names = set(fw.stages) | {m for m in mapped.values() if _names.canonical_metric(m)} | set(fw.bytes) | {fw.wall}
    return {
        "framework": framework,
        "files": [str(f) for f in files],
        "steps": int(len(np.unique(steps))),
        "metrics": int(table.num_rows),
        "aliases": len(alias_names),
        "spans": len(spans),
        "skipped": dict(scalars.skipped),
        "unmapped": sorted(n for n, m in mapped.items() if m not in known_names),
    }


def _metrics_table(steps, names, values, times, process) -> pa.Table:
    n = len(values)
    cols = {"step": pa.array(steps, pa.int64()), "name": pa.array(names, pa.string()),
            "value": pa.array(values, pa.float64()), "time_ns": times}
    # the importing process, repeated in C (ProcessInfo.columns builds Python lists: slow for millions of rows)
    for field_ in _names.METRICS_SCHEMA:
        if field_.name not in cols:
            cols[field_.name] = pa.repeat(pa.scalar(getattr(process, field_.name), field_.type), n)
    return pa.table(cols, schema=_names.METRICS_SCHEMA)


def _span_id() -> str:
    return uuid.uuid4().hex[:16]


def step_spans(fw: frameworks.Framework, steps, names, values, times, mapped: dict, run_id: str) -> list[dict]:
    """One `step` span per step holding a timing, with each stage timing as a child span (see module doc).

    `times`: when each scalar was logged (Unix ns), -1 where unknown.
    """
    wanted = {n: m for n, m in mapped.items() if m in fw.stages or m == fw.wall or m in fw.bytes}
    if not wanted:
        return []
    mask = np.isin(names, list(wanted))
    per_step: dict[int, dict[str, tuple[float, int | None]]] = {}
    for step, name, value, t in zip(steps[mask].tolist(), names[mask].tolist(), values[mask].tolist(),
                                    times[mask].tolist()):
        per_step.setdefault(step, {})[wanted[name]] = (value, None if t < 0 else t)  # logged twice: the later value
    order = list(fw.stages)
    raw_of = {m: n for n, m in wanted.items()}
    out, prev_end = [], None
    for step in sorted(per_step):
        got = per_step[step]
        stages = [(m, got[m][0]) for m in order if m in got and np.isfinite(got[m][0]) and got[m][0] >= 0]
        if not stages:
            continue
        durations = [int(round(v * 1e9)) for _, v in stages]
        wall = got.get(fw.wall, (None, None))[0] if fw.wall else None
        length = max(sum(durations), int(round(wall * 1e9)) if wall is not None and np.isfinite(wall) else 0)
        logged = [t for _, t in got.values() if t is not None]
        if logged:
            start = max(logged) - length
        else:
            start = prev_end if prev_end is not None else 0
        prev_end = start + length
        trace_id = hashlib.sha256(f"{run_id}:{step}".encode()).hexdigest()[:32]
        parent = _span_id()
        out.append(_span(trace_id, parent, None, "step", "step", step, start, start + length,
                          {METRIC_ATTR: raw_of.get(fw.wall) if wall is not None else None}))
        at = start
        sizes = {fw.bytes[m][0]: got[m][0] * fw.bytes[m][1] for m in fw.bytes if m in got}
        for (metric, _), dur in zip(stages, durations):
            stage = fw.stages[metric]
            extra = {METRIC_ATTR: raw_of[metric]}
            if metric in sizes and np.isfinite(sizes[metric]):
                extra[_names.SYNC_BYTES] = int(round(sizes[metric]))
            out.append(_span(trace_id, _span_id(), parent, stage.name, stage.phase, step, at, at + dur, extra))
            at += dur
    return out


def _span(trace_id, span_id, parent, name, phase, step, start, end, extra) -> dict:
    attrs = {_names.PHASE: phase, _names.STEP: step, SOURCE_ATTR: SOURCE,
             **{k: v for k, v in extra.items() if v is not None}}
    return rows.span_row(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, phase=phase,
                         step=step, start_ns=int(start), end_ns=int(end), attributes=attrs)


def command(args) -> int:
    """`rltrace import metrics PATH... --out RUN_DIR [--framework ...]`, with a progress bar."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=False)
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: float, total: float) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage} metrics", total=total)
            bar.update(tasks[stage], completed=done, total=total)

        result = import_metrics(args.paths, args.out, framework=args.framework, progress=progress)
    took = time.perf_counter() - started
    console.print(
        f"{result['framework']}: {result['metrics']:,} metric rows ({result['aliases']:,} under rltrace names) and "
        f"{result['spans']:,} spans over {result['steps']:,} steps from {len(result['files'])} file(s) in {took:.1f} s "
        f"-> {escape(str(args.out))}")
    console.print("Stage spans are synthesized from logged timings (rl.source=metrics): their durations are "
                  "measured, their placement within a step is not.")
    for reason, n in Counter(result["skipped"]).most_common():
        console.print(f"[yellow]skipped[/] {n:,} {escape(reason)}")
    return 0
