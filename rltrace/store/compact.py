"""`compact`: merge many small parts into few large ones, sorted by step, while writers run.

Why: every flush of every process writes a part, and thousands of small files make every query
slow. Merged parts are sorted by (step, time) with 128k-row groups, so a one-step query reads
only the row groups of that step.

How it stays exact with no coordination: parts are immutable and writers only add new names.
Each merged part lists, in its footer, the names of the parts it replaces; it becomes visible by
`os.replace` only after its row count is checked, and readers ignore any part that a visible
merged part replaces. A crash at any point leaves either the inputs or the merged part in force,
never both and never neither. The inputs are deleted `grace_s` seconds later, so a reader that
listed them just before the merge can still finish its queries. Only one compaction runs at a
time per run (a lock file); writers never take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import duckdb
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.store.layout import StoreError, read_manifest
from rltrace.store.views import Part, scan, sql_paths

ROW_GROUP_ROWS = 131_072
TARGET_ROWS = 2_000_000  # rows per merged part
GRACE_S = 5.0  # seconds a replaced part stays on disk for readers that listed it
_STALE_TMP_S = 3600  # temp files older than this were left by killed writers


@dataclass
class CompactResult:
    table: str
    parts_before: int
    parts_after: int
    rows: int


def _groups(parts: list[Part], target_rows: int) -> list[list[Part]]:
    """Small parts in write order, cut into groups of about `target_rows` rows."""
    small = sorted((p for p in parts if p.rows < target_rows // 2), key=lambda p: (p.path.stat().st_mtime, p.path.name))
    groups, current, rows = [], [], 0
    for part in small:
        if current and rows + part.rows > target_rows:
            groups.append(current)
            current, rows = [], 0
        current.append(part)
        rows += part.rows
    if current:
        groups.append(current)
    return [g for g in groups if len(g) > 1]


def _merge(folder: Path, table: _names.Table, group: list[Part], order: tuple[str, ...]) -> None:
    """Write the group as one sorted part that replaces it; the inputs are left for the caller."""
    names = json.dumps([p.path.name for p in group])
    out = folder / f"c-{uuid.uuid4().hex[:12]}.parquet"
    tmp = folder / f".{out.name}.tmp"
    files = sql_paths([p.path for p in group])

    def lit(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    run_id = read_manifest(folder.parent)["run_id"]
    kv = (
        f"{{{lit(_names.META_TABLE.decode())}: {lit(table.name)}, "
        f"{lit(_names.META_RUN_ID.decode())}: {lit(run_id)}, "
        f"{lit(_names.META_VERSION.decode())}: {lit(str(table.version))}, "
        f"{lit(_names.META_REPLACES.decode())}: {lit(names)}}}"
    )
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            f"COPY (SELECT * FROM read_parquet({files}, union_by_name=true) ORDER BY {', '.join(order)}) "
            f"TO {lit(str(tmp))} (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {ROW_GROUP_ROWS}, KV_METADATA {kv})"
        )
        expected = sum(p.rows for p in group)
        written = pq.read_metadata(tmp).num_rows
        if written != expected:
            raise StoreError(f"compaction of {folder} wrote {written} rows for {expected}; the inputs were kept")
        os.replace(tmp, out)
    finally:
        con.close()
        tmp.unlink(missing_ok=True)


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
        raise StoreError(f"{run_dir}: compact works on run directories on disk, not on object-store runs yet")
    run_dir = Path(run_dir)
    tables = {name: _names.TABLES[name] for name in _names.COMPACTABLE}
    read_manifest(run_dir)  # a clear error for a path that is not a run, before taking the lock
    with writing_into(run_dir):
        return _compact(run_dir, tables, target_rows, grace_s, progress, skip_corrupt)


@contextlib.contextmanager
def writing_into(run_dir: Path):
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
        snap = scan(run_dir, tables=tables, skip_corrupt=skip_corrupt)
        for path in snap.replaced:  # a previous compaction stopped before deleting its inputs
            path.unlink(missing_ok=True)
        now = time.time()
        for name in tables:
            for tmp in (run_dir / tables[name].folder).glob(".*.tmp"):
                if now - tmp.stat().st_mtime > _STALE_TMP_S:
                    tmp.unlink(missing_ok=True)
        results, superseded = [], []
        for name, table in tables.items():
            parts = snap.parts[name]
            groups = _groups(parts, target_rows)
            for i, group in enumerate(groups):
                _merge(run_dir / table.folder, table, group, _names.COMPACTABLE[name])
                superseded.extend(p.path for p in group)
                if progress is not None:
                    progress(name, i + 1, len(groups))
            merged = sum(len(g) for g in groups)
            results.append(
                CompactResult(name, len(parts), len(parts) - merged + len(groups), sum(p.rows for p in parts))
            )
        if superseded:
            time.sleep(grace_s)  # readers that listed the old parts just before the merge finish first
        for path in superseded:
            path.unlink(missing_ok=True)
        return results
