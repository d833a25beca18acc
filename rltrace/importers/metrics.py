"""`rltrace import metrics PATH... --out RUN_DIR`: the scalar logs a run already wrote, as a run.

Every scalar becomes a `metrics` row under its own name (nothing is dropped for an unknown name),
and the framework's step scalars also get their rltrace name (`critic/rewards/mean` ->
`reward_mean`, see `rltrace._names.METRIC_ALIASES`). Each step's stage timings become spans so the cost
model (t_R, t_T, t_W, async bound, bottleneck) works on a run that was never traced:

    step (the step's wall time, or the sum of its stages when none was logged)
    ├── gen            rollout      laid one after another from the step's start,
    ├── reward         reward       in the framework's order (each from the step's start
    │                               when the logged step time is shorter than their sum)
    ├── update_actor   train
    └── update_weights weight_sync

Only the durations are measured: where a stage sits inside its step is made up, so waits, idle
gaps, stragglers and critical paths need traced spans. Every span carries `rl.source = metrics`
and `rl.metric` (the timing it came from). A step ends at the time its timings were logged
(TensorBoard wall time, a JSONL `_timestamp`); without one, steps follow each other. A stage
timing that is negative, not a number or over `_MAX_SECONDS` makes no span (its scalar is still stored).
Step numbers are shifted so rltrace's first step is 0 when the log counts from 1 as verl, OpenRLHF
and TRL do (its first timed step is 1 or later); a log with a timed step 0 is kept as logged, and
the result says which (`step_shift`, `steps_note`).

A line, record or value that cannot be read is left out and counted with its file, position and
reason (`rltrace info`); a file that is not a log costs only itself (`failed`). What one import
adds becomes visible together, and a file imported before is skipped (`rltrace.store.imports`).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from rltrace import _names
from rltrace.store import imports, rows
from rltrace.importers import frameworks, readers
from rltrace.importers.scalars import RECORDS, MetricsImportError, Scalars

SOURCE = "metrics"  # rl.source of imported spans
SOURCE_ATTR = "rl.source"
#: the service of the process that writes imported spans: how a report counts them (a dictionary
#: column, where the `rl.source` attribute would mean reading every span's attribute text)
SERVICE_NAME = imports.SERVICE_NAME
METRIC_ATTR = "rl.metric"
_PART_ROWS = 1_000_000  # metrics rows per part file
_MAX_SECONDS = 1e8  # about three years: a longer stage timing is not one (and its nanoseconds must fit int64)


def import_metrics(paths, out, *, framework: str = "auto",
                   progress: Callable[[str, float, float], None] | None = None) -> dict:
    """Read the logs, map names, write metrics rows and synthesized spans to run dir `out`.

    Returns a dict: framework, files (imported), steps, metrics (rows written, aliases included),
    spans, aliases (rows added under rltrace names), step_shift and steps_note (how steps were
    numbered), skipped (reason -> count of lines, records and values left out), dropped (one line
    per file and reason, with positions), already (files imported before: nothing added), failed
    (files that are not logs), unmapped (metric names that no map knows, kept as they are).
    """
    was_enabled = gc.isenabled()
    gc.disable()  # the record-by-record readers make millions of small objects: the cyclic collector would re-scan them again and again
    try:
        return _import(paths, out, framework, progress)
    finally:
        if was_enabled:
            gc.enable()


def _read(files: list[Path], progress) -> tuple[list[Scalars], dict[Path, str]]:
    """The scalars of each file that reads, and "why" for each that does not (it costs only itself)."""
    total = sum(f.stat().st_size for f in files)
    parts, failed, done = [], {}, 0
    for f in files:
        base = done
        try:
            parts.append(readers.read(f, (lambda n, base=base: progress("reading", base + n, total)) if progress else None))
        except MetricsImportError as exc:
            failed[f] = str(exc)
        done += f.stat().st_size
        if progress:
            progress("reading", done, total)
    return parts, failed


def step_shift(fw: frameworks.Framework, steps: np.ndarray, codes: np.ndarray, names: list) -> tuple[int, str | None]:
    """How much to subtract from the logged steps, and a sentence saying why.

    verl, OpenRLHF and TRL count steps from 1: their logs are shifted so rltrace's first step is 0,
    unless this log holds a stage timing (else any scalar) at a step below the framework's first.
    """
    if not fw.step_offset or not len(steps):
        return 0, None
    timing = set(fw.stages) | ({fw.wall} if fw.wall else set())
    timed = np.array([frameworks.strip(fw, n) in timing for n in names] + [False], bool)[codes]
    first = int(steps[timed].min()) if timed.any() else int(steps.min())
    what = "timed step" if timed.any() else "step"
    if first >= fw.step_offset:
        return fw.step_offset, (f"steps shifted by -{fw.step_offset} so the first step is 0: {fw.name} counts from "
                                f"{fw.step_offset} (this log's first {what} is {first})")
    return 0, (f"steps kept as logged: {fw.name} counts from {fw.step_offset}, but this log's first {what} is {first}")


def _import(paths, out, framework: str, progress) -> dict:
    files = readers.find_logs(paths)
    imp = imports.Import(out, "metrics", files)
    result = {"framework": framework, "files": [str(f) for f, _ in imp.files], "steps": 0, "metrics": 0, "aliases": 0,
              "spans": 0, "step_shift": 0, "steps_note": None, "skipped": {}, "dropped": [], "already": imp.skipped,
              "failed": [], "unmapped": []}
    if not imp.files:
        return result
    parts, failed = _read([f for f, _ in imp.files], progress)
    for f in failed:
        imp.leave_out(f)  # not recorded as imported: once it reads, it can be
    result["failed"] = list(failed.values())
    scalars = Scalars.concat(parts)
    if not len(scalars):
        why = result["failed"] + scalars.refused.sentences()
        raise MetricsImportError(f"no scalars in {', '.join(str(f) for f, _ in imp.files)}"
                                 + (f" ({why[0]}{f'; and {len(why) - 1} more' if len(why) > 1 else ''})" if why else ""))
    names = [rows.text(n) for n in scalars.names]  # distinct, as logged (text made valid UTF-8); scalars.code indexes them
    if framework == "auto":
        framework = frameworks.detect(names)
        if framework is None:
            raise MetricsImportError(
                f"cannot tell which framework wrote {files[0]} (no verl timing_s/*, slime perf/*_time, OpenRLHF "
                f"timing/* or TRL names): pass --framework {{{','.join(frameworks.FRAMEWORKS)}}}")
    if framework not in frameworks.FRAMEWORKS:
        raise MetricsImportError(f"--framework {framework!r}: choose auto or one of {', '.join(frameworks.FRAMEWORKS)}")
    fw = frameworks.FRAMEWORKS[framework]
    mapped = [frameworks.strip(fw, n) for n in names]

    shift, note = step_shift(fw, scalars.step, scalars.code, names)
    if shift:  # a step that cannot be shifted (the smallest int64) is refused, never wrapped
        low = scalars.step < rows.INT64_MIN + shift
        if low.any():
            scalars.refused.add(RECORDS, "+".join(result["files"]), f"step {rows.INT64_MIN} cannot be shifted by -{shift}",
                                count=int(low.sum()))
            scalars = scalars.take(~low)
    steps = scalars.step - shift
    known = ~np.isnan(scalars.time_s)
    times_ns = np.where(known, scalars.time_s * 1e9, 0).astype(np.int64)
    times = pa.array(times_ns, pa.int64(), mask=~known)

    # metrics: every scalar as logged, then the rltrace names of the mapped ones
    canonical = [_names.canonical_metric(m) for m in mapped]
    alias_names = list(dict.fromkeys(c for n, c in zip(names, canonical) if c is not None and c != n))
    alias_code = np.array([alias_names.index(c) if c is not None and c != n else -1 for n, c in zip(names, canonical)], np.int32)
    alias_rows = alias_code[scalars.code]
    alias_mask = alias_rows >= 0
    with imp:
        process = imp.begin(f"{framework}-import", {"imported_from": "metrics", "framework": framework,
                                                     "paths": [str(f) for f in files]})
        tables = [_metrics_table(steps, scalars.code, names, scalars.value, times, process),
                  _metrics_table(steps[alias_mask], alias_rows[alias_mask], alias_names, scalars.value[alias_mask],
                                 times.filter(pa.array(alias_mask)), process)]
        table = pa.concat_tables([t for t in tables if t.num_rows])
        for start in range(0, table.num_rows, _PART_ROWS):
            imp.stage(_names.METRICS_TABLE, table.slice(start, _PART_ROWS))
            if progress:
                progress("writing", min(start + _PART_ROWS, table.num_rows), table.num_rows)
        spans, n_spans = step_spans(fw, steps, scalars.code, names, scalars.value, np.where(known, times_ns, -1), process.run_id)
        if n_spans:
            imp.stage(_names.SPANS, rows.span_columns_table(spans, n_spans, process, process.service_name))
        imp.refused.update(scalars.refused)
        imp.commit(rows_written=table.num_rows, spans_written=n_spans, summary={"framework": framework, "step_shift": shift})
    known_names = set(fw.stages) | {m for m, c in zip(mapped, canonical) if c} | set(fw.bytes) | {fw.wall}
    result.update({
        "framework": framework,
        "steps": int(len(np.unique(steps))),
        "metrics": int(table.num_rows),
        "aliases": int(alias_mask.sum()),
        "spans": n_spans,
        "step_shift": shift,
        "steps_note": note,
        "skipped": dict(scalars.skipped()),
        "dropped": scalars.refused.sentences(),
        "unmapped": sorted(n for n, m in zip(names, mapped) if m not in known_names),
    })
    return result


def _metrics_table(steps, codes, names, values, times, process) -> pa.Table:
    n = len(values)
    cols = {"step": pa.array(steps, pa.int64()), "name": pa.array(names, pa.string()).take(pa.array(codes, pa.int32())),
            "value": pa.array(values, pa.float64()), "time_ns": times}
    # the importing process, repeated in C (ProcessInfo.columns builds Python lists: slow for millions of rows)
    for field_ in _names.METRICS_SCHEMA:
        if field_.name not in cols:
            cols[field_.name] = pa.repeat(pa.scalar(getattr(process, field_.name), field_.type), n)
    return pa.table(cols, schema=_names.METRICS_SCHEMA)


def _span_ids(n: int) -> pa.Array:
    """`n` random 16-hex-digit span ids, as one Arrow string array."""
    return pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(0, 16 * (n + 1), 16, dtype=np.int32)),
                                       pa.py_buffer(os.urandom(8 * n).hex().encode()))


def step_spans(fw: frameworks.Framework, steps, codes, names: list, values, times, run_id: str) -> tuple[dict, int]:
    """One `step` span per step holding a timing, with each stage timing as a child span (see module doc).

    `codes` index `names` (as logged); `times`: when each scalar was logged (Unix ns), -1 where
    unknown. Returns the span columns (for `rows.span_columns_table`) and how many spans they hold.
    """
    mapped = [frameworks.strip(fw, n) for n in names]
    slots = list(dict.fromkeys([*fw.stages, *([fw.wall] if fw.wall else []), *fw.bytes]))  # a step's timings
    slot_of = {m: i for i, m in enumerate(slots)}
    row_slot = np.array([slot_of.get(m, -1) for m in mapped] + [-1], np.int64)[codes]
    mask = row_slot >= 0
    if not mask.any():
        return {}, 0
    raw_of = {m: n for n, m in zip(names, mapped) if m in slot_of}
    width, order = len(slots), list(fw.stages)
    step_of, row = np.unique(steps[mask], return_inverse=True)
    cell = row * width + row_slot[mask]
    last = len(cell) - 1 - np.unique(cell[::-1], return_index=True)[1]  # logged twice: the later value
    value, logged, at = np.full(len(step_of) * width, np.nan), np.zeros(len(step_of) * width, bool), np.full(len(step_of) * width, -1)
    value[cell[last]], logged[cell[last]], at[cell[last]] = values[mask][last], True, times[mask][last]
    value, logged, at = (a.reshape(len(step_of), width) for a in (value, logged, at))

    stage = value[:, : len(order)]
    ok = logged[:, : len(order)] & np.isfinite(stage) & (stage >= 0) & (stage < _MAX_SECONDS)
    durations = np.rint(np.where(ok, stage, 0) * 1e9).astype(np.int64)
    if fw.wall:
        wall = value[:, slot_of[fw.wall]]
        has_wall = logged[:, slot_of[fw.wall]]
        wall_ns = np.rint(np.where(np.isfinite(wall) & (np.abs(wall) < _MAX_SECONDS), wall, 0) * 1e9).astype(np.int64)
    else:
        has_wall, wall_ns = np.zeros(len(step_of), bool), 0
    # a logged step time shorter than its stages' sum: they overlapped (an async run), so each starts at
    # the step's start and the step keeps the logged length, instead of stages laid end to end past it
    overlapped = has_wall & (wall_ns > 0) & (durations.sum(axis=1) > wall_ns)
    length = np.where(overlapped, np.maximum(wall_ns, durations.max(axis=1)), np.maximum(durations.sum(axis=1), wall_ns))
    latest = np.where(logged, at, -1).max(axis=1)  # when the step's timings were logged, -1: not known
    keep = ok.any(axis=1)
    step_of, ok, durations, length, latest, has_wall, value, logged, overlapped = (
        a[keep] for a in (step_of, ok, durations, length, latest, has_wall, value, logged, overlapped))
    start = latest - length
    if (latest < 0).any():  # no logged time: steps follow each other
        starts, prev_end = start.tolist(), None
        for k, (t, span) in enumerate(zip(latest.tolist(), length.tolist())):
            if t < 0:
                starts[k] = prev_end if prev_end is not None else 0
            prev_end = starts[k] + span
        fits = np.array([s + n <= rows.INT64_MAX for s, n in zip(starts, length.tolist())], bool)
        if not fits.all():  # timings that add up past year 2262: those steps get no spans (their scalars stay)
            step_of, ok, durations, length, latest, has_wall, value, logged, overlapped = (
                a[fits] for a in (step_of, ok, durations, length, latest, has_wall, value, logged, overlapped))
            starts = [s for s, f in zip(starts, fits.tolist()) if f]
        start = np.array(starts, np.int64)
        if not len(step_of):
            return {}, 0

    # the spans, step by step: the step span, then its stages in the framework's order
    grid = np.concatenate([np.ones((len(step_of), 1), bool), ok], axis=1)
    pick = np.flatnonzero(grid.ravel())
    i, col = pick // grid.shape[1], pick % grid.shape[1]
    before = np.concatenate([np.zeros((len(step_of), 1), np.int64), np.cumsum(durations, axis=1) - durations], axis=1)
    before[overlapped] = 0
    begins = start[i] + before[i, col]
    ends = begins + np.concatenate([length[:, None], durations], axis=1)[i, col]
    n = len(pick)
    ids = _span_ids(n)
    own = np.flatnonzero(col == 0)  # the row of each step's span
    parents = ids.take(pa.array(own[i], mask=col == 0))
    kinds = ["step", *order]
    trace_ids = pa.array([hashlib.sha256(f"{run_id}:{s}".encode()).hexdigest()[:32] for s in step_of.tolist()], pa.string())
    step_list = step_of.tolist()
    attributes = np.empty(n, object)
    for c, metric in enumerate(kinds):
        where = np.flatnonzero(col == c)
        if not len(where):
            continue
        rows_of = i[where]
        phase = "step" if c == 0 else fw.stages[metric].phase
        head = f'{{"{_names.PHASE}":{json.dumps(phase)},"{_names.STEP}":'
        tail = f',"{SOURCE_ATTR}":"{SOURCE}"'
        if c == 0:
            with_metric = f'{tail},"{METRIC_ATTR}":{json.dumps(raw_of.get(fw.wall))}}}'
            attributes[where] = [head + str(step_list[r]) + (with_metric if has_wall[r] else tail + "}") for r in rows_of.tolist()]
            continue
        tail += f',"{METRIC_ATTR}":{json.dumps(raw_of[metric])}'
        sizes = [m for m in fw.bytes if fw.bytes[m][0] == metric]  # logged bytes of this stage (the last one listed wins)
        size = np.full(len(step_of), np.nan)
        for m in sizes:
            seen = logged[:, slot_of[m]]
            size[seen] = value[seen, slot_of[m]] * fw.bytes[m][1]
        attributes[where] = [head + str(step_list[r]) + tail + (f',"{_names.SYNC_BYTES}":{int(round(size[r]))}}}'
                                                                if np.isfinite(size[r]) else "}") for r in rows_of.tolist()]
    columns = {
        "trace_id": trace_ids.take(pa.array(i)),
        "span_id": ids,
        "parent_span_id": parents,
        "name": pa.array(["step", *(fw.stages[m].name for m in order)], pa.string()).take(pa.array(col)),
        "phase": pa.array(["step", *(fw.stages[m].phase for m in order)], pa.string()).take(pa.array(col)),
        "step": pa.array(step_of[i], pa.int64()),
        "start_ns": pa.array(begins, pa.int64()),
        "end_ns": pa.array(ends, pa.int64()),
        "attributes": pa.array(attributes, pa.string()),
    }
    return columns, n


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
    for line in result["already"]:
        console.print(f"[yellow]skipped[/] {escape(line)}")
    for line in result["failed"]:
        console.print(f"[red]not imported[/] {escape(line)}")
    if not result["files"]:
        console.print(f"nothing new to import into {escape(str(args.out))}")
        return 0
    console.print(
        f"{result['framework']}: {result['metrics']:,} metric rows ({result['aliases']:,} under rltrace names) and "
        f"{result['spans']:,} spans over {result['steps']:,} steps from {len(result['files']) - len(result['failed'])} "
        f"file(s) in {took:.1f} s -> {escape(str(args.out))}")
    if result["steps_note"]:
        console.print(escape(result["steps_note"][0].upper() + result["steps_note"][1:]) + ".")
    console.print("Stage spans are synthesized from logged timings (rl.source=metrics): their durations are "
                  "measured, their placement within a step is not.")
    for line in result["dropped"]:
        console.print(f"[yellow]left out[/] {escape(line)}")
    if result["dropped"]:
        console.print("(counted in the run: rltrace info shows them)")
    if not (result["metrics"] or result["spans"] or result["failed"]):
        console.print("[red]nothing imported[/]: no metric of these files could be kept (the reasons are above)")
        return 1
    return 1 if result["failed"] else 0
