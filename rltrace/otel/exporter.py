"""`ParquetSpanExporter`: turns a batch of finished spans into one Parquet part of the run's
`spans` table, and keeps `open_spans/<process>.parquet` in step with the process's live spans.

The live spans come from `rltrace.otel.live.LiveSpans` (nothing is queued at a span's start).
Whenever the set of open spans differs from the set on disk (checked after every export, on
every `flush` and on the writer thread's tick), the open-spans file is rewritten. So after
`kill -9` the store shows what was running, and a clean exit leaves only spans that never ended.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rltrace import _names
from rltrace.otel.live import LiveSpans
from rltrace.store import rows
from rltrace.store.parts import write_part
from rltrace.store.writer import PartNamer, ProcessInfo, after_fork_in_child
from rltrace.store.write_errors import errors as write_errors

logger = logging.getLogger("rltrace")


class ParquetSpanExporter(SpanExporter):
    def __init__(self, run_dir: Path, process: ProcessInfo, service_name: str, drops: rows.Drops | None = None,
                 live: LiveSpans | None = None, on_part: Callable[[Path, int], None] | None = None,
                 before_part: Callable[[], None] | None = None):
        self.drops = drops if drops is not None else rows.Drops()
        self._spans_dir = Path(run_dir) / _names.SPANS.folder
        self._open_dir = Path(run_dir) / _names.OPEN_SPANS.folder
        self._process = process
        self._service_name = service_name
        self._namer = PartNamer(process)
        self.live = live  # the process's open spans (set once the pipeline that feeds it exists)
        self._on_part = on_part  # told of every part written (the process's own merger)
        self._before_part = before_part  # called before each part is written (the merger takes its lock)
        self._reset()
        after_fork_in_child(self._after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._open_on_disk: frozenset[int] = frozenset()
        self.spans_written = 0
        self.write_failures = 0  # spans lost because a part could not be written

    def _after_fork(self) -> None:
        self._namer.reset()
        self._reset()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            ok = self._write_finished(list(spans)) if spans else True
            ok = self._sync_open() and ok
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def sync_open(self) -> bool:
        """Rewrite the open-spans file if the live spans differ from it (the writer thread's tick)."""
        with self._lock:
            return self._sync_open()

    def _write_finished(self, finished: list[ReadableSpan]) -> bool:
        """One part of finished spans; a span that cannot be stored is dropped alone, with its reason."""
        table = rows.spans_table(finished, self._process, self._service_name, drops=self.drops)
        kept = 0 if table is None else table.num_rows
        self.write_failures += len(finished) - kept  # counted with their reasons by rows.spans_table
        if table is None:
            return False
        try:
            if self._before_part is not None:
                self._before_part()
            path = write_part(self._spans_dir, self._namer.next(), table, _names.SPANS)
        except Exception as exc:
            reason = f"part could not be written ({type(exc).__name__}: {rows.text(str(exc))[:160]})"
            self.write_failures += kept
            self.drops.add("spans", kept, reason)
            write_errors("writing a spans part", exc, "its spans are dropped and counted")
            return False
        self.spans_written += kept
        if self._on_part is not None:
            self._on_part(path, kept)
        return kept == len(finished)

    def _sync_open(self) -> bool:
        if self.live is None:
            return True
        spans = self.live.snapshot()
        ids = frozenset(s.context.span_id for s in spans)
        if ids == self._open_on_disk:
            return True
        try:
            table = rows.spans_table(spans, self._process, self._service_name, still_open=True, drops=rows.Drops())
            if table is None:
                table = _names.SPANS_SCHEMA.empty_table()
            write_part(self._open_dir, f"{self._process.process_id}.parquet", table, _names.OPEN_SPANS)
        except Exception as exc:
            write_errors("recording open spans", exc)
            return False
        self._open_on_disk = ids
        return True

    def shutdown(self) -> None:
        self.sync_open()

    def forget_open(self) -> None:
        """At a clean exit with no span left open: remove the (empty) open-spans file."""
        with self._lock:
            if not self._open_on_disk:
                (self._open_dir / f"{self._process.process_id}.parquet").unlink(missing_ok=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.sync_open()
