"""`ParquetSpanExporter`: turns a batch of spans into one Parquet part of the run's `spans` table.

It also keeps the process's open spans: an open record (a span copy without end time, sent at
span start by `OpenSpanProcessor`) is remembered until its finished span arrives. When the set
on disk differs from the set in memory, `open_spans/<process>.parquet` is rewritten. So after
`kill -9` the store shows what was running, and a clean exit leaves only spans that never ended.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from pathlib import Path
from typing import Sequence

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rltrace import _names
from rltrace.store.writer import PartNamer, ProcessInfo, after_fork_in_child, write_part

logger = logging.getLogger("rltrace")

#: Attributes stored as their own columns, so not repeated in the `attributes` JSON.
_PROMOTED = frozenset((_names.PHASE, _names.STEP, _names.WEIGHT_VERSION, _names.THREAD_ID, _names.THREAD_NAME))
_LOST_MEMORY = 100_000  # remembered ids of spans dropped before export (bounded)


def _int_or_none(value) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _event_json(span: ReadableSpan) -> str | None:
    if not span.events:
        return None
    return json.dumps(
        [{"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
        separators=(",", ":"),
        default=str,
    )


def _links_json(span: ReadableSpan) -> str | None:
    if not span.links:
        return None
    return json.dumps(
        [{"trace_id": f"{l.context.trace_id:032x}", "span_id": f"{l.context.span_id:016x}"} for l in span.links],
        separators=(",", ":"),
    )


def spans_to_table(spans: Sequence[ReadableSpan], process: ProcessInfo, service_name: str) -> pa.Table:
    """One row per span in the `spans` schema (see docs/store.md)."""
    cols: dict[str, list] = {name: [] for name in _names.SPANS_SCHEMA.names}
    dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
    for span in spans:
        ctx = span.context
        attrs = span.attributes or {}
        cols["trace_id"].append(f"{ctx.trace_id:032x}")
        cols["span_id"].append(f"{ctx.span_id:016x}")
        cols["parent_span_id"].append(f"{span.parent.span_id:016x}" if span.parent is not None else None)
        cols["name"].append(span.name)
        cols["phase"].append(attrs.get(_names.PHASE))
        cols["step"].append(_int_or_none(attrs.get(_names.STEP)))
        cols["weight_version"].append(_int_or_none(attrs.get(_names.WEIGHT_VERSION)))
        cols["start_ns"].append(span.start_time)
        cols["end_ns"].append(span.end_time)
        status = span.status
        cols["status"].append(status.status_code.name)
        cols["status_message"].append(status.description)
        cols["kind"].append(span.kind.name)
        cols["thread_id"].append(_int_or_none(attrs.get(_names.THREAD_ID)))
        cols["thread_name"].append(attrs.get(_names.THREAD_NAME))
        cols["attributes"].append(dumps({k: v for k, v in attrs.items() if k not in _PROMOTED}))
        cols["events"].append(_event_json(span))
        cols["links"].append(_links_json(span))
    n = len(spans)
    cols.update(process.columns(n))
    cols["service_name"] = [service_name] * n
    return pa.table(cols, schema=_names.SPANS_SCHEMA)


class ParquetSpanExporter(SpanExporter):
    def __init__(self, run_dir: Path, process: ProcessInfo, service_name: str):
        self._spans_dir = Path(run_dir) / _names.SPANS.folder
        self._open_dir = Path(run_dir) / _names.OPEN_SPANS.folder
        self._process = process
        self._service_name = service_name
        self._namer = PartNamer(process)
        self.lost: collections.deque[int] = collections.deque()  # span ids dropped before export
        self._reset()
        after_fork_in_child(self._after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, ReadableSpan] = {}
        self._open_on_disk: set[int] = set()
        self._lost_ids: set[int] = set()
        self.spans_written = 0
        self.write_failures = 0  # spans lost because a part could not be written

    def _after_fork(self) -> None:
        self._namer.reset()
        self.lost.clear()
        self._reset()

    def forget(self, span: ReadableSpan) -> None:
        """A finished span was dropped before export: it must not stay 'open' forever."""
        self.lost.append(span.context.span_id)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            while self.lost:
                if len(self._lost_ids) >= _LOST_MEMORY:
                    self._lost_ids.clear()
                self._lost_ids.add(self.lost.popleft())
            finished = []
            for span in spans:
                span_id = span.context.span_id
                if span.end_time is None:
                    if span_id not in self._lost_ids:
                        self._open[span_id] = span
                else:
                    self._open.pop(span_id, None)
                    finished.append(span)
            for span_id in self._lost_ids.intersection(self._open):
                del self._open[span_id]
            ok = True
            if finished:
                try:
                    table = spans_to_table(finished, self._process, self._service_name)
                    write_part(self._spans_dir, self._namer.next(), table, _names.SPANS)
                    self.spans_written += len(finished)
                except Exception as exc:
                    self.write_failures += len(finished)
                    logger.warning("rltrace: lost %d spans, the part could not be written: %s", len(finished), exc)
                    ok = False
            if self._open.keys() != self._open_on_disk:
                ok = self._write_open() and ok
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _write_open(self) -> bool:
        try:
            table = spans_to_table(list(self._open.values()), self._process, self._service_name)
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
