"""`rltrace collect` against senders that are slow, broken or hostile: the others keep being
answered, every good span of a request with bad ones is kept, every loss is counted with its reason.
All on loopback, bounded in connections and time."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from rltrace.cli.info import collect as info
from rltrace.collect import Limits, Receiver

from ..conftest import PYTHON, python_env
from .test_receiver import JS, PB, otlp_json, post, proto_request, spans_of


def _slow_connection(host: str, port: int) -> socket.socket:
    """A sender that announces a 1,000-byte body and then trickles it."""
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n")
    return s


def test_twenty_slow_senders_do_not_starve_the_others_and_are_dropped(run_dir):
    """20 connections trickle a byte every 2 s (more than the 16 decode slots): whole requests are
    answered 200 within 3 s all along; each slow one gets 408 at its deadline and is counted."""
    proc = subprocess.Popen([PYTHON, "-m", "rltrace", "collect", str(run_dir), "--listen", "127.0.0.1:0",
                             "--request-timeout", "5", "--flush-interval", "0.2"],
                            env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split(" at ")[1].split()[0]
        host, port = url.split("/")[2].rsplit(":", 1)
        slow = [_slow_connection(host, int(port)) for _ in range(20)]
        stop = threading.Event()

        def trickle():
            while not stop.wait(2.0):
                for s in slow:
                    try:
                        s.send(b"x")
                    except OSError:
                        pass

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        started, answers = time.monotonic(), []
        while time.monotonic() - started < 4.0:  # all while the slow ones hold their connections
            t0 = time.monotonic()
            status, _, _ = post(url, proto_request(10, "legit"), PB)
            answers.append((status, time.monotonic() - t0))
            time.sleep(0.25)
        assert len(answers) >= 10
        assert all(status == 200 for status, _ in answers), answers
        assert max(took for _, took in answers) < 3.0, answers
        for s in slow:  # at their deadline (5 s after their first byte) each is answered 408 and closed
            s.settimeout(10)
            assert s.recv(4096).startswith(b"HTTP/1.1 408 ")
        stop.set()
        assert post(url, proto_request(10, "legit"), PB)[0] == 200  # and the receiver still serves
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        for s in slow:
            s.close()
    assert proc.returncode == 0, err
    assert "20 requests rejected" in out
    data = info(str(run_dir))
    assert {p["role"]: p["spans"] for p in data["processes"]} == {"legit": 10 * (len(answers) + 1), "collector": 0}
    [reason] = data["drop_reasons"]
    assert reason["table"] == "requests" and reason["count"] == 20
    assert "not received whole within 5 s" in reason["reason"] and "--request-timeout" in reason["reason"]


def test_connections_past_the_cap_are_answered_503_and_counted(run_dir):
    with Receiver(run_dir, "127.0.0.1", 0, Limits(max_connections=3)) as r:
        held = [_slow_connection(*r.address) for _ in range(3)]
        time.sleep(0.2)  # the three are being served
        status, headers, _ = post(r.url, proto_request(1, "late"), PB)
        assert status == 503 and headers["Retry-After"] == "1"
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while r.server.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert post(r.url, proto_request(1, "late"), PB)[0] == 200  # closed connections free their places
        records = sorted((d["table"], d["count"], d["reason"]) for d in r.drops.records())
    assert records == [("refused requests", 1, "answered 503: 3 connections already open (raise --max-connections)"),
                       ("requests", 3, "connection closed after 0 of 1000 body bytes")]  # the three that hung up


def test_bodies_being_received_are_bounded_together(run_dir):
    """Bodies are charged as they arrive: past the budget a request is refused with 503, and a slow
    sender holds only the bytes it sent."""
    limits = Limits(max_inflight=1, max_request_bytes=100_000)  # 100 kB of bodies at once
    with Receiver(run_dir, "127.0.0.1", 0, limits) as r:
        slow = socket.create_connection(r.address, timeout=10)
        slow.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                     b"Content-Length: 100000\r\n\r\n" + b"\0" * 90_000)
        deadline = time.monotonic() + 10
        while r.server.bodies.used < 90_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.server.bodies.used <= 100_000
        assert post(r.url, proto_request(2, "small"), PB)[0] == 200  # fits beside it
        status, _, _ = post(r.url, proto_request(200, "big"), PB)  # ~26 kB: does not
        assert status == 503
        slow.close()
        while r.server.bodies.used and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.server.bodies.used == 0
        assert post(r.url, proto_request(200, "big"), PB)[0] == 200
    assert any(d["table"] == "refused requests" and "request bodies being received" in d["reason"] for d in r.drops.records())


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _deep_attribute(depth: int) -> bytes:
    """A span's `attributes` entry (KeyValue) whose value is arrays in arrays, `depth` deep."""
    value = b""
    for _ in range(depth):
        value = _field(5, _field(1, value))  # AnyValue.array_value -> ArrayValue.values
    return _field(9, _field(1, b"deep") + _field(2, value))  # Span.attributes -> KeyValue{key, value}


