"""`ParquetSpanExporter`: turns a batch of spans into one Parquet part of the run's `spans` table.

It also keeps the process's open spans: an open record (the live span, sent at its start by
`OpenSpanProcessor`) is remembered until the span ends. When the set
on disk differs from the set in memory, `open_spans/<process>.parquet` is rewritten. So after
`kill -9` the store shows what was running, and a clean exit leaves only spans that never ended.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Sequence

from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rltrace import _names
from rltrace.store import rows
from rltrace.store.writer import PartNamer, ProcessInfo, after_fork_in_child, write_part

logger = logging.getLogger("rltrace")


class ParquetSpanExporter(SpanExporter):
    def __init__(self, run_dir: Path, process: ProcessInfo, service_name: str, drops: rows.Drops | None = None):
        self.drops = drops if drops is not None else rows.Drops()
        self._spans_dir = Path(run_dir) / _names.SPANS.folder
        self._open_dir = Path(run_dir) / _names.OPEN_SPANS.folder
        self._process = process
        self._service_name = service_name
        self._namer = PartNamer(process)
        self._reset()
        after_fork_in_child(self._after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, ReadableSpan] = {}
        self._open_on_disk: set[int] = set()
        self.spans_written = 0
        self.write_failures = 0  # spans lost because a part could not be written

    def _after_fork(self) -> None:
        self._namer.reset()
        self._reset()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            finished = []
            for span in spans:
                span_id = span.context.span_id
                if isinstance(span, Span):  # the live span, sent at its start
                    if span.end_time is None:
                        self._open[span_id] = span
                else:
                    self._open.pop(span_id, None)
                    finished.append(span)
            for span_id in [i for i, span in self._open.items() if span.end_time is not None]:
                del self._open[span_id]  # ended: its finished record came, comes later, or was dropped
            ok = True
            if finished:
                ok = self._write_finished(finished)
            if self._open.keys() != self._open_on_disk:
                ok = self._write_open() and ok
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _write_finished(self, finished: list[ReadableSpan]) -> bool:
        """One part of finished spans; a span that cannot be stored is dropped alone, with its reason."""
        table = rows.spans_table(finished, self._process, self._service_name, drops=self.drops)
        kept = 0 if table is None else table.num_rows
        self.write_failures += len(finished) - kept  # counted with their reasons by rows.spans_table
        if table is None:
            return False
        try:
            write_part(self._spans_dir, self._namer.next(), table, _names.SPANS)
        except Exception as exc:
            reason = f"part could not be written ({type(exc).__name__}: {rows.text(str(exc))[:160]})"
            self.write_failures += kept
            self.drops.add("spans", kept, reason)
            logger.warning("rltrace: lost %d spans: %s", kept, reason)
            return False
        self.spans_written += kept
        return kept == len(finished)

    def _write_open(self) -> bool:
        try:
            spans = list(self._open.values())
            table = rows.spans_table(spans, self._process, self._service_name, still_open=True, drops=rows.Drops())
            if table is None:
                table = _names.SPANS_SCHEMA.empty_table()
            write_part(self._open_dir, f"{self._process.process_id}.parquet", table, _names.OPEN_SPANS)
        except Exception as exc:
            logger.warning("rltrace: could not record open spans: %s", exc)
            return False
        self._open_on_disk = set(self._open)
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._open.keys() != self._open_on_disk:
                self._write_open()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
