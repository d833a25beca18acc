"""Turning freezes into batch parts off the training loop, so it never waits for the disk.

One `BatchWriter` per run and process. A freeze is a reference to the caller's samples put on a
bounded queue (`RLTRACE_REPLAY_QUEUE`, default 2): conversion to Arrow and the write happen on
the store's writer thread (`rltrace.store.writer.BackgroundWriter`, the one that writes metric
and sample rows), so a process has one writing thread. When the queue is full, or the run's
batches would exceed the disk budget (`RLTRACE_REPLAY_BUDGET_MB`), the freeze is skipped and
counted, never waited for; a freeze that cannot be taken is counted as failed; a sample that
cannot be converted is dropped alone and counted with its reason (`rltrace info`), and a column
named like one rltrace sets is dropped and counted (its reason kept in the batch's
`batch_meta`). Nothing raises into the loop. The counts are logged as metrics `replay_frozen`,
`replay_skipped`, `replay_failed`, `replay_columns_dropped` and `replay_bytes`.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rltrace import _names
from rltrace._config import resolve
from rltrace.api import log_metrics
from rltrace.replay.batch import batch_fields, build_table, take_reserved, write_batch
from rltrace.store import rows
from rltrace.store.writer import after_fork_in_child

logger = logging.getLogger("rltrace")


@dataclass
class Job:
    """One freeze waiting to be written: references to the caller's data, not copies."""

    step: int
    batch_id: str
    form: str
    data: Any
    n: int
    batch_meta: dict
    trigger: str
    reason: str | None
    frozen_ns: int


def folder_bytes(folder: Path) -> int:
    """Bytes of the visible parts in `folder` (all processes' batches count against the budget)."""
    total = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith(".parquet") and not entry.name.startswith("."):
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:
                        pass
    except FileNotFoundError:
        pass
    return total


def _milestone(count: int) -> bool:
    """Warn on the 1st, 10th, 100th, ... skip: visible, without flooding the log."""
    return count in (1, 10, 100) or (count >= 1000 and count % 1000 == 0)