def _span(i: int, name: bytes = b"score") -> bytes:
    span = trace_pb2.Span(trace_id=b"\x11" * 16, span_id=i.to_bytes(8, "big"), name="x", start_time_unix_nano=10 + i,
                          end_time_unix_nano=20 + i, attributes=[common_pb2.KeyValue(key="rl.phase", value=common_pb2.AnyValue(string_value="reward"))])
    return span.SerializeToString().replace(b"\x2a\x01x", b"\x2a" + _varint(len(name)) + name)  # Span.name = 5


def _resource_spans(service: bytes, spans: list[bytes]) -> bytes:
    key_value = _field(1, b"service.name") + _field(2, _field(1, service))  # KeyValue{key, AnyValue.string_value}
    resource = _field(1, key_value)  # Resource.attributes
    scope = _field(1, _field(1, b"lib"))  # ScopeSpans.scope -> InstrumentationScope.name
    return _field(1, resource) + _field(2, scope + b"".join(_field(2, s) for s in spans))


def test_a_protobuf_request_keeps_every_span_that_decodes(receiver, run_dir):
    """Protobuf refuses a whole request over one span's bad UTF-8 or a 50,000-deep value: the
    receiver reads the request part by part, so only those spans are lost, each counted."""
    good = [_span(i) for i in (1, 2, 3)]
    bad_text = _span(4, name=b"\xff\xfe")
    deep = _span(5) + _deep_attribute(50_000)
    body = (_field(1, _resource_spans(b"reward-svc", [good[0], bad_text, good[1], deep, good[2]]))
            + _field(1, _resource_spans(b"bad-\xff", [_span(6), _span(7)])))  # a sender whose resource does not decode
    with pytest.raises(Exception):
        trace_service_pb2.ExportTraceServiceRequest.FromString(body)  # what protobuf alone makes of it
    status, _, answer = post(receiver.url, body, PB)
    assert status == 200
    partial = trace_service_pb2.ExportTraceServiceResponse.FromString(answer).partial_success
    assert partial.rejected_spans == 4 and partial.error_message.startswith("4 spans not stored: span ")
    assert partial.error_message.endswith("(and 2 more reasons: rltrace info lists them)")
    receiver.flush()
    assert sorted(s["span_id"] for s in spans_of(run_dir)) == [f"{i:016x}" for i in (1, 2, 3)]
    data = info(str(run_dir))
    by_role = {p["role"]: p for p in data["processes"]}
    assert (by_role["reward-svc"]["spans"], by_role["reward-svc"]["spans_dropped"]) == (3, 2)
    assert by_role["collector"]["spans_dropped"] == 2  # the sender could not be told apart: counted by the receiver
    reasons = sorted((d["count"], d["reason"]) for d in data["drop_reasons"])
    assert reasons == [(1, "span could not be decoded (String field had bad UTF-8)"),
                       (1, "span is nested more than 100 levels deep"),
                       (2, "resource could not be decoded (String field had bad UTF-8)")]


