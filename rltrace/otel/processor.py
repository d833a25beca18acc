"""The batch processor of a span pipeline: the SDK's `BatchSpanProcessor` does the queueing,
threading and timing; `CountingBatchProcessor` adds what rltrace needs on top.

It never lets the SDK drop silently. The SDK's processor, when full, drops the *oldest* span and
only logs. This wrapper keeps its own count of spans handed to the SDK and spans that reached the
exporter; when the difference reaches the queue size it drops the new span itself and counts it
(`dropped`), so the SDK never has to. Open spans do not go through it: the exporter reads them
from `rltrace.otel.live.LiveSpans` when it writes.
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
        self.dropped = 0  # finished spans lost to a full queue
        self._exporter.received = 0

    def submit(self, span: ReadableSpan) -> None:
        with self._lock:
            if self._submitted - self._exporter.received >= self._max_queue:
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
        done = self._batch.force_flush(timeout_millis)  # exports what is queued (only when something is)
        return self._exporter.force_flush(timeout_millis) and done
