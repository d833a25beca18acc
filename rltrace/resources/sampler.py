"""The sampler thread: every `interval` seconds, one row for the process's CPU and memory and one
per GPU it uses; rows are handed to the run's background writer in batches (never written here).

CPU utilisation is the process's CPU time (every thread) over wall time since the last sample,
so 100 means one core busy and a multi-threaded process can exceed it. It needs nothing but the
standard library; resident memory needs psutil. A missing part is recorded once as a note row
(`note` set, values null) instead of silently leaving columns empty.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pyarrow as pa

from rltrace import _names
from rltrace.resources import nvml
from rltrace.store.writer import after_fork_in_child

logger = logging.getLogger("rltrace")

SUBMIT_EVERY_S = 5.0  # rows are handed to the writer this often (fewer, larger parts)
MAX_FAILURES = 5  # consecutive failed samples before the sampler stops (and says so)
_VALUE_COLUMNS = [f.name for f in _names.RESOURCES_SCHEMA if f.name not in ("process_id", "role", "rank", "host", "pid")]


def _psutil_process():
    try:
        import psutil
    except ImportError:
        return None, None, "psutil is not installed (pip install 'rltrace[resources]'): memory is not sampled"
    return psutil, psutil.Process(), None


class Sampler:
    """Samples one process for a `Run` (see `start`); `flush()` hands over pending rows, `close()` stops."""

    def __init__(self, run, interval: float, *, nvml_module=None, submit_every: float = SUBMIT_EVERY_S):
        if not interval > 0:
            raise ValueError(f"resources_interval must be > 0 seconds, got {interval!r}")
        self._run = run
        self.interval = float(interval)
        self.submit_every = submit_every
        self._nvml_module = nvml_module
        self.samples = 0
        self.failures = 0
        self._start()
        after_fork_in_child(self._start)

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._rows: list[dict] = []
        self._psutil, self._proc, psutil_note = _psutil_process()
        self._gpus, gpu_note = nvml.open_probe(self._nvml_module)
        self._pids: set[int] = {os.getpid()}
        self._pids_checked = -float("inf")
        self._last_wall, self._last_cpu = time.monotonic(), time.process_time()
        self._last_submit = self._last_wall
        self._total_mem = self._psutil.virtual_memory().total if self._psutil else None
        now = time.time_ns()
        for kind, note in (("cpu", psutil_note), ("gpu", gpu_note)):
            if note:
                self._rows.append({"time_ns": now, "kind": kind, "note": note})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rltrace-resources", daemon=True)
        self._thread.start()

    # --- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
                self.failures = 0
            except Exception:
                self.failures += 1
                logger.exception("rltrace: resource sample failed")
                if self.failures >= MAX_FAILURES:
                    self._note("cpu", f"resource sampling stopped after {MAX_FAILURES} failed samples in a row")
                    break
            if time.monotonic() - self._last_submit >= self.submit_every:
                self.flush()

    def _note(self, kind: str, note: str) -> None:
        with self._lock:
            self._rows.append({"time_ns": time.time_ns(), "kind": kind, "note": note})

    def _family(self, now: float) -> set[int]:
        """This process and its children (a GPU engine is often a child process); refreshed every ~10 s."""
        if self._psutil is not None and now - self._pids_checked >= 10.0:
            try:
                self._pids = {os.getpid(), *(c.pid for c in self._proc.children(recursive=True))}
            except Exception:
                self._pids = {os.getpid()}
            self._pids_checked = now
        return self._pids

    def sample(self) -> None:
        """Take one sample now (the thread calls this every `interval`)."""
        wall, cpu, now_ns = time.monotonic(), time.process_time(), time.time_ns()
        span = wall - self._last_wall
        if span <= 0:
            return
        row = {"time_ns": now_ns, "interval_s": span, "kind": "cpu",
               "util_pct": 100.0 * (cpu - self._last_cpu) / span, "mem_total_bytes": self._total_mem}
        if self._proc is not None:
            row["mem_bytes"] = self._proc.memory_info().rss
        rows = [row]
        if self._gpus is not None:
            for gpu in self._gpus.sample(self._family(wall)):
                rows.append({"time_ns": now_ns, "interval_s": span, **gpu})
        self._last_wall, self._last_cpu = wall, cpu
        with self._lock:
            self._rows.extend(rows)
            self.samples += 1

    # --- handing rows to the writer --------------------------------------------------------------
    def flush(self) -> None:
        """Hand the rows sampled so far to the run's writer (conversion happens on its thread)."""
        with self._lock:
            rows, self._rows = self._rows, []
        self._last_submit = time.monotonic()
        if rows:
            process = self._run.process
            self._run.submit_rows(_names.RESOURCES, len(rows), lambda: _table(rows, process))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.flush()


def _table(rows: list[dict], process) -> pa.Table:
    columns = {name: [r.get(name) for r in rows] for name in _VALUE_COLUMNS}
    columns.update({k: v.to_pylist() for k, v in process.columns(len(rows)).items()})
    return pa.Table.from_pydict(columns, schema=_names.RESOURCES_SCHEMA)


def start(run, interval: float, *, nvml_module=None) -> Sampler:
    """Start sampling for `run`; the run flushes and closes the sampler with itself."""
    sampler = Sampler(run, interval, nvml_module=nvml_module)
    run.add_companion(sampler)
    return sampler
