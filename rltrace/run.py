"""`Run`: one process's connection to a run directory.

It owns an OpenTelemetry `TracerProvider` (its own, not the global one, so it coexists with a
user's OTel setup) whose pipeline is SDK parts plus rltrace's small wrappers:

    span start/end -> LiveSpans (open spans) -> CountingBatchProcessor(BatchSpanProcessor)
                                                   -> ParquetSpanExporter -> spans/ parts
                                                      (and open_spans/, from LiveSpans)
                   -> CountingBatchProcessor(BatchSpanProcessor) -> OTLPSpanExporter  (if configured)

and a `BackgroundWriter` for metric and sample rows that also writes the process's heartbeat
row (`processes/`), with its written and dropped counts.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider

from rltrace import _names
from rltrace._config import RltraceConfigError, otlp_traces_url, resolve
from rltrace.otel.exporter import ParquetSpanExporter
from rltrace.otel.ids import ForkSafeRandomIdGenerator
from rltrace.otel.live import LiveSpans
from rltrace.otel.processor import CountingBatchProcessor
from rltrace.store import layout, objstore, rows
from rltrace.store.digest import live_of
from rltrace.store.merge import Merger, Summaries
from rltrace.store.parts import write_part
from rltrace.store.writer import BackgroundWriter, ProcessInfo, after_fork_in_child
from rltrace.store.write_errors import errors as write_errors

logger = logging.getLogger("rltrace")

_HEARTBEAT_S = 10.0  # the process row is rewritten at least this often while the process lives


def _version() -> str:
    from rltrace import __version__

    return __version__


class Run:
    """This process's handle on a run: where it writes, who it is, and its OTel pipeline.

    Made by `rltrace.init`; use `rltrace.phase`, `log_metrics` and `log_samples` to record.
    """

    disabled = False  # `rltrace.init` returns a `DisabledRun` (disabled = True) under RLTRACE_DISABLED

    def __init__(
        self,
        run_dir: Path,
        *,
        run_name: str | None,
        role: str,
        rank: int | None,
        service_name: str | None,
        config: Any,
        flush_interval: float,
        max_queue: int,
        max_pending_rows: int,
        otlp_endpoint: str | None,
    ):
        self.drops = rows.Drops()  # why rows were lost, by table and column (see rltrace.store.rows)
        write_errors.reset()  # this run's write errors, counted in its process row
        self._spool: objstore.Spool | None = None
        if objstore.is_uri(run_dir):  # an object-store run: write into a local spool, uploaded behind
            self.location: str | Path = str(run_dir)
            manifest = objstore.create_or_join(self.location, run_name=run_name, config=config)
            self._spool = objstore.Spool(self.location, manifest, drops=self.drops)
            self.run_dir = self._spool.dir
            self.manifest = manifest
        else:
            self.run_dir = self.location = Path(run_dir)
            self.manifest = layout.create_or_join(self.run_dir, run_name=run_name, config=config)
        self.run_id: str = self.manifest["run_id"]
        self.name: str = self.manifest["name"]
        self.role = role
        self.rank = rank
        self.service_name = service_name or f"rltrace-{role}"
        self.process = ProcessInfo(run_id=self.run_id, role=role, rank=rank, service_name=self.service_name)
        self.started_ns = time.time_ns()
        self._last_heartbeat = 0.0
        self._ended_ns: int | None = None
        self._closed = False
        self._companions: list = []  # background helpers (the resource sampler) flushed and closed with the run

        self.attributes_dropped = 0  # user attributes cut by the attribute count limit
        # OTel evicts the *oldest* attribute when a span is full, and rltrace's own keys are set
        # first; so the limit (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT, 128 by default) is applied to user
        # attributes by `rltrace.phase`, and the SDK's own limit leaves room for rltrace's keys.
        self.max_attributes = SpanLimits().max_span_attributes or 128
        limits = SpanLimits(max_span_attributes=self.max_attributes + len(_names.RESERVED_ATTRS))
        # rltrace.shutdown (atexit) shuts the provider down, after closing the phases still open
        self.tracer_provider = TracerProvider(
            resource=self._resource(), id_generator=ForkSafeRandomIdGenerator(), span_limits=limits,
            shutdown_on_exit=False,
        )
        # one processor on the calling thread: live spans (open records; closed with an error if the
        # process exits while they are open) and the hand-over of finished ones to the batch queue
        # this process's own parts are merged in the background and at exit (rltrace.store.merge)
        source = self._spool.source if self._spool else None
        self.merger = Merger(self.run_dir, self.process, enabled=resolve("merge_parts"), grace_s=resolve("merge_grace"),
                             source=source, replaced=self._spool.replaced if self._spool else None,
                             covered=self._spool.covered if self._spool else None,
                             lock=self._spool is None,
                             summaries=Summaries(self.process, lambda: live_of(self.live_spans.snapshot()), source))
        if self._spool is not None:
            self._spool.grace_s = self.merger.grace_s
        self._exporter = ParquetSpanExporter(self.run_dir, self.process, self.service_name, self.drops,
                                             on_part=lambda path, n: self.merger.wrote(_names.SPANS, path, n),
                                             before_part=self.merger.claim)
        self._store_pipeline = CountingBatchProcessor(
            self._exporter, max_queue=max_queue, schedule_delay_s=flush_interval
        )
        self.live_spans = self._exporter.live = LiveSpans(self._store_pipeline)
        #: called with a phase's span on its own thread just before the span ends, so work a
        #: profiler does at the end (stopping a torch.profiler window) falls inside the phase
        self.ending_hooks: list = []
        self.tracer_provider.add_span_processor(self.live_spans)
        self._otlp_pipeline: CountingBatchProcessor | None = None
        if otlp_endpoint:
            self._otlp_pipeline = CountingBatchProcessor(
                self._otlp_exporter(otlp_endpoint), max_queue=max_queue, schedule_delay_s=flush_interval
            )
            self.tracer_provider.add_span_processor(self._otlp_pipeline)
        self.tracer = self.tracer_provider.get_tracer("rltrace", _version())

        self._heartbeat_lock = threading.Lock()
        self._rows = BackgroundWriter(
            self.run_dir,
            self.process,
            interval=flush_interval,
            max_pending_rows=max_pending_rows,
            on_tick=self._heartbeat,
            drops=self.drops,
            merger=self.merger,
        )
        self.write_process_row()
        after_fork_in_child(self._after_fork)

    def _resource(self) -> Resource:
        attrs = {
            "service.name": self.service_name,
            "service.instance.id": self.process.process_id,
            "host.name": socket.gethostname(),
            "process.pid": self.process.pid,
            _names.ROLE: self.role,
            _names.RUN_ID: self.run_id,
            _names.SEMCONV_RUN_ID: self.run_id,  # the OTel rl.* proposal's name (docs/store.md)
            "rl.run_name": self.name,
        }
        if self.rank is not None:
            attrs[_names.RANK] = self.rank
        return Resource.create(attrs)

    @staticmethod
    def _otlp_exporter(endpoint: str):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise RltraceConfigError(
                f"otlp_endpoint={endpoint!r} is set but the OTLP exporter is not installed: "
                "pip install 'rltrace[otlp]' (or unset OTEL_EXPORTER_OTLP_ENDPOINT)"
            ) from None
        return OTLPSpanExporter(endpoint=otlp_traces_url(endpoint))

    def _after_fork(self) -> None:
        if self._spool is not None:
            self._spool.after_fork()
        self.process.renew()
        self.started_ns = time.time_ns()
        self._heartbeat_lock = threading.Lock()
        self._last_heartbeat = 0.0
        self.drops.reset()
        self.attributes_dropped = 0

    # --- counts and the process row ----------------------------------------------------------
    @property
    def spans_dropped(self) -> int:
        spooled = self._spool.spans_dropped if self._spool is not None else 0
        return self._store_pipeline.dropped + self._exporter.write_failures + spooled

    @property
    def rows_dropped(self) -> int:
        return self._rows.rows_dropped + (self._spool.rows_dropped if self._spool is not None else 0)

    def _drop_reasons(self) -> str | None:
        records = self.drops.records()
        if self._store_pipeline.dropped:
            records.append(
                {"table": "spans", "column": None, "count": self._store_pipeline.dropped,
                 "reason": "span queue full (raise RLTRACE_MAX_QUEUE or record less)"}
            )
        records += write_errors.records()
        return rows.dumps(records) if records else None

    def _heartbeat(self) -> None:
        """The writer thread's tick: open spans to disk when they changed, the process row now and then."""
        self._exporter.sync_open()
        if time.monotonic() - self._last_heartbeat >= _HEARTBEAT_S:
            self.write_process_row()

    def write_process_row(self) -> None:
        """Rewrite `processes/<process_id>.parquet`: identity, heartbeat, written and dropped counts."""
        with self._heartbeat_lock:
            p = self.process
            table = rows.process_table(
                p,
                run_id=self.run_id,
                service_name=self.service_name,
                started_ns=self.started_ns,
                heartbeat_ns=time.time_ns(),
                ended_ns=self._ended_ns,
                spans_written=self._exporter.spans_written,
                spans_dropped=self.spans_dropped,
                otlp_spans_dropped=self._otlp_pipeline.dropped if self._otlp_pipeline else None,
                rows_written=self._rows.rows_written,
                rows_dropped=self.rows_dropped,
                attributes_dropped=self.attributes_dropped,
                drop_reasons=self._drop_reasons(),
                rltrace_version=_version(),
                argv=sys.argv,
                resource=dict(self.tracer_provider.resource.attributes),
            )
            try:
                write_part(self.run_dir / _names.PROCESSES.folder, f"{p.process_id}.parquet", table, _names.PROCESSES)
            except OSError as exc:  # a full or read-only disk: the next heartbeat writes it
                write_errors("writing the process row", exc)
                return
            self._last_heartbeat = time.monotonic()

    # --- rows ---------------------------------------------------------------------------------
    def submit_rows(self, table: _names.Table, nrows: int, payload) -> bool:
        """Queue rows for `table` (an Arrow table, or a thunk building one on the writer thread)."""
        return self._rows.submit(table, nrows, payload)

    def submit_task(self, task) -> bool:
        """Run `task` on this process's writer thread (frozen batches are written this way)."""
        return self._rows.submit_task(task)

    def flush_rows(self) -> None:
        """Write queued rows and tasks now, on the calling thread (not for the hot path)."""
        if not self._closed:
            self._rows.flush()

    # --- lifecycle ----------------------------------------------------------------------------
    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Add an OTel span processor to this run's provider (profiling watchdogs use this)."""
        self.tracer_provider.add_span_processor(processor)

    def add_companion(self, companion) -> None:
        """A background helper with `flush()` and `close()` (the resource sampler), run before this run's own."""
        self._companions.append(companion)

    def _each_companion(self, method: str) -> None:
        for companion in self._companions:
            try:
                getattr(companion, method)()
            except Exception:
                logger.exception("rltrace: %s of %r failed", method, companion)

    def flush(self) -> None:
        """Write every span and row recorded so far to the store (blocks; not for the hot path)."""
        if self._closed:
            return
        self._each_companion("flush")
        self.tracer_provider.force_flush()
        self._rows.flush()
        self.write_process_row()
        if self._spool is not None:
            self._spool.flush()

    def shutdown(self) -> None:
        """Flush, stop the background threads, and mark this process as ended cleanly."""
        if self._closed:
            return
        self._closed = True
        try:
            self.live_spans.end_all()
        except Exception as exc:
            logger.warning("rltrace: could not close the phases left open: %s", exc)
        self._each_companion("close")
        self.tracer_provider.shutdown()
        if self._spool is None:  # nothing left open: no record of open spans (in a bucket the last one stays, empty)
            self._exporter.forget_open()
        self._rows.close()
        self._ended_ns = time.time_ns()
        try:
            self.write_process_row()
        except Exception as exc:
            logger.warning("rltrace: could not write the final process row: %s", exc)
        if self._spool is not None:
            self._spool.close()
        else:  # the last writer of a large run has what its first report computes stored (never raises)
            from rltrace.store import last_writer

            last_writer.at_exit(self.run_dir)

    def __repr__(self) -> str:
        return f"Run(run_dir={str(self.location)!r}, name={self.name!r}, role={self.role!r}, rank={self.rank!r})"
