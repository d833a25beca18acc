"""OTLP/HTTP trace payloads in, objects the store's row builder reads out.

A request body (protobuf or OTLP JSON, optionally gzip) becomes an `ExportTraceServiceRequest`
(`opentelemetry-proto`). Each OTLP span is then wrapped in a small adapter with the attributes of
an SDK `ReadableSpan` that `rltrace.store.rows.spans_table` reads, so remote spans take exactly the
path of rltrace's own: the same `rl.*` → column mapping, the same checks, the same drop reasons.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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
    """`body` inflated, every gzip member of it (a valid gzip stream may hold several, one after
    another), refusing more than `limit` bytes in all (a small gzip bomb cannot fill memory)."""
    out, rest = [], body
    size = 0
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise PayloadError(f"body is not valid gzip ({exc})") from None
        size += len(chunk)
        out.append(chunk)
        if size > limit or inflater.unconsumed_tail:
            raise TooLarge(f"body inflates to more than {limit} bytes")
        if not inflater.eof:
            raise PayloadError("gzip body is truncated")
        rest = inflater.unused_data
        if not rest.strip(b"\0"):  # the end (padding of zero bytes allowed, as gzip(1) does)
            return b"".join(out)


# OTLP JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as base64.
_SPAN_IDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")
_LINK_IDS = ("traceId", "spanId", "trace_id", "span_id")
_MAX_DEPTH = 100  # messages nested deeper are refused, in JSON as protobuf's own parser refuses them


def _hex_ids_to_base64(node: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = node.get(key)
        if isinstance(value, str):
            try:
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise ValueError(f"{key} {value[:40]!r} is not hex") from None


@dataclass
class Rejected:
    """Spans of a request that could not be decoded, and why (each costs itself, not its request)."""

    group: int | None  # index of their sender's `ResourceSpans` in the decoded request; None: sender unknown
    spans: int
    reason: str


def parse(body: bytes, content_type: str) -> tuple[Any, list[Rejected]]:
    """The `ExportTraceServiceRequest` in `body` with every span that decodes, and the spans that
    do not; `PayloadError` when the body as a whole is not an OTLP trace export."""
    if content_type == PROTOBUF:
        request = _messages().ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
            return request, []
        except Exception:  # noqa: BLE001 - protobuf raises DecodeError and others: read it part by part
            return _assemble(_protobuf_groups(body))
    if content_type == JSON:
        try:
            data = json.loads(body)
        except RecursionError:
            raise PayloadError("body is JSON nested too deeply to be an OTLP export") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise PayloadError(f"body is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise PayloadError("OTLP JSON body must be an object with resourceSpans")
        return _assemble(_json_groups(data))
    raise PayloadError(f"unsupported content type {content_type!r} (send {PROTOBUF} or {JSON})")


# A sender's spans, part by part: (fill its Resource, [(fill a scope, [fill a Span, ...]), ...]);
# each `fill` reads one part into the message it is given, or raises saying why it cannot.
Fill = Callable[[Any], None]
Group = tuple[Fill, list[tuple[Fill, list[Fill]]]]


def _assemble(groups: Iterator[Group]) -> tuple[Any, list[Rejected]]:
    """One request of every part that decodes; a part that does not costs its own spans only."""
    pb = _messages()
    from opentelemetry.proto.trace.v1 import trace_pb2

    request, rejected = pb.ExportTraceServiceRequest(), []
    for fill_resource, scopes in groups:
        resource_spans = trace_pb2.ResourceSpans()
        why = _why(fill_resource, resource_spans.resource)
        if why is not None:
            rejected.append(Rejected(None, sum(len(spans) for _, spans in scopes), f"resource {why}"))
            continue
        group = len(request.resource_spans)
        for fill_scope, spans in scopes:
            scope_spans = resource_spans.scope_spans.add()
            why = _why(fill_scope, scope_spans.scope)
            if why is not None:
                rejected.append(Rejected(group, len(spans), f"instrumentation scope {why}"))
                continue
            for fill_span in spans:
                span = trace_pb2.Span()
                why = _why(fill_span, span)
                if why is None:
                    scope_spans.spans.append(span)
                else:
                    rejected.append(Rejected(group, 1, f"span {why}"))
        request.resource_spans.append(resource_spans)
    return request, rejected


def _why(fill: Fill, message) -> str | None:
    try:
        fill(message)
        return None
    except RecursionError:
        return _TOO_DEEP
    except Exception as exc:  # noqa: BLE001 - whatever the parser says is the reason, counted
        said = " ".join(str(exc).split())
        if "MaxDepth" in said or "too deep" in said:  # protobuf's words for it (upb, json_format)
            return _TOO_DEEP
        said = re.sub(r"^Error parsing message with type '[\w.]+': ", "", said)
        return f"could not be decoded ({said[:200] or type(exc).__name__})"


_TOO_DEEP = f"is nested more than {_MAX_DEPTH} levels deep"


def _protobuf_groups(body: bytes) -> Iterator[Group]:
    """The parts of a protobuf body that did not parse whole. Its framing must hold (a body that is
    not protobuf at all is refused whole); what is inside each resource, scope and span may not."""
    skeleton = _skeleton()
    try:
        groups = [skeleton["ResourceSpans"].FromString(rs) for rs in skeleton["Request"].FromString(body).resource_spans]
        scopes = [[skeleton["ScopeSpans"].FromString(ss) for ss in g.scope_spans] for g in groups]
    except Exception as exc:  # noqa: BLE001
        raise PayloadError(f"not an OTLP protobuf ExportTraceServiceRequest ({type(exc).__name__}: {exc})") from None

    def fill(data: bytes) -> Fill:
        return lambda message: message.ParseFromString(data)

    for g, ss in zip(groups, scopes):
        yield fill(g.resource), [(fill(s.scope), [fill(span) for span in s.spans]) for s in ss]


def _json_groups(data: dict) -> Iterator[Group]:
    """The parts of an OTLP JSON body: the lists must be lists; each resource, scope and span is
    parsed on its own (ids from hex, unknown fields ignored as OTLP asks)."""
    from google.protobuf import json_format

    def fill(value: Any, ids: bool = False) -> Fill:
        def parse_into(message) -> None:
            if value is None:
                return
            if not isinstance(value, dict):
                raise ValueError(f"is {type(value).__name__}, not an object")
            if ids:
                _hex_ids_to_base64(value, _SPAN_IDS)
                for link in value.get("links") or ():
                    if isinstance(link, dict):
                        _hex_ids_to_base64(link, _LINK_IDS)
            json_format.ParseDict(value, message, ignore_unknown_fields=True, max_recursion_depth=_MAX_DEPTH)

        return parse_into

    for rs in _items(data, "resourceSpans", "resource_spans"):
        scopes = []
        for ss in _items(rs, "scopeSpans", "scope_spans"):
            spans = [fill(span, ids=True) for span in _items(ss, "spans")]
            scopes.append((fill(ss.get("scope")), spans))
        yield fill(rs.get("resource")), scopes


def _items(node: Any, *keys: str) -> list:
    """The list under the first of `keys` in `node` (absent: empty); the lists hold objects."""
    if not isinstance(node, dict):
        raise PayloadError(f"not an OTLP JSON ExportTraceServiceRequest (expected an object, found {type(node).__name__})")
    value = next((node[k] for k in keys if k in node), None)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PayloadError(f"not an OTLP JSON ExportTraceServiceRequest ({keys[0]} is {type(value).__name__}, not a list)")
    return value


@functools.cache
def _skeleton() -> dict[str, Any]:
    """Message types with the framing of an OTLP request and each part left as bytes, so that a
    part protobuf refuses (bad UTF-8, nesting too deep) can be read apart from the others."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="rltrace_otlp_skeleton.proto", package="rltrace.skeleton", syntax="proto3")
    for name, one, many in (("Request", None, "resource_spans"), ("ResourceSpans", "resource", "scope_spans"),
                            ("ScopeSpans", "scope", "spans")):
        message = proto.message_type.add(name=name)
        if one:
            message.field.add(name=one, number=1, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
        message.field.add(name=many, number=1 if one is None else 2, type=field.TYPE_BYTES, label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"rltrace.skeleton.{m.name}"))
            for m in proto.message_type}


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
    for name, value in (("start", span.start_time_unix_nano), ("end", span.end_time_unix_nano)):
        if value >= 2**63:
            return f"{name}_time_unix_nano {value} is past the year 2262 (not a time rltrace can store)"
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return "ends before it starts (end_time_unix_nano < start_time_unix_nano)"
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
