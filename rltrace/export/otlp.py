"""Replay a stored run's spans to an OpenTelemetry backend over OTLP/HTTP.

Spans are rebuilt as SDK `ReadableSpan`s with their original trace and span ids, parents, times,
status, events, links and attributes (the promoted columns `rl.phase`, `rl.step`,
`rl.weight_version`, `thread.id`, `thread.name` go back into the attributes, with the OTel `rl.*`
proposal's `rl.operation.name` and `rl.run.id` where a run predates them), under the OTel
resource each process recorded, and handed to the SDK's `OTLPSpanExporter`. Open spans have no
end time, which OTLP cannot carry: they are counted and left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from rltrace import _names
from rltrace._config import RltraceConfigError, RltraceError, otlp_traces_url
from rltrace.analysis._steps import Steps, step_filter

BATCH = 512


class OtlpExportError(RltraceError):
    """The OTLP backend did not accept the spans."""


@dataclass
class ReplayResult:
    sent: int
    open_skipped: int
    url: str


def _resources(con) -> dict[str, object]:
    from opentelemetry.sdk.resources import Resource

    out = {}
    for process_id, resource, role, rank, host, pid, service in con.execute(
        "SELECT process_id, any_value(resource), any_value(role), any_value(rank), any_value(host), any_value(pid), "
        "any_value(service_name) FROM processes GROUP BY process_id"
    ).fetchall():
        try:
            attrs = json.loads(resource) if resource else {}
        except ValueError:
            attrs = {}
        attrs = attrs or _fallback_attrs(role, rank, host, pid, service)
        if _names.RUN_ID in attrs:  # runs recorded before rltrace wrote the proposal's name too
            attrs.setdefault(_names.SEMCONV_RUN_ID, attrs[_names.RUN_ID])
        out[process_id] = Resource.create(attrs)
    return out


def _fallback_attrs(role, rank, host, pid, service) -> dict:
    attrs = {"service.name": service or f"rltrace-{role}", "host.name": host, "process.pid": pid, _names.ROLE: role}
    if not pd.isna(rank):
        attrs[_names.RANK] = int(rank)
    return {k: v for k, v in attrs.items() if not pd.isna(v)}


def _context(trace_id: str, span_id: str, remote: bool):
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=remote, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _json_list(text) -> list:
    return [] if pd.isna(text) else json.loads(text)


def to_readable(row, resource):
    """One stored span row (a namedtuple of `spans` columns) as an SDK ReadableSpan."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    attrs = {} if pd.isna(row.attributes) else json.loads(row.attributes)
    for key, value in ((_names.PHASE, row.phase), (_names.STEP, row.step), (_names.WEIGHT_VERSION, row.weight_version),
                       (_names.THREAD_ID, row.thread_id), (_names.THREAD_NAME, row.thread_name)):
        if not pd.isna(value):
            attrs[key] = int(value) if key in (_names.STEP, _names.WEIGHT_VERSION, _names.THREAD_ID) else value
    group = _names.SEMCONV_GROUP_OF_PHASE.get(attrs.get(_names.PHASE))
    if group is not None:  # the OTel rl.* proposal's group, for runs recorded before spans carried it
        attrs.setdefault(_names.SEMCONV_OPERATION, group)
    events = [Event(e["name"], e.get("attributes") or {}, int(e["time_ns"])) for e in _json_list(row.events)]
    links = [Link(_context(link["trace_id"], link["span_id"], True)) for link in _json_list(row.links)]
    parent = None if pd.isna(row.parent_span_id) else _context(row.trace_id, row.parent_span_id, False)
    status = Status(StatusCode[row.status or "UNSET"], row.status_message if row.status == "ERROR" else None)
    return ReadableSpan(
        name=row.name,
        context=_context(row.trace_id, row.span_id, False),
        parent=parent,
        resource=resource,
        attributes=attrs,
        events=events,
        links=links,
        kind=SpanKind[row.kind] if row.kind in SpanKind.__members__ else SpanKind.INTERNAL,
        status=status,
        start_time=int(row.start_ns),
        end_time=int(row.end_ns),
        instrumentation_scope=InstrumentationScope("rltrace", "replay"),
    )


def replay(con, endpoint: str, *, steps: Steps = None, progress: Callable[[int, int], None] | None = None,
           timeout_s: float = 10.0) -> ReplayResult:
    """Send every finished span (of the selected steps) to the OTLP/HTTP backend at `endpoint`."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult
    except ImportError:
        raise RltraceConfigError("OTLP replay needs the OTLP exporter: pip install 'rltrace[otlp]'") from None
    url = otlp_traces_url(endpoint)
    where, params = step_filter(steps)
    open_count = con.execute(f"SELECT count(*) FROM spans WHERE is_open AND {where}", params).fetchall()[0][0]
    total = con.execute(f"SELECT count(*) FROM spans WHERE NOT is_open AND {where}", params).fetchall()[0][0]
    resources = _resources(con)
    exporter = OTLPSpanExporter(endpoint=url, timeout=timeout_s)
    sent = 0
    try:
        cursor = con.cursor()  # streamed in chunks: on a connection of its own, so an error leaves the caller's free
        cursor.execute(f"SELECT * FROM spans WHERE NOT is_open AND {where} ORDER BY start_ns", params)
        while True:
            frame = cursor.fetch_df_chunk()
            if frame.empty:
                break
            for i in range(0, len(frame), BATCH):
                chunk = frame.iloc[i : i + BATCH]
                spans = [to_readable(r, _resource_for(resources, r)) for r in chunk.itertuples(index=False)]
                if exporter.export(spans) is not SpanExportResult.SUCCESS:
                    raise OtlpExportError(
                        f"the OTLP backend at {url} did not accept spans ({sent} of {total} sent): "
                        "check that it is running and speaks OTLP over HTTP"
                    )
                sent += len(spans)
                if progress is not None:
                    progress(sent, total)
    finally:
        exporter.shutdown()
    return ReplayResult(sent=sent, open_skipped=int(open_count), url=url)


def _resource_for(resources: dict, row):
    resource = resources.get(row.process_id)
    if resource is None:
        from opentelemetry.sdk.resources import Resource

        resource = resources[row.process_id] = Resource.create(
            _fallback_attrs(row.role, row.rank, row.host, row.pid, row.service_name)
        )
    return resource
