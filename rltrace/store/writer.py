"""Writing parts: one Parquet file made visible whole by `os.replace`, and the background thread
that turns `log_metrics`/`log_samples` calls into parts without the caller touching the disk.

A reader never sees half a file: parts are written to a hidden temp name in the same folder and
renamed. Part names start with the writing process's id, so processes never collide.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Union

import pyarrow as pa

from rltrace import _names
from rltrace._names import safe_name
from rltrace.store import rows
from rltrace.store.merge import Merger
from rltrace.store.parts import write_part
from rltrace.store.write_errors import errors

logger = logging.getLogger("rltrace")




@dataclass
class ProcessInfo:
    """Who is writing: copied into every row so a query never needs a join to know the process."""

    run_id: str
    role: str
    rank: int | None
    service_name: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    process_id: str = ""

    def __post_init__(self):
        self.role, self.host, self.service_name = rows.text(self.role), rows.text(self.host), rows.text(self.service_name)
        if not self.process_id:
            self.renew()

    def renew(self) -> None:
        """New pid and process id, e.g. in the child after `fork`."""
        self.pid = os.getpid()
        rank = "" if self.rank is None else str(self.rank)
        self.process_id = f"{safe_name(self.role)}{rank}-{safe_name(self.host)}-{self.pid}-{uuid.uuid4().hex[:6]}"

    def columns(self, n: int) -> dict[str, pa.Array]:
        """The process columns for `n` rows (dictionary-encoded in Parquet, so nearly free)."""
        return rows.process_columns(self, n)


class PartNamer:
    """Names `<process_id>-<seq>.parquet`, unique per process, ordered by write time.

    Every namer of one process draws from one counter: the span exporter and the row writer
    both write span parts, and two counters would name two parts alike (the second replacing
    the first).
    """

    _counters: dict[str, Iterator[int]] = {}

    def __init__(self, process: ProcessInfo):
        self._process = process

    def next(self) -> str:
        seq = self._counters.setdefault(self._process.process_id, itertools.count())
        return f"{self._process.process_id}-{next(seq):08d}.parquet"

    def reset(self) -> None:
        """After a fork: the child's process id is new, and so is its counter."""
        self._counters.pop(self._process.process_id, None)


# An item waiting to be written: the table it goes to, its row count, and a thunk building the
# Arrow table (conversion runs on the writer thread, not the caller's).
_Item = tuple[Union[_names.Table, None], int, Union[pa.Table, Callable[[], pa.Table]]]  # None: a task


