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
import re
import socket
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names

logger = logging.getLogger("rltrace")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)[:48] or "_"


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
        if not self.process_id:
            self.renew()

    def renew(self) -> None:
        """New pid and process id, e.g. in the child after `fork`."""
        self.pid = os.getpid()
        rank = "" if self.rank is None else str(self.rank)
        self.process_id = f"{_safe(self.role)}{rank}-{_safe(self.host)}-{self.pid}-{uuid.uuid4().hex[:6]}"

    def columns(self, n: int) -> dict[str, pa.Array]:
        """The process columns for `n` rows (dictionary-encoded in Parquet, so nearly free)."""
        return {
            "process_id": pa.array([self.process_id] * n, pa.string()),
            "role": pa.array([self.role] * n, pa.string()),
            "rank": pa.array([self.rank] * n, pa.int64()),
            "host": pa.array([self.host] * n, pa.string()),
            "pid": pa.array([self.pid] * n, pa.int64()),
        }


def write_part(
    folder: Path,
    name: str,
    table: pa.Table,
    spec: _names.Table,
    extra_metadata: dict | None = None,
    write_options: dict | None = None,
) -> Path:
    """Write `table` as `folder/name` atomically, tagged with the table's name and schema version.

    `write_options` go to `pyarrow.parquet.write_table` (e.g. per-column compression); zstd by default.
    """
    folder.mkdir(parents=True, exist_ok=True)
    metadata = dict(table.schema.metadata or {})
    metadata[_names.META_TABLE] = spec.name.encode()
    metadata[_names.META_VERSION] = str(spec.version).encode()
    metadata.update(extra_metadata or {})
    table = table.replace_schema_metadata(metadata)
    final = folder / name
    tmp = folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        pq.write_table(table, tmp, **{"compression": "zstd", **(write_options or {})})
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


class PartNamer:
    """Names `<process_id>-<seq>.parquet`, unique per process, ordered by write time."""

    def __init__(self, process: ProcessInfo):
        self._process = process
        self._seq = itertools.count()

    def next(self) -> str:
        return f"{self._process.process_id}-{next(self._seq):08d}.parquet"

    def reset(self) -> None:
        self._seq = itertools.count()


# An item waiting to be written: the table it goes to, its row count, and a thunk building the
# Arrow table (conversion runs on the writer thread, not the caller's).
_Item = tuple[_names.Table, int, Union[pa.Table, Callable[[], pa.Table]]]


class BackgroundWriter:
    """Buffers rows in memory and writes one part per table every `interval` seconds.

    Bounded: beyond `max_pending_rows` waiting rows, new rows are dropped and counted
    (`rows_dropped`), never silently. `on_tick` runs after each write cycle (the heartbeat).
    """

    def __init__(
        self,
        run_dir: Path,
        process: ProcessInfo,
        *,
        interval: float,
        max_pending_rows: int,
        on_tick: Callable[[], None] | None = None,
    ):
        self._run_dir = Path(run_dir)
        self._namer = PartNamer(process)
        self._interval = interval
        self._max_pending_rows = max_pending_rows
        self._on_tick = on_tick
        self.rows_written = 0
        self.rows_dropped = 0
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
        self._namer.reset()
        self.rows_written = 0
        self.rows_dropped = 0
        self._start()

    def submit(self, table: _names.Table, nrows: int, payload: pa.Table | Callable[[], pa.Table]) -> bool:
        """Queue rows for writing; returns False (and counts them) if the buffer is full."""
        with self._pending_lock:
            if self._closed or self._pending_rows + nrows > self._max_pending_rows:
                self.rows_dropped += nrows
                return False
            self._pending_rows += nrows
        self._queue.append((table, nrows, payload))
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

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            try:
                self._drain()
            except Exception:  # never let the writer thread die: count and go on
                logger.exception("rltrace: writing metrics/samples failed")

    def _drain(self) -> None:
        with self._write_lock:
            by_table: dict[str, tuple[_names.Table, list[pa.Table]]] = {}
            while self._queue:
                spec, nrows, payload = self._queue.popleft()
                with self._pending_lock:
                    self._pending_rows -= nrows
                try:
                    table = payload() if callable(payload) else payload
                except Exception as exc:  # bad rows: the caller is gone, so say what was lost
                    logger.warning("rltrace: dropped %d %s rows that could not be converted: %s", nrows, spec.name, exc)
                    self.rows_dropped += nrows
                    continue
                by_table.setdefault(spec.name, (spec, []))[1].append(table)
            for spec, tables in by_table.values():
                nrows = sum(t.num_rows for t in tables)
                try:
                    merged = pa.concat_tables(tables, promote_options="permissive")
                    write_part(self._run_dir / spec.folder, self._namer.next(), merged, spec)
                    self.rows_written += nrows
                except Exception as exc:
                    logger.warning("rltrace: dropped %d %s rows that could not be written: %s", nrows, spec.name, exc)
                    self.rows_dropped += nrows
            if self._on_tick is not None:
                try:
                    self._on_tick()
                except Exception:
                    logger.exception("rltrace: heartbeat failed")


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Run a bound method in the child after `fork`, without keeping its object alive."""
    ref = weakref.WeakMethod(method)

    def _call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=_call)
