"""`ParquetSpanExporter`: turns a batch of spans into one Parquet part of the run's `spans` table.

It also keeps the process's open spans: an open record (the live span, sent at its start by
`OpenSpanProcessor`) is remembered until the span ends. When the set
on disk differs from the set in memory, `open_spans/<process>.parquet` is rewritten. So after
`kill -9` the store shows what was running, and a clean exit leaves only spans that never ended.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Sequence

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from rltrace import _names
from rltrace.store.writer import PartNamer, ProcessInfo, after_fork_in_child, write_part

logger = logging.getLogger("rltrace")



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


def _attributes(span: ReadableSpan) -> dict:
    """A copy of the span's attributes; a live span may be changing them on another thread."""
    for _ in range(10):
        try:
            return dict(span.attributes or {})
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return {}


_STATUS = {code: code.name for code in StatusCode}
_KIND = {kind: kind.name for kind in SpanKind}


def _as_int(value) -> int | None:
    return value if type(value) is int else _int_or_none(value)


def spans_to_table(
    spans: Sequence[ReadableSpan], process: ProcessInfo, service_name: str, *, still_open: bool = False
) -> pa.Table:
    """One row per span in the `spans` schema (see docs/store.md); `still_open` rows get no end.

    This runs on the export thread for every span, so it is written for speed: one pass,
    plain lists, and no JSON encoding when a span has no attributes beyond the promoted ones.
    """
    trace_ids, span_ids, parents, names, phases, steps, versions = [], [], [], [], [], [], []
    starts, ends, statuses, messages, kinds, thread_ids, thread_names = [], [], [], [], [], [], []
    attributes, events, links = [], [], []
    encode = json.JSONEncoder(separators=(",", ":"), default=str).encode
    known_threads = {t.ident: t.name for t in threading.enumerate()}  # names are looked up here, off the hot path
    for span in spans:
        ctx = span.context
        attrs = _attributes(span)
        trace_ids.append(f"{ctx.trace_id:032x}")
        span_ids.append(f"{ctx.span_id:016x}")
        parent = span.parent
        parents.append(None if parent is None else f"{parent.span_id:016x}")
        names.append(span.name)
        phases.append(attrs.pop(_names.PHASE, None))
        steps.append(_as_int(attrs.pop(_names.STEP, None)))
        versions.append(_as_int(attrs.pop(_names.WEIGHT_VERSION, None)))
        starts.append(span.start_time)
        ends.append(None if still_open else span.end_time)
        status = span.status
        statuses.append(_STATUS[status.status_code])
        messages.append(status.description)
        kinds.append(_KIND[span.kind])
        thread_id = _as_int(attrs.pop(_names.THREAD_ID, None))
        thread_ids.append(thread_id)
        thread_names.append(attrs.pop(_names.THREAD_NAME, None) or known_threads.get(thread_id))
        attributes.append(encode(attrs) if attrs else "{}")
        events.append(_event_json(span))
        links.append(_links_json(span))
    n = len(spans)
    return pa.table(
        {
            "trace_id": trace_ids,
            "span_id": span_ids,
            "parent_span_id": parents,
            "name": names,
            "phase": phases,
            "step": steps,
            "weight_version": versions,
            "start_ns": starts,
            "end_ns": ends,
            "status": statuses,
            "status_message": messages,
            "kind": kinds,
            "thread_id": thread_ids,
            "thread_name": thread_names,
            **process.columns(n),
            "service_name": [service_name] * n,
            "attributes": attributes,
            "events": events,
            "links": links,
        },
        schema=_names.SPANS_SCHEMA,
    )


class ParquetSpanExporter(SpanExporter):
    def __init__(self, run_dir: Path, process: ProcessInfo, service_name: str):
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
            table = spans_to_table(list(self._open.values()), self._process, self._service_name, still_open=True)
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
