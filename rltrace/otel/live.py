"""`LiveSpans`: the spans of this process that have started and not ended, and the one span
processor of the store pipeline.

It keeps a dict of live spans (an insert at start, a pop at end: the only work rltrace adds to
the calling thread) and hands each finished span to the batch processor. The exporter writes the
live ones to `open_spans/` from the writer threads, so a phase that never ends (a hung rank, a
killed process) is in the store without a second queue entry per span.

When the process exits (or its run shuts down) with phases still open, say a daemon thread
inside `with rltrace.phase(...)`, those spans are ended with status ERROR and a message that
says so, instead of being left as open records that read as a hang.
"""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Status, StatusCode

from rltrace import _names
from rltrace.store.writer import after_fork_in_child

EXITED = _names.UNFINISHED_AT_EXIT


class LiveSpans(SpanProcessor):
    """Tracks open spans (a dict insert and pop per span) and forwards finished ones, flushes and
    the shutdown to `inner` (the store's batch processor)."""

    def __init__(self, inner: SpanProcessor | None = None):
        self._inner = inner
        self._live: dict[int, Span] = {}  # span_id -> live span
        after_fork_in_child(self._after_fork)

    def _after_fork(self) -> None:
        self._live = {}  # the parent's open spans are the parent's

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._live[span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        self._live.pop(span.context.span_id, None)  # the SDK hands a ReadableSpan copy: match by id
        if self._inner is not None:
            self._inner.on_end(span)

    def __len__(self) -> int:
        return len(self._live)

    def snapshot(self) -> list[Span]:
        """The spans open now (a copy: the calling thread may start and end spans meanwhile)."""
        for _ in range(10):
            try:
                return [s for s in self._live.copy().values() if s.end_time is None]
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return []

    def end_all(self, message: str = EXITED) -> int:
        """End every open span with status ERROR and `message`, innermost first; return how many."""
        spans = list(self._live.values())
        for span in reversed(spans):
            if span.end_time is None:
                span.add_event("rltrace.unfinished", {"reason": message})
                span.set_status(Status(StatusCode.ERROR, message))
                span.end()
        self._live.clear()
        return len(spans)

    def shutdown(self) -> None:
        if self._inner is not None:
            self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True if self._inner is None else self._inner.force_flush(timeout_millis)
