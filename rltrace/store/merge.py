"""Merging parts: how a writer compacts its own parts while it runs and when it exits, and the
one merge that `rltrace compact` uses too.

Why: every flush writes a part, and a part is mostly its Parquet footer when a process records a
few spans a second (~8 KB a second per process, 375-587 bytes a span). So each process merges
its own small parts in the background (and everything left at exit), into parts sorted by step,
and a run nobody compacted by hand is compact once its writers exit.

How it stays exact with readers running and no coordination: a merged part lists in its footer
the parts it replaces and becomes visible by `os.replace`, after its row count is checked; readers
ignore any part that a visible part replaces (`store.views`); the inputs are deleted `grace_s`
seconds later, so a reader that listed them just before can still read them. A writer merges
only its own parts (named after its process id) and holds a lock file while it lives
(`.writers/<process_id>.lock`), so `rltrace compact` leaves a live writer's parts alone and two
mergers never replace the same part.

Policy: the flush parts of a table are merged once there are `FLUSH_PARTS` of them or the oldest
is `MAX_AGE_S` old; merged parts are merged again, `TIER` at a time, while they stay below
`TARGET_ROWS` (size tiers, so each row is rewritten a few times, not once per merge).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.store import digest, requests, rows
from rltrace.store.parts import MARK_ROWS, may_hold_engine_rows, received_from, sessions_of, write_part
from rltrace.store.write_errors import errors

logger = logging.getLogger("rltrace")

ROW_GROUP_ROWS = 131_072  # a merged part's row groups: a one-step query reads one or two of them
SUMMARY_GROUP_ROWS = 16_384  # a per-part summary's: a batch of steps reads only the row groups of its time range
WORTH = 0.75  # a per-part summary is written when it holds at most this share of its part's rows,
SUMMARISE_ROWS = 65_536  # or when its part is this large (it is narrower, with the attributes it needs read out)
TARGET_ROWS = 2_000_000  # rows per merged part at most
FLUSH_PARTS = 32  # flush parts of a table that start a merge ...
MAX_AGE_S = 60.0  # ... or the age of the oldest one
TIER = 8  # merged parts of a similar size that are merged again
EXIT_GRACE_S = 1.0  # at exit, replaced parts stay at most this long (the process is leaving)
WRITERS = _names.WRITERS
process_of, merged_name, is_flush_part = _names.process_of, _names.merged_name, _names.is_flush_part


# --- the merge ------------------------------------------------------------------------------------
def merge(
    folder: Path,
    table: _names.Table,
    inputs: list[Path],
    out_name: str,
    *,
    read: Callable[[Path], pa.Table] | None = None,
    before_visible: Callable[[pa.Table, str, list[tuple[Path, pa.Table]]], None] | None = None,
    unique: bool = False,
    also_replaces: list[str] = (),
) -> Path:
    """Write the rows of `inputs` (parts of `table`, of any schema version) as one part
    `folder/out_name` of the current version, sorted by the table's compaction keys, that replaces
    them. The inputs are left for the caller to delete.

    `read(path)` reads an input (default: from disk through one handle); `before_visible(merged,
    out_name, inputs)` runs on the sorted rows (and the inputs' paths and rows) before the part
    becomes visible: a span part's per-part summary is written there, so a reader never finds the
    part without it. With `unique`, a span whose identity (trace_id, span_id) is in the inputs more
    than once is kept once (`rltrace compact` folds copies left behind away). `also_replaces`:
    parts the inputs hid that are still in the store (`Spool.covered`: an `s3://` run's bucket,
    which `still_there` cannot look into); the merged part names them too."""
    from rltrace.store.views import read_whole, upgrade

    tables = [(read or read_whole)(p) for p in inputs]
    sessions = {s for t in tables for s in sessions_of(t.schema.metadata)}
    tables = [upgrade(table, t, int((t.schema.metadata or {}).get(_names.META_VERSION, b"1"))) for t in tables]
    merged = rows.concat(tables)
    keys = _names.COMPACTABLE[table.name]
    if merged.num_rows:
        merged = merged.take(pc.sort_indices(merged, sort_keys=[(k, "ascending") for k in keys]))  # nulls last
    expected = sum(t.num_rows for t in tables)
    if unique and table.name == _names.SPANS.name and merged.num_rows:
        merged = rows.first_of_each(merged)
        expected = merged.num_rows if merged.num_rows <= expected else -1
    if merged.num_rows != expected:
        raise OSError(f"merging {folder} gave {merged.num_rows} rows for {expected}; the inputs were kept")
    if before_visible is not None:
        before_visible(merged, out_name, list(zip(inputs, tables)))
    replaces = list(dict.fromkeys([p.name for p in inputs] + still_there(folder, tables) + list(also_replaces)))
    footer = {_names.META_REPLACES: json.dumps(replaces).encode()}
    if sessions:  # received rows stay marked as such in the merged part
        footer.update(received_from(sessions))
    out = write_part(folder, out_name, merged, table, footer,
                     write_options={"row_group_size": ROW_GROUP_ROWS})
    written = pq.read_metadata(out).num_rows
    if written != expected:  # never: the part is made visible only whole; checked all the same
        raise OSError(f"{out} holds {written} rows for {expected}")
    return out


def still_there(folder: Path, inputs: list[pa.Table]) -> list[str]:
    """The parts the inputs replace that are still in `folder` (their delete failed: a read-only
    moment, `chattr +i`): the merged part replaces them too, so they stay hidden once the inputs
    are gone, and whoever deletes the inputs deletes them."""
    out = []
    for t in inputs:
        try:
            names = json.loads((t.schema.metadata or {}).get(_names.META_REPLACES, b"[]"))
        except ValueError:
            continue
        out += [n for n in names if isinstance(n, str) and n not in out and (Path(folder) / n).exists()]
    return out


def replaced_by(part: Path) -> list[str]:
    """The names a part's footer says it replaces."""
    return json.loads((pq.read_metadata(part).metadata or {}).get(_names.META_REPLACES, b"[]"))


def summary_path(part: Path) -> Path | None:
    """Where the per-part summary of a span part lives (`span_digests/<name>`), None for other tables."""
    return next((p for p in sidecar_paths(part) if p.parent.name == _names.SPAN_DIGEST.folder), None)


def sidecar_paths(part: Path) -> list[Path]:
    """Where the files beside a span part live (its per-part summary, its engine request rows);
    none for other tables."""
    part = Path(part)
    if part.parent.name != _names.SPANS.folder:
        return []
    return [part.parent.parent / t.folder / part.name for t in _names.SPAN_SIDECARS]


def delete(part: Path) -> OSError | None:
    """Delete a replaced part, and the files beside it if it has any; the error if one could not
    be deleted (then it stays hidden by the part that replaces it, and is deleted again later)."""
    failed = None
    for path in (Path(part), *sidecar_paths(part)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed = failed or exc
    return failed


def write_requests(spans_folder: Path, part_name: str, spans: pa.Table) -> Path | None:
    """Store the engine request rows of span part `part_name` (`spans`: its rows) beside it, when it
    is large enough that a report would rather not scan it (`parts.MARK_ROWS`) and some of its
    spans may be requests (None otherwise: a report scans a small part, and skips one marked 0)."""
    if spans.num_rows < MARK_ROWS or not may_hold_engine_rows(spans):
        return None
    meta = {**digest.footer(part_name, spans.num_rows), _names.META_REQUESTS_SQL: requests.SQL_VERSION}
    return write_part(Path(spans_folder).parent / _names.SPAN_REQUESTS.folder, part_name, requests.rows_of(spans),
                      _names.SPAN_REQUESTS, meta)


def write_summary(spans_folder: Path, part_name: str, summary: pa.Table, rows_: int) -> Path | None:
    """Write the per-part summary of span part `part_name` (holding `rows_` spans) beside it, if it is
    worth reading instead (None if not: a small part whose spans hardly merge reads as fast)."""

    if summary.num_rows > WORTH * rows_ and rows_ < SUMMARISE_ROWS:
        return None
    return write_part(Path(spans_folder).parent / _names.SPAN_DIGEST.folder, part_name, summary, _names.SPAN_DIGEST,
                      digest.footer(part_name, rows_), write_options={"row_group_size": SUMMARY_GROUP_ROWS})


class Summaries:
    """Writes the per-part summary of each merged span part (`rltrace.store.digest`): from the
    inputs' own summaries where they have one, from their spans otherwise, with what this process
    knows (`knowledge`: its running spans, from `live()`)."""

    def __init__(self, process=None, live: Callable[[], list] | None = None,
                 source: Callable[[str, str], Path | None] | None = None):
        self.knowledge = digest.Knowledge()
        self._process = process
        self._live = live
        self._source = source

    def after_fork(self) -> None:
        self.knowledge = digest.Knowledge()  # the parent's running spans and pending parents are the parent's

    def __call__(self, merged: pa.Table, out_name: str, inputs: list[tuple[Path, pa.Table]], folder: Path) -> None:
        from rltrace.store.views import read_whole

        try:
            done, fresh = [], []
            for path, rows_ in inputs:
                found = self._summary_of(path, rows_.num_rows)
                (done.append(read_whole(found)) if found is not None else fresh.append(rows_))
            if fresh:
                self.knowledge.process_id = getattr(self._process, "process_id", None)
                self.knowledge.live = self._live() if self._live is not None else []
                done.append(digest.build(rows.concat(fresh), self.knowledge))
            write_summary(folder, out_name, digest.combine(done) if len(done) > 1 else done[0], merged.num_rows)
        except Exception as exc:  # the part is read as spans, slower but the same
            logger.warning("rltrace: no per-part summary for %s (%s); reports read its spans", out_name, exc)
        try:
            write_requests(folder, out_name, merged)
        except Exception as exc:  # the part's attributes are read by the report, slower but the same
            logger.warning("rltrace: no engine request rows for %s (%s); reports read its spans", out_name, exc)

    def _summary_of(self, part: Path, nrows: int) -> Path | None:
        """An input's summary, if it has one that is its own (names a part of its name and rows)."""
        path = summary_path(part)
        if path is None:
            return None
        if not path.exists() and self._source is not None:
            path = self._source(_names.SPAN_DIGEST.folder, part.name)
        if path is None or not path.exists():
            return None
        try:
            meta = pq.read_metadata(path).metadata or {}
            current = int(meta.get(_names.META_VERSION, b"0")) == _names.SPAN_DIGEST.version  # older ones lack columns
            return path if current and json.loads(meta[_names.META_DIGEST_OF]) == [part.name, nrows] else None
        except (OSError, KeyError, ValueError, pa.ArrowException):
            return None


# --- a writer's own parts ---------------------------------------------------------------------------
@dataclass
class _Part:
    name: str
    rows: int
    merged: bool
    since: float = field(default_factory=time.monotonic)


def _tier(rows_: int) -> int:
    return int(math.log(max(rows_, 1), TIER))


class Merger:
    """The parts this process wrote to one run and has not merged yet, and their merging.

    `wrote(table, path, rows)` is told of every part (from any thread); `tick()` merges what is due
    and deletes replaced parts whose grace is over (on the writer thread); `close()` merges
    everything at exit. `source(folder, name)` finds an input (an `s3://` run's spool may have
    moved it), `replaced(folder, names, by)` is told of parts a merged part replaced (the spool
    deletes them from the bucket), `covered(folder, names)` gives the parts those parts hid that
    are still in the store (the spool's bucket), which the merged part names too. Never raises into
    its caller: a merge that fails is logged and its inputs stay as they are.
    """

    def __init__(self, run_dir: Path, process, *, enabled: bool = True, grace_s: float = 5.0,
                 source: Callable[[str, str], Path | None] | None = None,
                 replaced: Callable[[str, list[str], str], None] | None = None,
                 lock: bool = True, summaries: Summaries | None = None,
                 covered: Callable[[str, list[str]], list[str]] | None = None):
        self.run_dir = Path(run_dir)
        self.process = process
        self.enabled = enabled
        self.grace_s = grace_s
        self._source = source
        self._replaced = replaced
        self._covered = covered
        self._summaries = summaries if summaries is not None else Summaries(source=source)
        self._lock = threading.Lock()
        self._ticking = threading.Lock()
        self._parts: dict[str, list[_Part]] = {}  # table name -> own parts not yet replaced
        self._doomed: list[tuple[float, list[Path]]] = []  # (delete after, replaced parts)
        self._undeleted: list[Path] = []  # replaced parts whose delete failed: tried again after _retry_at
        self._retry_at = 0.0
        self._said_undeleted = False
        self._seq = 0
        self._paused: dict[str, float] = {}  # table -> no merge before (a merge failed: a full disk)
        self._lock_file = None
        self._want_lock = enabled and lock
        self.merges = 0
        self._hold_lock()

    # --- liveness ----------------------------------------------------------------------------------
    def _hold_lock(self) -> None:
        """Hold `.writers/<process_id>.lock` while this process lives (released by the OS at exit,
        also on kill -9): `rltrace compact` merges a writer's parts only when it can take it."""
        if not self._want_lock or self._lock_file is not None:
            return
        handle = None
        try:
            folder = self.run_dir / WRITERS
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self.process.process_id}.lock"
            for _ in range(3):
                handle = open(path, "a")
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with contextlib.suppress(FileNotFoundError):
                    if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                        break
                handle.close()  # `rltrace compact` removed the file between our open and our lock: again
                handle = None
            else:
                raise OSError(f"{path} keeps being removed")
            self._lock_file = handle
        except OSError as exc:  # no lock, no merging: `rltrace compact` could take the same parts
            if handle is not None:
                handle.close()
            logger.warning("rltrace: cannot hold a writer lock in %s (%s); this process will not merge its parts", self.run_dir, exc)
            self.enabled = False

    def after_fork(self) -> None:
        """In a forked child: its own parts, and its own lock, taken before its first part
        (`claim`: its process id is renewed after this runs); the parent's parts and lock are the parent's."""
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                self._lock_file.close()  # the lock stays the parent's (held by its descriptor)
            self._lock_file = None
        self._lock, self._ticking = threading.Lock(), threading.Lock()
        self._parts, self._doomed, self._seq, self._paused, self._undeleted = {}, [], 0, {}, []
        self._summaries.after_fork()

    # --- what was written ----------------------------------------------------------------------------
    def claim(self) -> None:
        """Hold this process's lock before it writes a part. A forked child has none until its
        first part; taken after that part, `rltrace compact` could merge it as a dead writer's
        while this process merges it too."""
        if self.enabled and self._want_lock and self._lock_file is None:
            with self._lock:
                self._hold_lock()

    def wrote(self, table: _names.Table, path: Path, nrows: int) -> None:
        """A part of `table` this process wrote (a flush part); merged later if the table is compactable."""
        if not self.enabled or table.name not in _names.COMPACTABLE:
            return
        with self._lock:
            self._hold_lock()
            if not self.enabled:
                return
            self._parts.setdefault(table.name, []).append(_Part(Path(path).name, nrows, merged=False))

    def pending(self, table: str) -> list[str]:
        """Names of this process's parts of `table` not replaced yet (for tests and `info`)."""
        with self._lock:
            return [p.name for p in self._parts.get(table, [])]

    # --- merging --------------------------------------------------------------------------------------
    def _due(self, parts: list[_Part], final: bool) -> list[list[_Part]]:
        """Groups of parts to merge now: the flush parts once due, and each size tier of merged parts
        that has filled up; at exit, every part below TARGET_ROWS / 2."""
        flush = [p for p in parts if not p.merged]
        merged = [p for p in parts if p.merged and p.rows < TARGET_ROWS // 2]
        if final:
            groups = by_rows(merged + flush)
        else:
            groups = []
            if len(flush) >= FLUSH_PARTS or (flush and time.monotonic() - flush[0].since >= MAX_AGE_S):
                groups += by_rows(flush)
            tiers: dict[int, list[_Part]] = {}
            for p in merged:
                tiers.setdefault(_tier(p.rows), []).append(p)
            for tier in tiers.values():
                if len(tier) >= TIER:
                    groups += by_rows(tier)
        return [g for g in groups if len(g) > 1]

    def tick(self, final: bool = False) -> int:
        """Merge what is due and delete what is past its grace; the number of merges done."""
        if not self.enabled:
            return 0
        with self._ticking:  # one merge pass at a time (the writer thread's, or a caller's)
            return self._tick(final)

    def _tick(self, final: bool) -> int:
        done = 0
        for name in list(self._parts):
            if not final and self._paused.get(name, 0.0) > time.monotonic():
                continue
            with self._lock:
                groups = self._due(list(self._parts.get(name, [])), final)
            for group in groups:
                done += self._merge(_names.TABLES[name], group)
        self._delete_due(final)
        return done

    def _merge(self, table: _names.Table, group: list[_Part]) -> int:
        folder = self.run_dir / table.folder
        paths = []
        for part in group:
            path = self._source(table.folder, part.name) if self._source else folder / part.name
            if path is None or not path.exists():
                logger.debug("rltrace: %s/%s is gone; not merged", table.folder, part.name)
                self._forget(table.name, [part])
                return 0
            paths.append(path)
        self._seq += 1
        out_name = merged_name(self.process.process_id, self._seq)

        def read(path: Path) -> pa.Table:
            from rltrace.store.views import read_whole

            try:
                return read_whole(path)
            except FileNotFoundError:  # an object-store spool moved it meanwhile (uploaded): look again
                again = self._source(table.folder, path.name) if self._source else None
                if again is None:
                    raise
                paths[paths.index(path)] = again
                return read_whole(again)

        summarise = None
        if table is _names.SPANS:
            def summarise(merged, name, inputs):
                self._summaries(merged, name, inputs, folder)
        try:
            hidden = self._covered(table.folder, [p.name for p in group]) if self._covered else []
            merge(folder, table, list(paths), out_name, read=read, before_visible=summarise, also_replaces=hidden)
        except Exception as exc:  # never into the writer: the inputs stay as they are, readable
            errors(f"merging {table.name} parts", exc, "they stay as written and are merged later")
            if not (folder / out_name).exists():  # what was written beside the part that never came
                for path in sidecar_paths(folder / out_name):
                    with contextlib.suppress(OSError):
                        path.unlink()
            self._paused[table.name] = time.monotonic() + MAX_AGE_S  # try again later, not at every tick
            return 0
        rows_ = sum(p.rows for p in group)
        names = {p.name for p in group}
        try:
            carried = [n for n in replaced_by(folder / out_name) if n not in names]  # `still_there`
        except (OSError, ValueError, pa.ArrowException):
            carried = []
        with self._lock:
            mine = self._parts.setdefault(table.name, [])
            mine[:] = [p for p in mine if p.name not in names]
            mine.append(_Part(out_name, rows_, merged=True))
            self._doomed.append((time.monotonic() + self.grace_s, paths + [folder / n for n in carried]))
        if self._replaced is not None:
            self._replaced(table.folder, [p.name for p in group] + carried, out_name)
            if table is _names.SPANS:  # the files beside them (merged inputs may have some) go with them
                for sidecar in _names.SPAN_SIDECARS:
                    self._replaced(sidecar.folder, [p.name for p in group if p.merged], out_name)
        self.merges += 1
        return 1

    def _forget(self, table: str, gone: list[_Part]) -> None:
        with self._lock:
            names = {p.name for p in gone}
            self._parts[table] = [p for p in self._parts.get(table, []) if p.name not in names]

    def _delete_due(self, final: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if final:  # the process is leaving: wait out a short grace, not the whole of it
                wait = max((t for t, _ in self._doomed), default=now) - now
                if self._doomed and wait > 0:
                    time.sleep(min(wait, EXIT_GRACE_S, self.grace_s))
                due, self._doomed = self._doomed, []
            else:
                due = [d for d in self._doomed if d[0] <= now]
                self._doomed = [d for d in self._doomed if d[0] > now]
        if self._undeleted and (final or now >= self._retry_at):
            due.append((now, self._undeleted))
            self._undeleted = []
        failed = None
        for _, paths in due:
            for path in paths:
                exc = delete(path)
                if exc is not None:
                    self._undeleted.append(path)
                    failed = failed or exc
        if failed is not None:
            self._retry_at = now + MAX_AGE_S
            if not self._said_undeleted:  # once until deletes work again: the parts stay hidden meanwhile
                self._said_undeleted = True
                logger.warning("rltrace: could not delete %d replaced parts in %s (%s); they stay hidden and are "
                               "deleted later", len(self._undeleted), self.run_dir, _one_line(failed))
        elif not self._undeleted:
            self._said_undeleted = False

    def close(self) -> None:
        """At exit: merge every part left (a run is compact once its writers exit), then release the lock."""
        try:
            self.tick(final=True)
        except Exception:  # never into the exit path
            logger.exception("rltrace: merging this process's parts at exit failed")
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._lock_file.name)
                self._lock_file.close()
            self._lock_file = None


def _one_line(exc: BaseException) -> str:
    """An error as one line: its type and first line (a warning, never a traceback)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def by_rows(parts: list, limit: int | None = None) -> list[list]:
    """Parts (anything with `.rows`) in groups of at most `limit` rows (`TARGET_ROWS`), in the
    order given; a part larger than that is a group of its own."""
    limit = TARGET_ROWS if limit is None else limit
    groups, current, total = [], [], 0
    for p in parts:
        if current and total + p.rows > limit:
            groups.append(current)
            current, total = [], 0
        current.append(p)
        total += p.rows
    if current:
        groups.append(current)
    return groups


def writer_alive(run_dir: Path, process_id: str) -> bool:
    """Whether a live writer holds `process_id`'s lock (then its parts are its own to merge)."""
    return lock_state(run_dir, process_id) == "held"


def lock_state(run_dir: Path, process_id: str) -> str:
    """`held` (a live writer holds `process_id`'s lock), `free` (this probe took it: no process
    holds it; the OS frees a writer's lock when it ends, kill -9 included) or `unknown` (no lock
    file, or a filesystem whose locks cannot be probed)."""
    try:
        fd = os.open(Path(run_dir) / WRITERS / f"{process_id}.lock", os.O_RDONLY)
    except OSError:  # no lock file: an older writer, a finished one, or not a writer's part at all
        return "unknown"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "held"
    except OSError:  # e.g. ENOSYS or ENOLCK: this filesystem cannot tell
        return "unknown"
    finally:
        os.close(fd)  # also releases the probe's lock
    return "free"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also releases the probe's lock
    return False
