"""`rltrace import slime PATH... --out RUN_DIR`: slime's debug dumps into a run (reading them:
slime_dump.py; traces: slime_trace.py; export: slime_export.py).

One frozen batch per rollout id (step = rollout id), with the train dumps of that rollout joined
to it, and the samples' traces as spans and `samples` rows (`rltrace.replay.slime_trace`).

What cannot be imported costs only itself, and is counted with file, position and reason (as the
live write path counts its drops; `rltrace info` shows them): a sample that cannot be read (a
`response_length` that is not 0..len(tokens), a missing field), a train sample that matches no
rollout sample, a field the store cannot hold (left out of that sample, with the `--drop-field`
that leaves it out of every one), a span or `samples` row the store refuses. A file that is not
a slime dump costs only itself too: it is named, and the other files are imported. Text is made
valid UTF-8 as everywhere in the store. Everything one command imports becomes visible together,
and a dump imported before (same content) is skipped, so a retry never stores a sample twice
(`rltrace.store.imports`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from rltrace import _names
from rltrace.replay import codec, slime_trace
from rltrace.replay.batch import batch_fields, build_table, part_name, write_options
from rltrace.replay.errors import SlimeDumpError
from rltrace.replay.slime_dump import (SampleError, dump_kind, find_dumps, join_train, read_dump, rollout_id,
                                       rollout_row, train_samples, unstorable_fields)
from rltrace.store import imports
from rltrace.store import rows as store_rows
from rltrace.store.convert import show, text

__all__ = ["import_slime", "import_command", "read_dump"]  # read_dump: for callers that read one dump

SAMPLES, FIELDS = "slime samples", "slime fields"  # what is counted when left out (drop-count tables)


def import_slime(
    paths: Iterable[str | Path],
    out: str | Path,
    *,
    trust_pickle: bool = False,
    drop: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Convert slime dumps into frozen batches (+ spans and samples from traces) in run dir `out`.

    Returns a dict: batches ({step, batch_id, samples, files} each), spans, samples (rows),
    unmatched_ends, carried, skipped (evaluation dumps), already (dumps imported before: nothing
    added), failed (files that are not slime dumps), dropped (one line per file and reason:
    samples and fields left out, with positions).
    """
    drop = frozenset(drop)
    imp = imports.Import(out, "slime", find_dumps(paths))
    result: dict[str, Any] = {"batches": [], "spans": 0, "samples": 0, "unmatched_ends": 0, "carried": 0, "skipped": [],
                              "already": imp.skipped, "failed": [], "dropped": []}
    rollouts: dict[int, tuple[Path, list]] = {}
    trains: dict[int, list[tuple[Path, list]]] = {}
    given = list(imp.files)
    for k, (path, _) in enumerate(given):
        if progress:
            progress("reading", k, len(given))
        if path.name.startswith("eval_"):
            result["skipped"].append(f"{path}: evaluation dump, not a training batch")
            imp.leave_out(path)
            continue
        try:
            data = read_dump(path, trust_pickle=trust_pickle)
            kind = dump_kind(data, path)
            rid = rollout_id(data, path)
            if kind == "rollout" and rid in rollouts:
                raise SlimeDumpError(f"{path}: rollout_id {rid} also comes from {rollouts[rid][0]}; import one of them")
            if kind == "rollout":
                rollouts[rid] = (path, data["samples"])
            else:
                trains.setdefault(rid, []).append((path, train_samples(data, kind, path)))
        except SlimeDumpError as exc:
            result["failed"].append(str(exc))
            imp.leave_out(path)
    if not rollouts and not trains:
        if result["failed"]:
            more = len(result["failed"]) - 1
            raise SlimeDumpError(result["failed"][0] + (f" (and {more} more file(s) that are not slime dumps)" if more else ""))
        return result
    with imp:
        process = imp.begin("slime-import", {"imported_from": "slime", "paths": [str(p) for p, _ in imp.files]})
        read = {rid: _read_samples(imp, path, samples, drop) for rid, (path, samples) in rollouts.items()}
        starts = {rid: slime_trace.own_start(kept, rid) for rid, (_, kept) in read.items()}
        ends = slime_trace.step_ends({rid: kept for rid, (_, kept) in read.items()}, starts)
        steps = sorted(set(rollouts) | set(trains))
        frozen = 0
        for k, rid in enumerate(steps):
            if progress:
                progress("converting", k, len(steps))
            frozen += _step(imp, process, rid, rollouts.get(rid), read.get(rid), trains.get(rid, []), drop, starts, ends,
                            result)
        imp.commit(rows_written=result["samples"] + frozen, spans_written=result["spans"],
                   summary={"batches": len(result["batches"]), "samples": result["samples"]})
    result["dropped"] = imp.refused.sentences() + [f"{r['reason']} ({r['count']} {r['table']})" for r in imp.drops.records()]
    return result


