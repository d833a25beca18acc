"""`rltrace collect`: OTLP/HTTP spans from plain OpenTelemetry senders land in the run, exactly."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import duckdb
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from rltrace.cli import main
from rltrace.cli.info import collect as info
from rltrace import store
from rltrace.collect import Limits, Receiver
from rltrace.collect import receiver as receiver_module

from ..conftest import PYTHON, python_env

HERE = Path(__file__).parent
PB, JS = "application/x-protobuf", "application/json"


def post(url, body: bytes, content_type: str = PB, encoding: str | None = None):
    """(status, headers, body) of one POST; HTTP errors are answers too."""
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def spans_of(run_dir) -> list[dict]:
    """The stored span rows, ids as hex (parts store them as int64 and 16 bytes)."""
    cur = duckdb.connect().execute(
        f"""SELECT * REPLACE (lower(hex(trace_id)) AS trace_id, printf('%016x', span_id) AS span_id,
                              printf('%016x', parent_span_id) AS parent_span_id)
            FROM read_parquet('{run_dir}/spans/*.parquet', union_by_name=true) ORDER BY start_ns""")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def otlp_json(n: int, *, service: str = "reward-svc", step: int = 5, first: int = 1) -> dict:
    """An OTLP JSON export as other languages' SDKs write it: hex ids, camelCase, int64 as strings."""
    spans = [
        {
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": f"{first + i:016x}",
            "parentSpanId": "eee19b7ec3c1b174",
            "name": "score",
            "kind": 2,
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + i * 1000),
            "endTimeUnixNano": str(1_700_000_000_000_000_000 + i * 1000 + 500),
            "attributes": [
                {"key": "rl.phase", "value": {"stringValue": "reward"}},
                {"key": "rl.step", "value": {"intValue": str(step)}},
                {"key": "judge", "value": {"stringValue": "rm-7b"}},
                {"key": "scores", "value": {"arrayValue": {"values": [{"doubleValue": 0.5}, {"doubleValue": 1.0}]}}},
            ],
            "events": [{"timeUnixNano": "1700000000000000100", "name": "timeout", "attributes": []}],
            "status": {"code": 2, "message": "judge timed out"},
        }
        for i in range(n)
    ]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}},
                               {"key": "service.instance.id", "value": {"stringValue": "2"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "reward-lib"}, "spans": spans, "unknownField": 1}]}]}


