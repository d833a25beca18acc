"""`compact`: merge many small parts into few large ones, sorted by step, while writers run.

Why: writers merge their own parts (`rltrace.store.merge`), but a process killed (`kill -9`), a
writer of an older version, an importer or a run written with `RLTRACE_MERGE_PARTS=0` leaves
small parts, and thousands of small files make every query slow. Merged parts are sorted by
(step, time) with 128k-row groups, so a one-step query reads only the row groups of that step.

How it stays exact with no coordination: parts are immutable and writers only add new names.
Each merged part lists, in its footer, the names of the parts it replaces; it becomes visible by
`os.replace` only after its row count is checked, and readers ignore any part that a visible
merged part replaces. A crash at any point leaves either the inputs or the merged part in force,
never both and never neither. The inputs are deleted `grace_s` seconds later, so a reader that
listed them just before the merge can still finish its queries. The parts of a writer that is
still running are its own to merge (it holds a lock file); compact leaves them alone. Only one
compaction runs at a time per run (a lock file).

An `s3://` run is compacted in the reader's local copy: merged parts are uploaded, then the
parts they replace are deleted from the bucket after the grace. A writer there counts as running
while its process row has no end and a heartbeat less than `LIVE_S` old at the moment the bucket
was listed (never judged by a clock read after minutes of copying).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa

from rltrace import _names
from rltrace.store import merge as merging
from rltrace.store.layout import StoreError, read_manifest
from rltrace.store.merge import TARGET_ROWS
from rltrace.store.views import Part, holding_copies, scan

GRACE_S = 5.0  # seconds a replaced part stays on disk for readers that listed it
LIVE_S = 300.0  # s3:// runs: a writer whose heartbeat was younger than this when the bucket was listed (and
# that never ended) is running: its parts are its own (a writer paused a minute, SIGSTOP or swapping, is alive)
_STALE_TMP_S = 3600  # temp files older than this were left by killed writers


@dataclass
class CompactResult:
    table: str
    parts_before: int
    parts_after: int
    rows: int


def _groups(parts: list[Part], target_rows: int, version: int, copies: set[Path] = frozenset(),
            alone: set[str] = frozenset()) -> list[list[Part]]:
    """Small parts in write order, cut into groups of about `target_rows` rows; a part of an older
    schema version is rewritten even when it is large or alone (converted once, not on every read).
    The parts holding copies of one span (`copies`, `holding_copies`) are one group, whatever their
    size, so the merge keeps each span once. The parts of a writer in `alone` (gone by its
    heartbeat, not proven gone) are merged only with each other: should it come back and merge
    them too, its merged part replaces every input of the compaction's, and readers read one."""
    folding = [p for p in parts if p.path in copies]
    small = sorted((p for p in parts if p.path not in copies and (p.rows < target_rows // 2 or p.version < version)),
                   key=lambda p: (p.path.stat().st_mtime, p.path.name))
    by_writer: dict[str | None, list[Part]] = {}
    for p in small:
        owner = merging.process_of(p.path.name)
        by_writer.setdefault(owner if owner in alone else None, []).append(p)
    groups = [g for own in by_writer.values() for g in merging.by_rows(own, target_rows)]
    return ([folding] if folding else []) + [g for g in groups if len(g) > 1 or g[0].version < version]


def compact(
    run_dir: str | Path,
    *,
    target_rows: int = TARGET_ROWS,
    grace_s: float = GRACE_S,
    progress: Callable[[str, int, int], None] | None = None,
    skip_corrupt: bool = False,
) -> list[CompactResult]:
    """Merge the small parts of every compactable table of a run. Safe while writers and readers run.

    `progress(table, done, total)` is called after each merged group (the CLI draws a bar).
    Replaced parts are deleted after `grace_s` seconds (this call waits for it).
    Raises `StoreError` if another compaction of the same run is running. With `skip_corrupt`,
    damaged parts are left where they are, unmerged (and never deleted).
    """
    from rltrace.store import objstore

    if objstore.is_uri(run_dir):
        return _compact_uri(run_dir, target_rows=target_rows, grace_s=grace_s, progress=progress, skip_corrupt=skip_corrupt)
    run_dir = Path(run_dir)
    tables = {name: _names.TABLES[name] for name in _names.COMPACTABLE}
    read_manifest(run_dir)  # a clear error for a path that is not a run, before taking the lock
    with writing_into(run_dir):
        return _compact(run_dir, tables, target_rows, grace_s, progress, skip_corrupt)


@contextlib.contextmanager
def writing_into(run_dir: str | Path):
    """A run that compaction cannot write into (permissions, a read-only mount) is one line saying what to do."""
    try:
        yield
    except OSError as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
        raise StoreError(
            f"cannot compact {run_dir}: {exc.strerror or exc} writing {exc.filename or run_dir}. Compaction writes "
            "merged parts into the run: run it as a user who can write there, or compact a copy "
            "(cp -r RUN COPY; rltrace compact COPY)"
        ) from None


def _compact(run_dir: Path, tables: dict, target_rows: int, grace_s: float, progress, skip_corrupt: bool) -> list[CompactResult]:
    lock_path = run_dir / ".compact.lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"another `rltrace compact` is running on {run_dir}; wait for it to finish") from None
        snap = scan(run_dir, tables={**tables, **{t.name: t for t in _names.SPAN_SIDECARS}}, skip_corrupt=skip_corrupt,
                    fold=False)
        now = time.time()
        for name in tables:
            for tmp in (run_dir / tables[name].folder).glob(".*.tmp"):
                if now - tmp.stat().st_mtime > _STALE_TMP_S:
                    tmp.unlink(missing_ok=True)
        live = {p for p in {merging.process_of(part.path.name) for parts in snap.parts.values() for part in parts}
                if merging.writer_alive(run_dir, p)}
        _settle_open_spans(run_dir, snap, live)
        results, superseded, _ = merge_tables(run_dir, snap, tables, target_rows, progress, live)
        doomed = [*superseded, *leftovers(snap, live)]
        if doomed:
            time.sleep(grace_s)  # readers that listed these parts just before they were replaced finish first
        for path in doomed:
            merging.delete(path)
        _forget_dead_writers(run_dir, live)
        return results


def _settle_open_spans(run_dir: Path, snap, live: set[str]) -> None:
    """A writer killed between writing finished spans and rewriting its open-spans file left spans
    in both; readers tell them apart by the flush parts newer than that file (`views.not_finished`),
    which this compaction is about to merge away: so the file loses those rows first."""
    from rltrace.store.parts import write_part
    from rltrace.store.views import Part, list_parts, not_finished, read_whole, upgrade

    versions = {p.path.name: p.version for p in snap.parts.get(_names.OPEN_SPANS.name, [])}
    for path in list_parts(run_dir / _names.OPEN_SPANS.folder):
        if path.stem in live:
            continue
        try:  # an older writer's file (hex text ids) is read as the readers read it, then rewritten current
            rows = upgrade(_names.OPEN_SPANS, read_whole(path), versions.get(path.name, _names.OPEN_SPANS.version))
            kept = not_finished(rows, [Part(path=path, rows=rows.num_rows, size=0)], snap.parts.get("spans", []))
            if kept.num_rows < rows.num_rows:
                write_part(path.parent, path.name, kept, _names.OPEN_SPANS)
        except (OSError, ValueError, pa.ArrowException):
            continue  # left as it is: readers still tell the spans apart while the flush parts are there


def leftovers(snap, live: set[str]) -> list[Path]:
    """The replaced parts and the summaries of no part in `snap` that only a compaction will
    delete: those of writers no longer running (killed, or an earlier compaction that stopped
    before deleting its inputs). A running writer (`live`) deletes the inputs of its own merges
    after its grace, and writes a merged part's summary just before the part appears, so its
    files are its own to delete."""
    replacer = {(p.path.parent, name): p.path for parts in snap.parts.values() for p in parts for name in p.replaces}
    out = []
    for path in snap.replaced:
        owner = replacer.get((path.parent, path.name), path)  # a summary of no part: its own name says whose
        if merging.process_of(owner.name) not in live:
            out.append(path)
    return out


def merge_tables(run_dir: Path, snap, tables: dict, target_rows: int, progress, live: set[str],
                 alone: set[str] = frozenset()):
    """Merge the small parts of `tables` in `snap` (parts of the running writers `live` excepted,
    those of writers `alone` merged only with each other, `_groups`): (a result per table, the
    parts replaced, the merged parts written)."""
    results, superseded, written = [], [], []
    summaries = merging.Summaries()  # one, so parents seen in one group are known in the next
    for name, table in tables.items():
        parts = snap.parts[name]
        mine = [p for p in parts if merging.process_of(p.path.name) not in live]
        copies = holding_copies(mine) if table is _names.SPANS else set()
        groups = _groups(mine, target_rows, table.version, copies, alone)
        folder = run_dir / table.folder
        summarise = (lambda merged, out, inputs: summaries(merged, out, inputs, folder)) if table is _names.SPANS else None
        for i, group in enumerate(groups):
            written.append(merging.merge(folder, table, [p.path for p in group], f"c-{uuid.uuid4().hex[:12]}.parquet",
                                         before_visible=summarise, unique=True))
            if summarise is not None:
                written += [p for p in merging.sidecar_paths(written[-1]) if p.exists()]
            superseded.extend(p.path for p in group)
            if progress is not None:
                progress(name, i + 1, len(groups))
        merged = sum(len(g) for g in groups)
        results.append(CompactResult(name, len(parts), len(parts) - merged + len(groups), sum(p.rows for p in parts)))
    return results, superseded, written


def _forget_dead_writers(run_dir: Path, live: set[str]) -> None:
    """Lock files of writers that ended (killed ones leave theirs) once their parts are merged."""
    folder = run_dir / merging.WRITERS
    if not folder.is_dir():
        return
    for lock in folder.glob("*.lock"):
        if lock.stem not in live and not merging.writer_alive(run_dir, lock.stem):
            lock.unlink(missing_ok=True)


_LOCK = ".compact.lock"
_LOCK_STALE_S = 3600  # a compaction lock older than this was left by a compaction that died


def _compact_uri(uri: str, *, target_rows: int, grace_s: float, progress=None, skip_corrupt: bool = False):
    """`rltrace compact` on an `s3://` run: merged in the local copy, merged parts uploaded, the
    parts they replace deleted from the bucket `grace_s` later. Writers still running (a process
    row without an end, with a heartbeat younger than `compact.LIVE_S` at the moment the bucket is
    listed) merge their own parts.
    One compaction at a time per run is asked for with a lock object (an S3 bucket offers no real lock)."""
    from pyarrow import fs

    from rltrace.store import objstore
    from rltrace.store.views import read_whole

    base, s3 = objstore.split(uri), objstore.filesystem()
    lock = f"{base}/{_LOCK}"
    try:
        info = s3.get_file_info(lock)
        if info.type == fs.FileType.File and time.time_ns() - (info.mtime_ns or 0) < _LOCK_STALE_S * 1e9:
            raise StoreError(f"another `rltrace compact` is running on {uri}; wait for it to finish "
                             f"(or delete {_LOCK} in the run if it died)")
        objstore.put(s3, lock, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode())
    except OSError as exc:
        raise objstore.unreachable(uri, exc) from None
    try:
        # The moment the evidence is from: taken before the listing, so a slow bucket (minutes to list
        # and copy) never makes a writer's heartbeat look old; the process rows fetched later are newer.
        now, live, alone = time.time_ns(), set(), set()
        local = objstore.mirror(uri)
        tables = {name: _names.TABLES[name] for name in _names.COMPACTABLE}
        snap = scan(local, tables={**tables, "processes": _names.PROCESSES, **{t.name: t for t in _names.SPAN_SIDECARS}},
                    skip_corrupt=skip_corrupt, fold=False)
        for part in snap.parts.get("processes", []):
            try:
                row = read_whole(part.path, columns=["process_id", "heartbeat_ns", "ended_ns"]).to_pylist()
            except (OSError, ValueError):
                continue
            for r in row:
                if r["ended_ns"] is None and (r["heartbeat_ns"] or 0) > now - LIVE_S * 1e9:
                    live.add(r["process_id"])
                elif r["ended_ns"] is None:  # silent for minutes, but it never said it ended: not proven gone
                    alone.add(r["process_id"])
        results, superseded, written = merge_tables(local, snap, tables, target_rows, progress, live, alone - live)
        for path in written:
            objstore.upload(uri, local, path)
        doomed = [*superseded, *leftovers(snap, live)]
        doomed += [s for p in superseded for s in merging.sidecar_paths(p) if s.exists()]
        if doomed:
            time.sleep(grace_s)  # readers that listed these parts just before they were replaced fetch them first
        for path in doomed:
            try:
                s3.delete_file(f"{base}/{Path(path).relative_to(local).as_posix()}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise objstore.unreachable(uri, exc) from None
            Path(path).unlink(missing_ok=True)
        return results
    finally:
        with contextlib.suppress(OSError):
            s3.delete_file(lock)