def _read_samples(imp: imports.Import, path: Path, samples: list, drop: frozenset[str]) -> tuple[dict[int, dict], list]:
    """The rows of a rollout dump's samples that can be read ({position: row}), and the samples
    with None in place of each one that cannot (counted with its position and reason)."""
    rows, kept = {}, []
    for i, sample in enumerate(samples):
        try:
            row = rollout_row(sample, drop)
        except SampleError as exc:
            imp.refused.add(SAMPLES, path, str(exc), ("sample", i))
            kept.append(None)
            continue
        for _, why in unstorable_fields(row):
            imp.refused.add(FIELDS, path, why, ("sample", i))
        rows[i] = row
        kept.append(sample)
    return rows, kept


def _step(imp: imports.Import, process, rid: int, rollout: tuple[Path, list] | None, read: tuple[dict, list] | None,
          trains: list[tuple[Path, list]], drop: frozenset[str], starts: dict, ends: dict, result: dict) -> int:
    """Stage the batch, spans and samples of one rollout id; returns the frozen samples."""
    rows, kept = read if read is not None else ({}, None)
    rows = dict(rows)
    origin = {i: (rollout[0], i) for i in rows} if rollout else {}
    for path, samples in trains:
        base = max(rows, default=-1) + 1  # where join_train puts the rows of a train dump without its rollout dump
        for j, why in join_train(rows, rollout[1] if rollout else None, samples, drop):
            imp.refused.add(SAMPLES, path, why, ("train sample", j))
        origin.update({i: (path, i - base) for i in rows if i not in origin})
    sources = ([rollout[0]] if rollout else []) + [p for p, _ in trains]
    order = sorted(rows)
    batch_rows = [rows[i] for i in order]
    if batch_rows:
        meta = {"source": "slime", "files": [text(str(p)) for p in sources]}
        if rollout:
            meta["slime_fields"] = list(dict.fromkeys(k for s in rollout[1] if isinstance(s, dict) for k in s if k not in drop))
        batch_id = hashlib.sha256(f"{imp.key}:{rid}".encode()).hexdigest()[:12]  # the same on a retry
        table = _batch_table(imp, rid, batch_id, batch_rows, [origin[i] for i in order], meta, sources, process)
        imp.stage(_names.BATCHES, table, name=part_name(rid, batch_id), write_options=write_options(table))
        result["batches"].append({"step": rid, "batch_id": batch_id, "samples": len(batch_rows), "files": [str(p) for p in sources]})
    if rollout and any(s is not None for s in kept):
        drops = store_rows.Drops()
        tables, counts = slime_trace.rollout_tables(rid, kept, process, starts, ends=ends, drops=drops)
        for spec, table in tables:
            imp.stage(spec, table, name=imp.part_name(spec.name))
        for r in drops.records():  # rows the store refused (an int past int64, ...), named by their dump
            imp.drops.add(r["table"], r["count"], f"{text(str(rollout[0]))}: {r['reason']}", r.get("column"))
        for key in ("spans", "samples", "unmatched_ends", "carried"):
            result[key] += counts[key]
    return len(batch_rows)