class BackgroundWriter:
    """Buffers rows in memory and writes one part per table every `interval` seconds.

    Bounded: beyond `max_pending_rows` waiting rows, new rows are dropped and counted
    (`rows_dropped`), never silently. `on_tick` runs after each write cycle (the heartbeat); then
    the process's `merger` (`rltrace.store.merge.Merger`, one is made when none is given) merges
    the parts that are due, on this thread, and everything left when the writer closes.
    """

    def __init__(
        self,
        run_dir: Path,
        process: ProcessInfo,
        *,
        interval: float,
        max_pending_rows: int,
        on_tick: Callable[[], None] | None = None,
        drops: rows.Drops | None = None,
        merger=None,
        span_footer: dict[bytes, bytes] | None = None,
    ):
        from rltrace._config import resolve

        self._run_dir = Path(run_dir)
        self.merger = merger if merger is not None else Merger(
            run_dir, process, enabled=resolve("merge_parts"), grace_s=resolve("merge_grace"))
        self._namer = PartNamer(process)
        self._interval = interval
        self._max_pending_rows = max_pending_rows
        self._on_tick = on_tick
        self._span_footer = span_footer  # footer keys of its span parts (a receiver's: `_names.META_RECEIVED`)
        self.rows_written = 0
        self.rows_dropped = 0
        self.drops = drops if drops is not None else rows.Drops()
        self._start()
        after_fork_in_child(self._after_fork)

    def _start(self) -> None:
        self._queue: collections.deque[_Item] = collections.deque()
        self._pending_rows = 0
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="rltrace-writer", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        # The parent's rows are the parent's to write; the child starts empty with its own thread.
        self.merger.after_fork()
        self._namer.reset()
        self.rows_written = 0
        self.rows_dropped = 0
        self._start()

    def _drop(self, spec: _names.Table, nrows: int, reason: str) -> None:
        self.rows_dropped += nrows
        self.drops.add(spec.name, nrows, reason)

    def submit(self, table: _names.Table, nrows: int, payload: pa.Table | Callable[[], pa.Table | None]) -> bool:
        """Queue rows for writing; returns False (and counts them) if the buffer is full.

        A thunk may return fewer rows than `nrows` (or None): it counted the ones it dropped
        in `self.drops` with their reasons; here they are added to `rows_dropped`.
        """
        with self._pending_lock:
            if self._closed:
                self._drop(table, nrows, "recorded after the run was shut down")
                return False
            if self._pending_rows + nrows > self._max_pending_rows:
                self._drop(table, nrows, "write buffer full (raise RLTRACE_MAX_PENDING_ROWS or record less)")
                return False
            self._pending_rows += nrows
        self._queue.append((table, nrows, payload))
        return True

    def submit_task(self, task: Callable[[], None]) -> bool:
        """Run `task` on this writer's thread soon (other writers of the run, e.g. frozen batches,
        use it so a process has one writing thread); False if the writer is closed."""
        with self._pending_lock:
            if self._closed:
                return False
        self._queue.append((None, 0, task))
        self._wake.set()
        return True

    def flush(self) -> None:
        """Write everything queued so far, on the calling thread."""
        self._drain()

    def close(self) -> None:
        with self._pending_lock:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        self._drain()
        self.merger.close()

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self._drain()
            except Exception as exc:  # never let the writer thread die: count and go on
                errors("writing metrics/samples", exc)
            try:
                self.merger.tick()
            except Exception as exc:
                errors("merging this process's parts", exc)

    def _drain(self) -> None:
        with self._write_lock:
            by_table: dict[str, tuple[_names.Table, list[pa.Table]]] = {}
            tasks = []
            for _ in range(len(self._queue)):  # what is queued now: later items wait for the next cycle,
                spec, nrows, payload = self._queue.popleft()  # so a steady flood still gets a part per interval
                if spec is None:
                    tasks.append(payload)
                    continue
                with self._pending_lock:
                    self._pending_rows -= nrows
                try:
                    table = payload() if callable(payload) else payload
                except Exception as exc:  # bad rows: the caller is gone, so say what was lost
                    reason = f"could not be converted ({type(exc).__name__}: {rows.text(str(exc))[:160]})"
                    logger.warning("rltrace: dropped %d %s rows that %s", nrows, spec.name, reason)
                    self._drop(spec, nrows, reason)
                    continue
                kept = 0 if table is None else table.num_rows
                self.rows_dropped += max(nrows - kept, 0)  # their reasons are in self.drops already
                if kept:
                    by_table.setdefault(spec.name, (spec, []))[1].append(table)
            for spec, tables in by_table.values():
                self._write(spec, tables)
            for task in tasks:
                try:
                    task()
                except Exception as exc:  # a task counts its own failures; never let it stop the writer
                    errors("a background write", exc)
            if self._on_tick is not None:
                try:
                    self._on_tick()
                except Exception as exc:
                    errors("writing the heartbeat", exc)


    def _write(self, spec: _names.Table, tables: list[pa.Table]) -> None:
        """One part for all of a table's rows; if that fails, one part per call, so a batch
        that cannot be written costs only itself."""
        if spec.name in _names.COMPACTABLE:
            self.merger.claim()
        footer = self._span_footer if spec is _names.SPANS else None
        try:
            table = rows.concat(tables)
            self.merger.wrote(spec, write_part(self._run_dir / spec.folder, self._namer.next(), table, spec, footer),
                              table.num_rows)
            self.rows_written += table.num_rows
            return
        except Exception:  # noqa: BLE001 - retried call by call below
            pass
        for table in tables:
            try:
                self.merger.wrote(spec, write_part(self._run_dir / spec.folder, self._namer.next(), table, spec, footer),
                                  table.num_rows)
                self.rows_written += table.num_rows
            except Exception as exc:
                reason = f"part could not be written ({type(exc).__name__}: {rows.text(str(exc))[:160]})"
                errors(f"writing a {spec.name} part", exc, "its rows are dropped and counted")
                self._drop(spec, table.num_rows, reason)


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Run a bound method in the child after `fork`, without keeping its object alive."""
    ref = weakref.WeakMethod(method)

    def _call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=_call)