def proto_request(n: int, service: str, trace: str | None = None) -> bytes:
    """An OTLP protobuf export of `n` spans (built from JSON, so both encodings are one payload),
    in a trace of its own (`trace`: hex, or a fresh one): two calls are two requests, not one resent."""
    import os

    from google.protobuf import json_format

    data = otlp_json(n, service=service)
    for span in data["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["traceId"] = trace or os.urandom(16).hex()
        for key in ("traceId", "spanId", "parentSpanId"):
            span[key] = __import__("base64").b64encode(bytes.fromhex(span[key])).decode()
    del data["resourceSpans"][0]["scopeSpans"][0]["unknownField"]
    return json_format.ParseDict(data, trace_service_pb2.ExportTraceServiceRequest()).SerializeToString()


def test_a_plain_otel_sdk_process_lands_with_steps_and_phases(receiver, run_dir, capsys):
    done = subprocess.run([PYTHON, str(HERE / "sdk_sender.py"), receiver.url, "vllm-engine", "3", "4"],
                          env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    receiver.close()
    spans = spans_of(run_dir)
    assert len(spans) == 16
    assert {(s["phase"], s["step"]) for s in spans if s["phase"] == "train"} == {("train", i) for i in range(1, 5)}
    rollout = [s for s in spans if s["phase"] == "rollout"]
    assert [s["weight_version"] for s in rollout] == [0, 1, 2, 3]
    plain = [s for s in spans if s["name"] == "http.request"]
    assert len(plain) == 4 and all(s["phase"] is None and s["step"] is None for s in plain)  # kept, not guessed
    gen = next(s for s in spans if s["phase"] == "generate")
    attrs = json.loads(gen["attributes"])
    assert attrs == {"gen_ai.request.model": "tiny", "otel.scope.name": "sdk-sender", "otel.scope.version": "1.0"}
    assert gen["parent_span_id"] == rollout[0]["span_id"] and gen["trace_id"] == rollout[0]["trace_id"]
    assert {(s["role"], s["rank"], s["host"], s["pid"], s["service_name"]) for s in spans} == {("vllm-engine", 3, "node-7", 4242, "vllm-engine")}

    data = info(str(run_dir))
    by_role = {p["role"]: p for p in data["processes"]}
    assert by_role["vllm-engine"]["spans"] == 16 and by_role["vllm-engine"]["spans_dropped"] == 0
    assert by_role["collector"]["spans"] == 0 and by_role["vllm-engine"]["ended_ns"] is not None

    assert main(["report", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    phases = {p["phase"] for p in report["phases"]}
    assert {"rollout", "generate", "train"} <= phases
    assert len(report["steps"]) == 4


def test_otlp_json_and_gzip(receiver, run_dir):
    status, headers, body = post(receiver.url, json.dumps(otlp_json(3)).encode(), JS)
    assert status == 200 and headers["Content-Type"] == JS
    assert json.loads(body) == {}  # full success: no partialSuccess
    status, _, _ = post(receiver.url, gzip.compress(json.dumps(otlp_json(2, step=6, first=10)).encode()), JS, "gzip")
    assert status == 200
    status, _, body = post(receiver.url, gzip.compress(proto_request(4, "proto-svc")), PB, "gzip")
    assert status == 200
    response = trace_service_pb2.ExportTraceServiceResponse.FromString(body)
    assert not response.HasField("partial_success")
    receiver.flush()
    spans = spans_of(run_dir)
    assert len(spans) == 9
    s = next(s for s in spans if s["step"] == 5 and s["span_id"] == "0000000000000001")
    assert s["trace_id"] == "5b8efff798038103d269b633813fc60c" and s["parent_span_id"] == "eee19b7ec3c1b174"
    assert (s["phase"], s["kind"], s["status"], s["status_message"]) == ("reward", "SERVER", "ERROR", "judge timed out")
    assert s["end_ns"] - s["start_ns"] == 500
    assert json.loads(s["attributes"]) == {"judge": "rm-7b", "scores": [0.5, 1.0], "otel.scope.name": "reward-lib"}
    assert json.loads(s["events"]) == [{"name": "timeout", "time_ns": 1700000000000000100, "attributes": {}}]
    assert (s["role"], s["rank"]) == ("reward-svc", 2)  # numeric service.instance.id is the rank
    assert sorted(x["step"] for x in spans if x["role"] == "reward-svc") == [5, 5, 5, 6, 6]
    assert sum(x["role"] == "proto-svc" for x in spans) == 4


def test_eight_senders_at_once_lose_nothing(receiver, run_dir):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    per_sender, barrier = 1500, threading.Barrier(8)

    def send(rank: int) -> None:
        provider = TracerProvider(resource=Resource.create({"service.name": "rollout", "rl.rank": rank}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=receiver.url), max_queue_size=per_sender))
        tracer = provider.get_tracer("t")
        barrier.wait()
        for i in range(per_sender):
            with tracer.start_as_current_span("generate", attributes={"rl.phase": "generate", "rl.step": i % 10, "i": i}):
                pass
        provider.shutdown()

    threads = [threading.Thread(target=send, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    receiver.close()
    counts = duckdb.connect().execute(
        f"SELECT rank, count(*), count(DISTINCT span_id), count(DISTINCT attributes) FROM '{run_dir}/spans/*.parquet' GROUP BY rank ORDER BY rank"
    ).fetchall()
    assert counts == [(r, per_sender, per_sender, per_sender) for r in range(8)]
    data = info(str(run_dir))
    assert data["spans_dropped"] == 0 and data["drop_reasons"] == []
    assert sorted(p["rank"] for p in data["processes"] if p["role"] == "rollout") == list(range(8))
    assert sum(s.written for s in receiver.senders()) == 8 * per_sender


@pytest.mark.parametrize(
    "body, content_type, encoding, code, reason",
    [
        (b"\x0a\xff\xff\xff", PB, None, 400, "not an OTLP protobuf"),
        (b"{not json", JS, None, 400, "not JSON"),
        (b"[1, 2]", JS, None, 400, "must be an object"),
        (json.dumps({"resourceSpans": "many"}).encode(), JS, None, 400, "resourceSpans is str, not a list"),
        (json.dumps({"resourceSpans": [{"scopeSpans": [[]]}]}).encode(), JS, None, 400, "expected an object, found list"),
        (b'{"resourceSpans": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", JS, None, 400, "nested too deeply"),
        (b"plain bytes", PB, "gzip", 400, "not valid gzip"),
        (gzip.compress(b"abc" * 100, mtime=0)[:-12], PB, "gzip", 400, "gzip body is truncated"),
        (b"", PB, "br", 400, "unsupported Content-Encoding"),
        (b"hello", "text/plain", None, 415, "unsupported content type"),
    ],
)
def test_malformed_payloads_get_400_with_a_reason_and_are_counted(receiver, run_dir, body, content_type, encoding, code, reason):
    status, headers, answer = post(receiver.url, body, content_type, encoding)
    assert status == code
    message = json.loads(answer)["message"] if headers["Content-Type"] == JS else status_pb2.Status.FromString(answer).message
    assert reason in message
    assert receiver.rejected_requests == 1
    receiver.flush()
    data = info(str(run_dir))
    assert [(r["table"], r["count"]) for r in data["drop_reasons"]] == [("requests", 1)]
    assert reason in data["drop_reasons"][0]["reason"]


def test_spans_with_bad_ids_are_dropped_alone_and_counted(receiver, run_dir):
    data = otlp_json(3)
    data["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["spanId"] = "00"
    status, _, body = post(receiver.url, json.dumps(data).encode(), JS)
    assert status == 200
    assert json.loads(body)["partialSuccess"] == {
        "rejectedSpans": "1", "errorMessage": "1 spans refused: span_id is not 8 bytes (or is all zero)"}
    receiver.flush()
    assert len(spans_of(run_dir)) == 2
    reasons = info(str(run_dir))["drop_reasons"]
    assert reasons == [{"table": "spans", "column": None, "reason": "span_id is not 8 bytes (or is all zero)", "count": 1}]


def test_wrong_path_oversized_and_gzip_bomb(run_dir):
    with Receiver(run_dir, "127.0.0.1", 0, Limits(max_request_bytes=10_000)) as r:
        assert post(r.url.replace("/v1/traces", "/v1/metrics"), b"", PB)[0] == 404
        assert post(r.url, b"x" * 20_000, PB)[0] == 413
        status, _, answer = post(r.url, gzip.compress(b"\0" * 1_000_000), PB, "gzip")
        assert status == 413 and "inflates to more than 10000 bytes" in status_pb2.Status.FromString(answer).message
        assert r.rejected_requests == 2


def test_a_flood_beyond_the_queue_is_dropped_and_counted_with_memory_bounded(run_dir):
    limits = Limits(max_queue_spans=1000, flush_interval=3600)  # the writer does not drain until flush()
    with Receiver(run_dir, "127.0.0.1", 0, limits) as r:
        answers = []
        for i in range(20):
            status, _, body = post(r.url, proto_request(200, "flood"), PB)
            assert status == 200
            answers.append(trace_service_pb2.ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans)
            assert r._pending_spans <= 1000  # what is held in memory never exceeds the bound
        assert answers == [0] * 5 + [200] * 15
        r.flush()
        assert r._pending_spans == 0 and r._pending_bytes == 0
        # drained: the next request is accepted again
        status, _, body = post(r.url, proto_request(200, "flood"), PB)
        assert trace_service_pb2.ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 0
    assert len(spans_of(run_dir)) == 1200
    data = info(str(run_dir))
    flood = next(p for p in data["processes"] if p["role"] == "flood")
    assert flood["spans"] == 1200 and flood["spans_dropped"] == 3000
    assert data["spans_dropped"] == 3000
    assert [(d["count"], d["reason"].startswith("receiver queue full")) for d in data["drop_reasons"]] == [(3000, True)]


def test_backpressure_answers_503_and_stores_nothing_of_a_refused_request(run_dir):
    limits = Limits(max_queue_spans=300, flush_interval=3600, backpressure=True)
    with Receiver(run_dir, "127.0.0.1", 0, limits) as r:
        assert post(r.url, proto_request(200, "svc"), PB)[0] == 200
        status, headers, _ = post(r.url, proto_request(200, "svc"), PB)
        assert status == 503 and headers["Retry-After"] == "1"
        assert r.refused_spans == 200
    assert len(spans_of(run_dir)) == 200
    reasons = info(str(run_dir))["drop_reasons"]
    assert [(d["table"], d["count"]) for d in reasons] == [("refused spans", 200)]


def test_default_listen_address_is_loopback_and_others_warn(tmp_path):
    from rltrace.cli.collect import DEFAULT_LISTEN, is_loopback, parse_listen

    assert is_loopback(parse_listen(DEFAULT_LISTEN)[0])
    assert is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("")
    assert parse_listen("[::1]:4318") == ("::1", 4318)
    for bad in ("4318", "host:", "host:99999"):
        with pytest.raises(Exception, match="expected HOST:PORT"):
            parse_listen(bad)

    def run_cli(listen: str):
        proc = subprocess.Popen([PYTHON, "-m", "rltrace", "collect", str(tmp_path / "run"), "--listen", listen],
                                env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        return proc.returncode, line + out, err

    rc, out, err = run_cli("127.0.0.1:0")
    assert rc == 0 and "receiving OTLP/HTTP at http://127.0.0.1:" in out and "stopped; 0 spans" in out
    assert "warning" not in err
    rc, out, err = run_cli("0.0.0.0:0")
    assert rc == 0 and "warning: listening on 0.0.0.0, not loopback" in err


def test_concurrent_flood_accounts_for_every_span(run_dir, monkeypatch):
    """4 senders flood a small queue while the writer drains: held spans never pass the bound,
    and every span sent is either written or counted as dropped for its sender."""
    limits = Limits(max_queue_spans=600, flush_interval=0.05)
    peak = [0]

    def held(self):
        return self.__dict__["_held_spans"]

    def hold(self, n):  # every count of held spans the receiver takes, not samples of it
        self.__dict__["_held_spans"] = n
        peak[0] = max(peak[0], n)

    monkeypatch.setattr(Receiver, "_pending_spans", property(held, hold), raising=False)
    with Receiver(run_dir, "127.0.0.1", 0, limits) as r:
        def flood(name):
            for _ in range(60):
                assert post(r.url, proto_request(100, name), PB)[0] == 200

        threads = [threading.Thread(target=flood, args=(f"svc{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert 0 < peak[0] <= 600
    stored = duckdb.connect().execute(f"SELECT role, count(*) FROM '{run_dir}/spans/*.parquet' GROUP BY role").fetchall()
    data = info(str(run_dir))
    for role, n in stored:
        p = next(p for p in data["processes"] if p["role"] == role)
        assert p["spans"] == n and n + p["spans_dropped"] == 6000
    assert sum(n for _, n in stored) + data["spans_dropped"] == 4 * 6000


def test_two_receivers_write_one_run(run_dir):
    """Several receivers may share a run (senders split between them): names never collide."""
    with Receiver(run_dir, "127.0.0.1", 0) as a, Receiver(run_dir, "127.0.0.1", 0) as b:
        assert a.run_id == b.run_id
        assert post(a.url, proto_request(50, "left"), PB)[0] == 200
        assert post(b.url, proto_request(70, "right"), PB)[0] == 200
    data = info(str(run_dir))
    assert {p["role"]: p["spans"] for p in data["processes"]} == {"left": 50, "right": 70, "collector": 0}
    assert sum(p["role"] == "collector" for p in data["processes"]) == 2


def test_an_rltrace_process_sending_over_otlp_keeps_its_role_rank_and_columns(receiver, run_dir, tmp_path):
    """An rltrace process on another node: local run directory, spans also sent to the receiver."""
    import rltrace

    rltrace.init(tmp_path / "local", role="rollout", rank=5, otlp_endpoint=receiver.url, flush_interval=0.1)
    with rltrace.phase("rollout", step=7, weight_version=6):
        with rltrace.phase("generate", bytes=3):
            pass
    rltrace.shutdown()
    receiver.flush()
    remote = sorted(spans_of(run_dir), key=lambda s: s["name"])
    local = sorted(spans_of(tmp_path / "local"), key=lambda s: s["name"])
    cols = ("trace_id", "span_id", "parent_span_id", "name", "phase", "step", "weight_version", "start_ns", "end_ns",
            "status", "kind", "thread_id", "role", "rank", "service_name")
    assert [[s[c] for c in cols] for s in remote] == [[s[c] for c in cols] for s in local]
    # rltrace names threads from its own process at export; the receiver never guesses a remote one
    assert [s["thread_name"] for s in remote] == [None, None] and local[0]["thread_name"] == "MainThread"
    assert [json.loads(s["attributes"]).get("rl.bytes") for s in remote] == [3, None]


def test_spans_arriving_after_close_are_refused_not_lost_silently(run_dir):
    r = Receiver(run_dir, "127.0.0.1", 0)
    r.close()
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(proto_request(5, "late"))
    assert r.accept(request, 100, "127.0.0.1") == (5, "the receiver is shutting down")
    assert r.drops.total("spans") == 5 and r._pending_spans == 0


def test_the_command_binds_loopback_when_not_told_otherwise(monkeypatch, tmp_path, capsys):
    import rltrace.collect

    bound = []

    class Stop(Exception):
        pass

    def fake(run_dir, host, port, limits):
        bound.append((host, port))
        raise Stop

    monkeypatch.setattr(rltrace.collect, "Receiver", fake)
    with pytest.raises(Stop):
        main(["collect", str(tmp_path / "run")])
    assert bound == [("127.0.0.1", 4318)]
    assert "warning" not in capsys.readouterr().err


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc")
def test_a_flood_does_not_grow_memory(run_dir):
    """400 requests of 1,000 spans (~45 MB of protobuf) into a queue of 2,000 spans that is not
    drained: the process grows by far less than what was sent."""
    body = proto_request(1000, "flood")
    with Receiver(run_dir, "127.0.0.1", 0, Limits(max_queue_spans=2000, flush_interval=3600)) as r:
        for _ in range(20):  # warm up allocator pools and connections
            post(r.url, body, PB)
        before = _rss_bytes()
        for _ in range(400):
            post(r.url, body, PB)
        grown = _rss_bytes() - before
        assert r._pending_spans <= 2000
        dropped = sum(s.dropped for s in r.senders())
    assert dropped == 420 * 1000 - 2000
    assert 400 * len(body) > 40 * 2**20 and grown < 10 * 2**20, grown


def test_who_sent_it_from_resource_attributes():
    from rltrace.collect.receiver import identify

    p = identify({"service.name": "vllm", "rl.rank": "3", "host.name": "n7", "process.pid": 99}, "10.0.0.2", "run")
    assert (p.role, p.rank, p.host, p.pid, p.service_name) == ("vllm", 3, "n7", 99, "vllm")  # env values are text
    p = identify({"service.name": "svc", "rl.role": "reward", "service.instance.id": "pod-a"}, "10.0.0.2", "run")
    assert (p.role, p.rank, p.host, p.pid) == ("reward", None, "10.0.0.2", None)
    p = identify({}, "::1", "run")
    assert (p.role, p.service_name) == ("unknown_service", "unknown_service")
    assert identify({"rl.rank": 2**70}, "h", "run").rank is None  # does not fit the column: not guessed
    assert identify({"service.name": "a/b"}, "h", "run").process_id.startswith("a_b-h-otlp-")


def test_a_resent_request_is_stored_once_also_by_a_receiver_started_again(run_dir):
    """OTel SDKs and Collectors send a request again after a timeout or a dropped connection:
    each span (trace_id, span_id) is stored once, and the copies are counted with the reason."""
    body = proto_request(50, "resender")
    with Receiver(run_dir, "127.0.0.1", 0) as r:
        assert post(r.url, body, PB)[0] == 200
        r.flush()
        assert post(r.url, body, PB)[0] == 200  # the answer was lost: sent again
    with Receiver(run_dir, "127.0.0.1", 0) as r:  # the receiver restarted in between
        assert post(r.url, body, PB)[0] == 200
        assert post(r.url, proto_request(5, "resender"), PB)[0] == 200  # new spans still land
    spans = spans_of(run_dir)
    assert len(spans) == 55 and len({(s["trace_id"], s["span_id"]) for s in spans}) == 55
    reasons = {d["reason"]: d["count"] for d in info(str(run_dir))["drop_reasons"]}
    assert reasons == {receiver_module.RESENT: 100}
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (55, 55)


def test_times_past_int64_and_spans_ending_before_they_start_are_refused_alone_and_counted(receiver, run_dir):
    data = otlp_json(4)
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["startTimeUnixNano"] = str(2**63)
    spans[1]["endTimeUnixNano"] = str(2**64 - 1)
    spans[2]["endTimeUnixNano"] = str(int(spans[2]["startTimeUnixNano"]) - 1)  # a negative duration
    status, _, body = post(receiver.url, json.dumps(data).encode(), JS)
    assert status == 200
    answer = json.loads(body)["partialSuccess"]
    assert answer["rejectedSpans"] == "3" and "past the year 2262" in answer["errorMessage"]
    receiver.flush()
    assert [s["span_id"] for s in spans_of(run_dir)] == ["0000000000000004"]
    reasons = {r["reason"]: r["count"] for r in info(str(run_dir))["drop_reasons"]}
    assert reasons == {"start_time_unix_nano 9223372036854775808 is past the year 2262 (not a time rltrace can store)": 1,
                       "end_time_unix_nano 18446744073709551615 is past the year 2262 (not a time rltrace can store)": 1,
                       "ends before it starts (end_time_unix_nano < start_time_unix_nano)": 1}


def test_a_body_of_two_gzip_members_is_read_whole(receiver, run_dir):
    """`cat a.gz b.gz` is valid gzip: both members' spans are stored (a reader of the first alone kept 5 of 12)."""
    first = json.dumps(otlp_json(5)).encode()
    body = gzip.compress(first[: len(first) // 2]) + gzip.compress(first[len(first) // 2:])
    status, _, answer = post(receiver.url, body, JS, "gzip")
    assert status == 200 and json.loads(answer) == {}
    receiver.flush()
    assert len(spans_of(run_dir)) == 5
    assert main(["info", str(run_dir)]) == 0


def test_a_request_taken_by_two_receivers_is_read_once_before_any_compaction(run_dir, capsys):
    """A sender's retry can reach another receiver (two behind one address), or one started again
    after it forgot what it stored: both store the spans. `rltrace info` and `report`, the
    dashboard's data layer and the pyarrow reader of docs/scale.md each count every span once,
    with no `rltrace compact`; spans only one part holds are read as stored."""
    from rltrace.ui import data, runs

    from ..store.test_other_engines import documented_reader

    body = proto_request(40, "resender")
    with Receiver(run_dir, "127.0.0.1", 0) as a, Receiver(run_dir, "127.0.0.1", 0) as b:
        assert post(a.url, body, PB)[0] == 200
        assert post(b.url, body, PB)[0] == 200  # the first answer was lost: the retry went to b
        assert post(a.url, proto_request(7, "resender"), PB)[0] == 200
    r = Receiver(run_dir, "127.0.0.1", 0)
    r.seen = receiver_module.Seen()  # started again, and remembers nothing of what it stored
    with r:
        assert post(r.url, body, PB)[0] == 200
    assert len(spans_of(run_dir)) == 3 * 40 + 7  # every file read: each copy
    assert info(str(run_dir))["spans"]["finished"] == 47
    assert main(["report", str(run_dir), "--json"]) == 0
    assert sum(p["spans"] for p in json.loads(capsys.readouterr().out)["phases"]) == 47
    ref = runs.RunRef(str(run_dir), runs.fingerprint(str(run_dir)))
    assert data.info(ref)["spans"] == 47
    assert sum(p["spans"] for p in data.report(ref, None)["phases"]) == 47
    read = documented_reader(run_dir)
    assert read.num_rows == len(set(zip(read["trace_id"].to_pylist(), read["span_id"].to_pylist()))) == 47
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (47, 47)
    if importlib.util.find_spec("pyspark"):  # Spark's reader of rltrace's data source, called as Spark calls it
        from rltrace.store.spark import SpansSource

        reader = SpansSource({"path": str(run_dir)}).reader(None)
        assert sum(b.num_rows for p in reader.partitions() for b in reader.read(p)) == 47
    assert main(["compact", str(run_dir)]) == 0  # compaction writes what readers read
    assert len(spans_of(run_dir)) == 47