def test_a_json_request_keeps_every_span_that_decodes(receiver, run_dir):
    data = otlp_json(7)
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[1]["traceId"] = "zz"
    spans[2]["startTimeUnixNano"] = "soon"
    spans[3]["spanId"] = "00"  # decodes, but is not a span id: dropped later, alone
    nested: dict = {"stringValue": "bottom"}
    for _ in range(150):
        nested = {"arrayValue": {"values": [nested]}}
    spans[4]["attributes"].append({"key": "deep", "value": nested})
    spans[5] = "not a span"
    status, _, answer = post(receiver.url, json.dumps(data).encode(), JS)
    assert status == 200
    partial = json.loads(answer)["partialSuccess"]
    assert partial["rejectedSpans"] == "5"
    assert partial["errorMessage"].startswith("1 spans refused: span_id is not 8 bytes (or is all zero); "
                                              "4 spans not stored: span could not be decoded (traceId 'zz' is not hex)")
    receiver.flush()
    assert sorted(s["span_id"] for s in spans_of(run_dir)) == [f"{i:016x}" for i in (1, 7)]
    reasons = {d["reason"]: d["count"] for d in info(str(run_dir))["drop_reasons"]}
    assert sum(reasons.values()) == 5 and len(reasons) == 5
    assert reasons["span_id is not 8 bytes (or is all zero)"] == 1
    assert reasons["span is nested more than 100 levels deep"] == 1 and any("soon" in r for r in reasons)
    assert any("is str, not an object" in r for r in reasons)


def test_idle_and_header_trickling_connections_cannot_starve_a_sender(run_dir, monkeypatch):
    """Every place taken by connections that send nothing (then more of them), and some that
    trickle their headers: the longest idle one gives its place to a new connection, headers must
    arrive within `HEADER_S`, and a legitimate sender gets 200 on every request."""
    import socket

    from rltrace.collect import server

    monkeypatch.setattr(server, "HEADER_S", 1.0)
    with Receiver(run_dir, "127.0.0.1", 0, Limits(max_connections=20)) as r:
        host, port = r.address
        idle = [socket.create_connection((host, port)) for _ in range(30)]  # more than there are places
        slow = []
        for _ in range(3):
            s = socket.create_connection((host, port))
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # and never the rest of its headers
            slow.append(s)
        answers = [post(r.url, proto_request(10, "legit"), PB)[0] for _ in range(10)]
        assert answers == [200] * 10
        for s in slow:  # closed with 408 a second after their first byte
            s.settimeout(10)
            assert s.recv(4096).startswith(b"HTTP/1.1 408 ")
        for s in idle + slow:
            s.close()
    data = info(str(run_dir))
    assert {p["role"]: p["spans"] for p in data["processes"]} == {"legit": 100, "collector": 0}
    reasons = {d["reason"]: d["count"] for d in data["drop_reasons"]}
    assert reasons == {"request line and headers not received within 1 s of the first byte: a slow sender, dropped": 3}


def test_one_client_cannot_take_every_connection(run_dir):
    """A client holding its share of connections busy (headers trickling) is refused more, with the
    reason; a sender at another address is served."""
    import http.client

    limits = Limits(max_connections=50, max_client_connections=4)
    with Receiver(run_dir, "127.0.0.1", 0, limits) as r:
        host, port = r.address
        busy = []
        for _ in range(4):
            s = socket.create_connection((host, port), source_address=("127.0.0.1", 0))
            s.sendall(b"POST /v1/traces HTTP/1.1\r\n")  # begun, never finished (within the header timeout)
            busy.append(s)
        time.sleep(0.3)
        extra = socket.create_connection((host, port), source_address=("127.0.0.1", 0))
        extra.settimeout(10)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503 ")
        other = http.client.HTTPConnection(host, port, timeout=30, source_address=("127.0.0.2", 0))
        other.request("POST", "/v1/traces", proto_request(3, "legit"), {"Content-Type": PB})
        assert other.getresponse().status == 200
        other.close()
        for s in busy + [extra]:
            s.close()
    reasons = {d["reason"]: d["count"] for d in info(str(run_dir))["drop_reasons"]}
    assert reasons.get("answered 503: 4 connections from 127.0.0.1 already open (raise --max-client-connections)") == 1