class BatchWriter:
    """Freezes waiting to be written (at most `queue_size`), written on the store's writer thread.

    A process has one writing thread for its rows and its frozen batches (`Run.submit_task`);
    skips (full queue, disk budget) and failures are counted, never waited for.
    """

    def __init__(self, run, *, budget_mb: float | None = None, queue_size: int | None = None):
        self._run = weakref.ref(run)
        self.run_dir = Path(run.run_dir)
        self.process = run.process
        self.folder = self.run_dir / _names.BATCHES.folder
        self.budget_bytes = int(resolve("replay_budget_mb", budget_mb) * 1024 * 1024)
        self.queue_size = resolve("replay_queue", queue_size)
        self._ratio = 1.0  # bytes on disk per byte of Arrow data, from the last write
        self._start()
        after_fork_in_child(self._start)

    def _start(self) -> None:
        self.frozen = self.skipped_queue = self.skipped_budget = self.failed = self.columns_dropped = 0
        self.dropped_samples = 0
        self.bytes_written = 0
        self.last_error: str | None = None
        self.last_path: Path | None = None
        self._lock = threading.Lock()
        self._waiting = 0  # freezes queued and not yet started

    @property
    def skipped(self) -> int:
        return self.skipped_queue + self.skipped_budget

    def submit(self, job: Job) -> bool:
        """Queue a freeze; False (and counted) if the queue is full. Never blocks."""
        run = self._run()
        with self._lock:
            full = self._waiting >= self.queue_size
            if not full:
                self._waiting += 1
        if not full and run is not None and run.submit_task(lambda: self._run_job(job)):
            return True
        if not full:  # the run has shut down
            with self._lock:
                self._waiting -= 1
            return False
        self.skipped_queue += 1
        if _milestone(self.skipped_queue):
            logger.warning(
                "rltrace: replay writer busy, skipped freezing step %d (queue of %d full; %d skipped so far)",
                job.step, self.queue_size, self.skipped_queue,
            )
        self._log(job.step)
        return False

    def reject(self, step: int | None, reason: str) -> None:
        """Count a freeze that could not even be taken (bad samples); say why. Never raises."""
        self.failed += 1
        self.last_error = f"step {step}: {reason}"
        if _milestone(self.failed):
            logger.warning("rltrace: could not freeze step %s: %s (the training loop goes on; %d failed so far)",
                           step, reason, self.failed)
        if isinstance(step, int):
            self._log(step)

    def flush(self) -> None:
        """Write every queued freeze now (for tests, checkpoints and exit; not the hot path)."""
        run = self._run()
        if run is not None:
            run.flush_rows()

    close = flush

    def _run_job(self, job: Job) -> None:
        with self._lock:
            self._waiting -= 1  # started: its place in the queue is free again
        try:
            self._write(job)
        except Exception as exc:  # a bad batch must not stop the writer: count, say why, go on
            self.failed += 1
            self.last_error = f"step {job.step}: {exc}"
            logger.warning("rltrace: could not freeze step %d: %s", job.step, exc)
            self._log(job.step)

    def _write(self, job: Job) -> None:
        used = folder_bytes(self.folder)
        if used >= self.budget_bytes:
            self._over_budget(job, used)
            return
        dropped = take_reserved(job.form, job.data, job.batch_meta)
        if dropped:
            self.columns_dropped += len(dropped)
            job.batch_meta["dropped_columns"] = dropped
            for name, why in dropped.items():
                logger.warning("rltrace: step %d was frozen without its column %r: %s", job.step, name, why)
        table = self._build(job, batch_fields(job.batch_meta))
        job.data = None  # let the caller's arrays go as soon as they are converted
        if table is None:  # no sample could be stored; each is counted with its reason
            return
        if used + table.nbytes * self._ratio > self.budget_bytes:
            self._over_budget(job, used)
            return
        path = write_batch(self.run_dir, table, job.step, job.batch_id)
        size = path.stat().st_size
        self._ratio = max(size / max(table.nbytes, 1), 0.05)
        self.frozen += 1
        self.bytes_written += size
        self.last_path = path
        self._log(job.step)

    def _build(self, job: Job, fields: dict):
        """The batch's table; if one sample cannot be stored, the others still are (that one is
        counted with its reason, e.g. text with invalid UTF-8 is stored escaped, not dropped)."""

        def build(form: str, data: Any, n: int):
            return build_table(
                job.step, job.batch_id, form, data, n, fields=fields, trigger=job.trigger,
                reason=job.reason, frozen_ns=job.frozen_ns, process=self.process,
            )

        try:
            return build(job.form, job.data, job.n)
        except Exception:  # noqa: BLE001 - converted again below, each lost sample counted
            pass
        samples = _split(job.form, job.data, job.n)
        good, lost = [], []
        for i, sample in enumerate(samples):
            try:
                build("rows", [sample], 1)
                good.append(sample)
            except Exception as exc:  # noqa: BLE001
                lost.append((i, exc))
        try:
            table = build("rows", good, len(good)) if good else None
        except Exception:  # noqa: BLE001 - samples that convert alone but not together (mixed kinds)
            table, kept = None, []
            for i, sample in enumerate(good):
                try:
                    table = build("rows", kept + [sample], len(kept) + 1)
                    kept.append(sample)
                except Exception as exc:  # noqa: BLE001
                    lost.append((i, exc))
        self._count_lost(job, lost)
        return table

    def _count_lost(self, job: Job, lost: list) -> None:
        run = self._run()
        for i, exc in lost:
            found = _COLUMN.search(str(exc))
            why = rows.text(str(exc) or type(exc).__name__).splitlines()[0][:160]
            self.dropped_samples += 1
            if run is not None and hasattr(run, "drops"):
                run.drops.add("batches", 1, why, found.group(1) if found else None)
            logger.warning("rltrace: could not freeze a sample of step %d: %s", job.step, why)

    def _over_budget(self, job: Job, used: int) -> None:
        self.skipped_budget += 1
        if _milestone(self.skipped_budget):
            logger.warning(
                "rltrace: skipped freezing step %d: frozen batches use %.0f of %.0f MB (raise RLTRACE_REPLAY_BUDGET_MB; "
                "%d skipped so far)", job.step, used / 2**20, self.budget_bytes / 2**20, self.skipped_budget,
            )
        self._log(job.step)

    def _log(self, step: int) -> None:
        from rltrace.api import current_run

        if current_run() is self._run():
            log_metrics(
                step,
                replay_frozen=self.frozen,
                replay_skipped=self.skipped,
                replay_failed=self.failed,
                replay_columns_dropped=self.columns_dropped,
                replay_bytes=self.bytes_written,
            )


_COLUMN = re.compile(r"column '([^']+)'")


def _split(form: str, data: Any, n: int) -> list[dict]:
    """The samples of a batch one by one, each with its text made valid UTF-8."""
    if form == "rows":
        return [{k: rows.clean(v) if isinstance(v, (str, list, tuple, dict)) else v for k, v in s.items()} for s in data]
    out = []
    for i in range(n):
        out.append({k: rows.clean(v[i]) if isinstance(v, (list, tuple)) else v[i] for k, v in data.items()})
    return out


_writers: weakref.WeakKeyDictionary[Any, BatchWriter] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def writer_for(run) -> BatchWriter:
    """The writer of `run` in this process (made on first use)."""
    writer = _writers.get(run)
    if writer is None:
        with _lock:
            writer = _writers.get(run)
            if writer is None:
                writer = _writers[run] = BatchWriter(run)
    return writer


def flush_all() -> None:
    """Write every queued freeze of every run of this process."""
    for writer in list(_writers.values()):
        writer.flush()


@atexit.register
def _close_all() -> None:
    # registered after rltrace's own shutdown hook, so it runs first: batches land before the run ends
    for writer in list(_writers.values()):
        writer.close()