def _batch_table(imp, rid, batch_id, batch_rows, origins, meta, sources, process) -> pa.Table:
    """The frozen batch; a field the store cannot hold (a value of another kind than the rest of its
    column, an integer past int64) is left out of the samples that hold it, each counted."""
    reason = text("slime " + ", ".join(f"{p.parent.name}/{p.name}" for p in sources))

    def build() -> pa.Table:
        return build_table(rid, batch_id, "rows", batch_rows, len(batch_rows), fields=batch_fields(meta), trigger="import",
                           reason=reason, frozen_ns=time.time_ns(), process=process)

    try:
        return build()
    except (TypeError, ValueError, OverflowError, pa.ArrowException):
        pass
    for name in list(dict.fromkeys(k for r in batch_rows for k in r)):
        for k, why in _unstorable(name, [r.get(name) for r in batch_rows]):
            batch_rows[k].pop(name, None)
            path, position = origins[k]
            imp.refused.add(FIELDS, path, f"field {name!r} {why}; leave it out with --drop-field {name}", ("sample", position))
    return build()


def _unstorable(name: str, column: list) -> list[tuple[int, str]]:
    """(row, why) for each value of a batch column that keeps the column from being stored: values
    that cannot be stored alone, then values of another kind (or dtype) than most samples hold."""
    def fails(values: list) -> bool:
        try:
            codec.encode_rows(name, values)
        except (TypeError, ValueError, OverflowError, pa.ArrowException):
            return True
        return False

    if not fails(column):
        return []
    out = {k: f"holds {show(v)}, which cannot be stored" for k, v in enumerate(column) if v is not None and fails([v])}
    rest = [None if k in out else v for k, v in enumerate(column)]
    if not fails(rest):
        return list(out.items())
    kinds = [None if v is None else (codec.kind_of(v), str(getattr(v, "dtype", "")) or type(v).__name__) for v in rest]
    counts: dict = {}
    for kind in kinds:
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1
    common = max(counts, key=counts.get)  # what most samples hold stays
    for k, kind in enumerate(kinds):
        if kind is not None and kind != common:
            out[k] = f"holds {kind[1]} where most samples hold {common[1]}"
    if fails([None if k in out else v for k, v in enumerate(column)]):
        out.update({k: "cannot be stored beside the other samples' values" for k, v in enumerate(column) if v is not None and k not in out})
    return sorted(out.items())


def import_command(args) -> int:
    """`rltrace import slime PATH... --out RUN_DIR`."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress

    console = Console()
    with Progress(console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage} slime dumps", total=total)
            bar.update(tasks[stage], completed=done + 1)

        result = import_slime(args.paths, args.out, trust_pickle=args.trust_pickle, drop=args.drop_field, progress=progress)
    for line in result["already"]:
        console.print(f"[yellow]skipped[/] {escape(line)}")
    for line in result["failed"]:
        console.print(f"[red]not imported[/] {escape(line)}")
    for b in result["batches"]:
        console.print(f"step {b['step']}: {b['samples']} samples from {escape(', '.join(b['files']))}")
    console.print(f"{len(result['batches'])} batches, {result['samples']} sample rows and {result['spans']} spans from traces "
                  f"-> {escape(str(args.out))}")
    if result["carried"]:
        console.print(f"{result['carried']} sample(s) of a partial rollout also ran in an earlier step: "
                      "a row there too (in_batch false), with the spans that ran then")
    if result["unmatched_ends"]:
        console.print(f"[yellow]{result['unmatched_ends']} span end(s) without a start[/] kept as zero-length spans marked slime.unmatched_end")
    for s in result["skipped"]:
        console.print(f"[yellow]skipped[/] {escape(s)}")
    for line in result["dropped"]:
        console.print(f"[yellow]left out[/] {escape(line)}")
    if result["dropped"]:
        console.print("(counted in the run: rltrace info shows them)")
    if not (result["samples"] or result["spans"] or result["already"] or result["failed"]):
        console.print("[red]nothing imported[/]: no sample or span of these files could be kept (the reasons are above)")
        return 1
    return 1 if result["failed"] else 0
