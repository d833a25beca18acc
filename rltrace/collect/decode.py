"""OTLP/HTTP trace payloads in, objects the store's row builder reads out.

A request body (protobuf or OTLP JSON, optionally gzip) becomes an `ExportTraceServiceRequest`
(`opentelemetry-proto`). Each OTLP span is then wrapped in a small adapter with the attributes of
an SDK `ReadableSpan` that `rltrace.store.rows.spans_table` reads, so remote spans take exactly the
path of rltrace's own: the same `rl.*` → column mapping, the same checks, the same drop reasons.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any, Iterator

from opentelemetry.trace import SpanKind, StatusCode

from rltrace._config import RltraceError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class PayloadError(RltraceError):
    """A request body that is not an OTLP trace export; the text is the reason sent back with HTTP 400."""


class TooLarge(PayloadError):
    """A body (after decompression) larger than the receiver accepts (HTTP 413)."""


def _messages():
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return trace_service_pb2


def gunzip(body: bytes, limit: int) -> bytes:
    """`body` inflated, refusing more than `limit` bytes (a small gzip bomb cannot fill memory)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise PayloadError(f"body is not valid gzip ({exc})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise TooLarge(f"body inflates to more than {limit} bytes")
    if not inflater.eof:
        raise PayloadError("gzip body is truncated")
    return out


# OTLP JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as base64.
_ID_KEYS = frozenset(("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"))


def _ids_to_base64(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise PayloadError(f"{key} {value[:40]!r} is not hex") from None
            elif isinstance(value, (dict, list)):
                _ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _ids_to_base64(item)


def parse(body: bytes, content_type: str):
    """The `ExportTraceServiceRequest` in `body`, or `PayloadError` saying why not."""
    pb = _messages()
    request = pb.ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            request.ParseFromString(body)
        except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or RuntimeWarning-like errors
            raise PayloadError(f"not an OTLP protobuf ExportTraceServiceRequest ({type(exc).__name__}: {exc})") from None
        return request
    if content_type == JSON:
        from google.protobuf import json_format

        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PayloadError(f"body is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise PayloadError("OTLP JSON body must be an object with resourceSpans")
        _ids_to_base64(data)
        try:
            json_format.ParseDict(data, request, ignore_unknown_fields=True)  # OTLP: unknown fields are ignored
        except (json_format.ParseError, binascii.Error, TypeError, ValueError) as exc:
            raise PayloadError(f"not an OTLP JSON ExportTraceServiceRequest ({str(exc)[:200]})") from None
        return request
    raise PayloadError(f"unsupported content type {content_type!r} (send {PROTOBUF} or {JSON})")


def response(content_type: str, rejected: int = 0, message: str = "") -> bytes:
    """An `ExportTraceServiceResponse`, with `partial_success` when spans were rejected."""
    pb = _messages()
    out = pb.ExportTraceServiceResponse()
    if rejected or message:
        out.partial_success.rejected_spans = rejected
        out.partial_success.error_message = message
    return _encode(out, content_type)


def status(content_type: str, code: int, message: str) -> bytes:
    """A `google.rpc.Status` body, as OTLP/HTTP error responses carry (code: a gRPC code)."""
    try:
        from google.rpc import status_pb2
    except ImportError:  # googleapis-common-protos comes with the OTLP exporter; plain text otherwise
        return message.encode()
    return _encode(status_pb2.Status(code=code, message=message), content_type)


def _encode(message, content_type: str) -> bytes:
    if content_type == JSON:
        from google.protobuf import json_format

        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()


# --- values ---------------------------------------------------------------------------------------
def value(any_value) -> Any:
    """An OTLP `AnyValue` as a plain Python value (bytes as base64 text, as OTLP JSON writes them)."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    v = getattr(any_value, kind)
    if kind == "array_value":
        return [value(x) for x in v.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.values}
    if kind == "bytes_value":
        return base64.b64encode(v).decode()
    return v


_SCALARS = frozenset(("string_value", "int_value", "double_value", "bool_value"))


def attributes(key_values) -> dict[str, Any]:
    """OTLP `KeyValue`s as a dict (scalars inline: this runs for every attribute of every span)."""
    out = {}
    for kv in key_values:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = getattr(v, kind) if kind in _SCALARS else value(v)
    return out


# --- span adapters ------------------------------------------------------------------------------
class _Context:
    __slots__ = ("trace_id", "span_id")

    def __init__(self, trace_id: int, span_id: int):
        self.trace_id, self.span_id = trace_id, span_id


class _Status:
    __slots__ = ("status_code", "description")

    def __init__(self, code: int, message: str):
        self.status_code = _STATUS.get(code, StatusCode.UNSET)
        self.description = message or None


class _Event:
    __slots__ = ("name", "timestamp", "attributes")

    def __init__(self, event):
        self.name, self.timestamp, self.attributes = event.name, event.time_unix_nano, attributes(event.attributes)


class _Link:
    __slots__ = ("context",)

    def __init__(self, link):
        self.context = _Context(int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big"))


# OTLP numbers its enums from UNSPECIFIED = 0; the OTel API's start at INTERNAL = 0 / UNSET = 0.
_STATUS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_KIND = {0: SpanKind.INTERNAL, 1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER}


class RemoteSpan:
    """One OTLP span with the attributes of an SDK `ReadableSpan` that the row builder reads.

    The instrumentation scope is kept as `otel.scope.name`/`otel.scope.version` attributes (as
    OTel's non-OTLP exporters do), so a vLLM span can be told from a user's span after storage.
    """

    __slots__ = ("context", "parent", "name", "attributes", "start_time", "end_time", "status", "kind", "events", "links")

    def __init__(self, span, scope_attrs: dict[str, Any]):
        self.context = _Context(int.from_bytes(span.trace_id, "big"), int.from_bytes(span.span_id, "big"))
        self.parent = _Context(self.context.trace_id, int.from_bytes(span.parent_span_id, "big")) if span.parent_span_id else None
        self.name = span.name
        attrs = attributes(span.attributes)
        self.attributes = {**scope_attrs, **attrs} if scope_attrs else attrs
        self.start_time = span.start_time_unix_nano
        self.end_time = span.end_time_unix_nano
        self.status = _Status(span.status.code, span.status.message)
        self.kind = _KIND.get(span.kind, SpanKind.INTERNAL)
        self.events = [_Event(e) for e in span.events]
        self.links = [_Link(link) for link in span.links]


def invalid(span) -> str | None:
    """Why an OTLP span cannot be stored (ids of the wrong length), or None."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        return "trace_id is not 16 bytes (or is all zero)"
    if len(span.span_id) != 8 or not any(span.span_id):
        return "span_id is not 8 bytes (or is all zero)"
    if span.parent_span_id and len(span.parent_span_id) != 8:
        return "parent_span_id is not 8 bytes"
    return None


def scope_attributes(scope) -> dict[str, Any]:
    out = {}
    if scope.name:
        out["otel.scope.name"] = scope.name
    if scope.version:
        out["otel.scope.version"] = scope.version
    return out


def spans_of(resource_spans) -> Iterator[tuple[Any, dict[str, Any]]]:
    """(OTLP span, its scope's attributes) for every span of one `ResourceSpans`."""
    for scope_spans in resource_spans.scope_spans:
        scope = scope_attributes(scope_spans.scope)
        for span in scope_spans.spans:
            yield span, scope


def count(resource_spans) -> int:
    return sum(len(s.spans) for s in resource_spans.scope_spans)
