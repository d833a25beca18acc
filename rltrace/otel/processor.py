"""Span processors: the SDK's `BatchSpanProcessor` does the queueing, threading and timing;
these two small wrappers add what rltrace needs on top.

- `CountingBatchProcessor` never lets the SDK drop silently. The SDK's processor, when full,
  drops the *oldest* span and only logs. This wrapper keeps its own count of spans handed to
  the SDK and spans that reached the exporter; when the difference reaches the queue size it
  drops the new span itself and counts it (`dropped`), so the SDK never has to.
- `OpenSpanProcessor` also sends each span down the pipeline at its *start* (an "open" record),
  so a phase that never ends (a hung rank, a killed process) is in the store. The exporter
  forgets open records whose span has ended by export time, so short spans cost no extra disk
  (logfire's "pending span", made cheaper: no copy is made at span start).
"""

from __future__ import annotations

import threading

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from rltrace.store.writer import after_fork_in_child


class _CountingExporter(SpanExporter):
    """Counts what the SDK hands over, then forwards to the real exporter."""

    def __init__(self, inner: SpanExporter):
        self.inner = inner
        self.received = 0  # only the SDK's export thread (under its lock) writes this

    def export(self, spans) -> SpanExportResult:
        self.received += len(spans)
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountingBatchProcessor(SpanProcessor):
    """A `BatchSpanProcessor` that counts, and itself makes, every drop."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int,
        schedule_delay_s: float,
        max_batch: int = 8192,
    ):
        self._exporter = _CountingExporter(exporter)
        self._max_queue = max_queue
        self._batch = BatchSpanProcessor(
            self._exporter,
            max_queue_size=max_queue,
            schedule_delay_millis=schedule_delay_s * 1000,
            max_export_batch_size=min(max_batch, max_queue),
        )
        self._reset_counts()
        after_fork_in_child(self._reset_counts)

    def _reset_counts(self) -> None:
        self._lock = threading.Lock()
        self._submitted = 0
        self.dropped = 0  # finished spans lost to a full queue; open records are only hints
        self._exporter.received = 0

    def submit(self, span: ReadableSpan) -> None:
        with self._lock:
            if self._submitted - self._exporter.received >= self._max_queue:
                if span.end_time is not None:
                    self.dropped += 1
                return
            self._submitted += 1
        self._batch.on_end(span)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.submit(span)

    def shutdown(self) -> None:
        self._batch.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


class OpenSpanProcessor(SpanProcessor):
    """Sends each span down the pipeline twice: live at its start (the open record), then finished.

    The live span is passed as is (no copy on the hot path); the exporter treats a live span
    that has ended by export time as superseded by its finished record.
    """

    def __init__(self, inner: CountingBatchProcessor):
        self._inner = inner

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._inner.submit(span)

    def on_end(self, span: ReadableSpan) -> None:
        self._inner.submit(span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)
