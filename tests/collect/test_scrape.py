"""`rltrace collect --scrape`: engines' Prometheus /metrics into the run, and the report's engine figures
from them. Every page here is written by the engine's **own** metrics code (vLLM 0.34.0's
`PrometheusStatLogger`, SGLang 0.5.23's `SchedulerMetricsCollector` / `TokenizerMetricsCollector`,
loaded from ../shared/engine_src by tests/engine_code.py in tests/collect/engine_own_metrics.py, a
process of its own with a start-up timeout) fed the engine's own stats objects; the answers are
known from the requests fed."""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace.analysis.serving import COUNTERS_KIND, SGLANG_COUNTERS_KIND, counter_increase
from rltrace.cli.report import collect as report
from rltrace.collect.scrape import Scraper, parse, read_page, well_formed
from rltrace.report.serving_findings import sentences
from rltrace.store import layout

from .. import engine_code
from ..conftest import PYTHON, python_env, unavailable

DRIVER = Path(__file__).with_name("engine_own_metrics.py")
START_S = 30  # the engine's metrics code loads in well under a second; a hang fails here, not the suite
GIB = 1 << 30


class OwnEngine:
    """An engine process whose /metrics page its own metrics code writes (engine_own_metrics.py)."""

    def __init__(self, engine: str, engines: int = 1):
        if engine_code.missing(engine):
            unavailable(engine_code.missing(engine))
        self.proc = subprocess.Popen([PYTHON, str(DRIVER), engine, str(engines)], env=python_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("URL "):
            self.close()
            pytest.fail(f"{engine}'s metrics code did not start in {START_S} s: {self.proc.stderr.read()[-3000:]}")
        self.url = line.split()[1]

    def _post(self, path: str, events) -> None:
        req = urllib.request.Request(self.url.removesuffix("/metrics") + path, data=json.dumps(events).encode(),
                                     method="POST")
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except urllib.error.HTTPError as exc:  # the engine's code raised: its traceback
            pytest.fail(exc.read().decode())

    def record(self, *events: dict) -> None:
        self._post("/record", list(events))

    def restart(self, *events: dict) -> None:
        """The engine starts again: its metric objects built anew, its counters from 0."""
        self._post("/restart", list(events))

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/metrics"


def _serve(body) -> tuple[HTTPServer, str]:
    """A loopback endpoint answering GET with body() (bytes)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            page = body()
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def _last(s: dict, url: str) -> dict:
    return {(m["engine"], m["name"]): m for m in s["engine_metrics"] if m["endpoint"] == url}


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    rltrace.init(run, role="trainer")
    yield run, layout.read_manifest(run)["run_id"]
    rltrace.shutdown()


def test_vllm_two_engines_prefix_cache_kv_usage_queue_and_an_unreachable_endpoint(run, caplog):
    """Two data-parallel engines of one vLLM logger: its prefix-cache counters give the report's figure
    (hits / queries over the run, what the engines counted before the first scrape left out); its
    kv_cache_usage_perc, a 0-1 fraction, is shown as a percentage; num_requests_waiting counts the
    deferred requests too; an unreachable endpoint is counted on every scrape and said once."""
    run_dir, run_id = run
    dead = _closed_port_url()
    with OwnEngine("vllm", engines=2) as engine:
        engine.record({"engine": 0, "requests": [[700, 700]]})  # before the run: not the run's
        scraper = Scraper(run_dir, run_id, [engine.url, dead], every=60, timeout=1)
        with caplog.at_level(logging.WARNING, logger="rltrace.collect.scrape"):
            scraper.scrape_once()
            engine.record({"engine": 0, "requests": [[600, 250], [400, 0]], "kv_usage": 0.3, "running": 2,
                           "waiting": 1, "deferred": 1, "preempted": 1},
                          {"engine": 1, "requests": [[3000, 150]], "kv_usage": 0.5, "running": 4})
            scraper.scrape_once()
            engine.record({"engine": 0, "requests": [[1000, 600]], "kv_usage": 0.42, "running": 1, "waiting": 2})
            scraper.scrape_once()
    assert scraper.scrapes[engine.url] == 3 and scraper.failed[dead] == 3  # counted every time, never raised
    assert sum(dead in r.getMessage() for r in caplog.records) == 1  # said once
    assert scraper.bad_lines[engine.url] == 0

    s = report(str(run_dir))["serving"]
    p = s["prefix_cache"]
    assert p["kind"] == COUNTERS_KIND
    assert (p["prompt_tokens"], p["cached_tokens"]) == (5000, 1000) and p["hit_rate"] == pytest.approx(0.2)
    said = [t for t in sentences({"serving": s}) if t.startswith("Prefix cache")]
    assert said == ["Prefix cache: 20% of 5,000 queried prompt tokens hit, measured (Prometheus, vllm:prefix_cache_hits); "
                    "the counters do not tell stale hits apart."]
    last = _last(s, engine.url)
    assert last[(0, "vllm:kv_cache_usage_perc")]["value"] == pytest.approx(0.42)
    assert last[(0, "vllm:kv_cache_usage_perc")]["percent"] == pytest.approx(42.0)  # not 0.42 %
    assert last[(1, "vllm:kv_cache_usage_perc")]["percent"] == pytest.approx(50.0)
    assert last[(0, "vllm:num_requests_waiting")]["value"] == 2 and last[(0, "vllm:num_requests_running")]["value"] == 1
    assert last[(0, "vllm:num_preemptions")]["value"] == 1 and last[(0, "vllm:num_requests_running")]["percent"] is None
    assert last[(0, "vllm:prefix_cache_hits")]["value"] == 700 + 850  # the counter as the engine counted it
    assert {name for _, name in last} <= {"vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                                          "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
                                          "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                                          "vllm:num_requests_waiting", "vllm:num_preemptions"}
    assert s["kv_transfer_metrics"] is None


def test_vllm_counters_split_by_weight_version_through_an_engine_restart(run):
    """Each scrape's rise goes to the weight version in force; the engine restarts during version 2
    (its counters begin again from 0, 3,000 -> 2,000): the drop is a restart, the 2,000 new tokens
    are counted, never a negative rise."""
    run_dir, run_id = run
    with OwnEngine("vllm") as engine:
        scraper = Scraper(run_dir, run_id, [engine.url], every=60, timeout=1)
        scraper.scrape_once()
        with rltrace.phase("weight_sync", step=1, weight_version=1):
            pass
        engine.record({"requests": [[2000, 1000]]})  # version 1: 50 %
        scraper.scrape_once()
        with rltrace.phase("weight_sync", step=2, weight_version=2):
            pass
        engine.record({"requests": [[1000, 100]]})
        scraper.scrape_once()
        engine.restart({"requests": [[2000, 200]]})
        scraper.scrape_once()
    rltrace.shutdown()  # the trainer's spans (its weight syncs) written
    s = report(str(run_dir))["serving"]
    p = s["prefix_cache"]
    assert (p["prompt_tokens"], p["cached_tokens"]) == (5000, 1300) and p["versions_known"]
    assert [(v["weight_version"], v["prompt_tokens"], v["cached_tokens"]) for v in p["per_version"]] == \
        [(1, 2000, 1000), (2, 3000, 300)]
    said = [t for t in sentences({"serving": s}) if t.startswith("Prefix cache")]
    assert said == ["Prefix cache: 26% of 5,000 queried prompt tokens hit, measured (Prometheus, vllm:prefix_cache_hits) "
                    "(by weight version: v1 50%, v2 10%); the counters do not tell stale hits apart."]


def test_sglang_priority_totals_cached_tokens_by_version_and_kv_transfers(run):
    """SGLang with priority scheduling: its queue gauges' priority="" total is kept, never summed with
    the per-priority parts (3 running, not 6); the tokenizer's cached_tokens_total / prompt_tokens_total
    (labelled per request's priority, series created at the first increment) give the prefix-cache
    figure per weight version; the KV-transfer histograms' _sum and _count give 2 transfers, 1.5 GiB
    in 1 s: 1.5 GiB/s."""
    run_dir, run_id = run
    with OwnEngine("sglang") as engine:
        scraper = Scraper(run_dir, run_id, [engine.url], every=60, timeout=1)
        scraper.scrape_once()  # nothing logged yet: the page holds no kept series, `up` is the baseline
        with rltrace.phase("weight_sync", step=1, weight_version=1):
            pass
        engine.record({"running": {"0": 2, "5": 1}, "queue": {"0": 4, "5": 2}, "token_usage": 0.25,
                       "finished": [[1000, 250, None], [2000, 0, 5]],
                       "kv_transfers": [[GIB, 0.5], [GIB // 2, 0.5]]})
        scraper.scrape_once()
        first = {name: v for name, _, v in parse(urllib.request.urlopen(engine.url, timeout=5).read().decode())}
        with rltrace.phase("weight_sync", step=2, weight_version=2):
            pass
        engine.record({"running": {"0": 1}, "token_usage": 0.4, "finished": [[1000, 900, 5]]})
        scraper.scrape_once()
    rltrace.shutdown()
    assert first["sglang:num_running_reqs"] == 3 and first["sglang:num_queue_reqs"] == 6  # not 6 and 12
    s = report(str(run_dir))["serving"]
    p = s["prefix_cache"]
    assert p["kind"] == SGLANG_COUNTERS_KIND
    assert (p["prompt_tokens"], p["cached_tokens"]) == (4000, 1150)
    assert [(v["weight_version"], v["prompt_tokens"], v["cached_tokens"]) for v in p["per_version"]] == \
        [(1, 3000, 250), (2, 1000, 900)]
    last = _last(s, engine.url)
    assert last[(None, "sglang:num_running_reqs")]["value"] == 1 and last[(None, "sglang:num_queue_reqs")]["value"] == 0
    assert last[(None, "sglang:token_usage")]["percent"] == pytest.approx(40.0)
    kv = s["kv_transfer_metrics"]
    assert kv["transfers"] == 2 and kv["bytes"] == 1.5 * GIB and kv["seconds"] == pytest.approx(1.0)
    assert kv["bandwidth"] == pytest.approx(1.5 * GIB) and kv["latency_ms_mean"] == pytest.approx(500.0)
    said = sentences({"serving": s})
    assert "Prefix cache: 29% of 4,000 queried prompt tokens hit, measured (Prometheus, sglang:cached_tokens_total) " \
           "(by weight version: v1 8%, v2 90%); the counters do not tell stale hits apart." in said
    assert any(t.startswith("KV transfers: 2 moved ") and "500.0 ms each" in t for t in said)
    assert p["stale_hit_count"] is None and p["stale_cached_tokens"] is None  # counters cannot tell: not 0
    # the link `whatif --pd` replays is the report's: the engines' counters when no span records a transfer
    from rltrace import store
    from rltrace.analysis import serving

    assert serving.kv_link_bandwidth(store.open(run_dir)) == (pytest.approx(1.5 * GIB),
                                                               "measured (Prometheus, sglang:kv_transfer_*)")


def test_a_malformed_line_costs_that_line_only(run):
    """The engine's page with one malformed line spliced in: every other value is kept, the line is
    counted; a page with nothing Prometheus in it is a failed scrape."""
    run_dir, run_id = run
    with OwnEngine("vllm") as engine:
        engine.record({"requests": [[1000, 400]], "kv_usage": 0.2})

        def broken():
            page = urllib.request.urlopen(engine.url, timeout=5).read()
            return page.replace(b"# HELP vllm:kv_cache_usage_perc", b"vllm:oops{engine=\"0\" 12\n# HELP vllm:kv_cache_usage_perc")

        server, url = _serve(broken)
        garbage, junk_url = _serve(lambda: b"<html>this is { not prometheus</html>\n")
        try:
            scraper = Scraper(run_dir, run_id, [url, junk_url], every=60, timeout=1)
            scraper.scrape_once()
            scraper.scrape_once()
            direct = sorted(parse(urllib.request.urlopen(engine.url, timeout=5).read().decode()))
            broken_page, bad = well_formed(broken().decode())
        finally:
            server.shutdown()
            garbage.shutdown()
    assert bad == 1 and sorted(parse(broken_page)) == direct
    assert scraper.bad_lines[url] == 2 and scraper.scrapes[url] == 2 and scraper.failed[url] == 0
    assert scraper.failed[junk_url] == 2 and scraper.scrapes[junk_url] == 0
    last = _last(report(str(run_dir))["serving"], url)
    assert last[(0, "vllm:kv_cache_usage_perc")]["percent"] == pytest.approx(20.0)
    assert last[(0, "vllm:prefix_cache_hits")]["value"] == 400


def test_counter_rises_restart_and_late_series():
    """The rule on its own: a drop is a restart (the new value is the rise); a series first seen after
    the endpoint's first page began from 0."""
    import pandas as pd

    m = pd.DataFrame({"endpoint": ["u"] * 5, "engine": [None, 0, 0, 0, 0],
                      "name": ["up", "vllm:prefix_cache_hits", "vllm:prefix_cache_hits", "vllm:prefix_cache_hits",
                               "vllm:prefix_cache_hits"],
                      "value": [1.0, 10.0, 30.0, 5.0, 8.0], "time_ns": [0, 1, 2, 3, 4]})
    assert counter_increase(m, "vllm:prefix_cache_hits") == 10 + 20 + 5 + 3
    assert counter_increase(m[m["name"] != "up"], "vllm:prefix_cache_hits") == 20 + 5 + 3  # an older run: no `up`
    assert counter_increase(m, "vllm:prefix_cache_queries") is None
    assert parse('sglang:num_queue_reqs{priority="",dp_rank="1"} 3\nsglang:num_queue_reqs{priority="2",dp_rank="1"} 3\n'
                 "sglang:kv_transfer_latency_ms_sum 20\n") == \
        [("sglang:num_queue_reqs", 1, 3.0), ("sglang:kv_transfer_latency_ms_sum", None, 20.0)]


def test_closing_reads_every_endpoint_once_more_and_merges_the_parts(run):
    """`rltrace collect` stopped at the end of a run: what the engines counted since the last periodic
    scrape is read by one last scrape, not lost; an engine already gone by then is no failure. A scrape
    of two endpoints, one of two data-parallel engines, is one part (not one per engine: an hour of
    8 engines every 5 s made 6,480 files for the report to read), and the scraper merges its parts
    when it closes, as a writer does at exit."""
    run_dir, run_id = run
    dead = _closed_port_url()
    with OwnEngine("vllm", engines=2) as engine, OwnEngine("sglang") as sglang:
        sglang.record({"token_usage": 0.3})
        scraper = Scraper(run_dir, run_id, [engine.url, sglang.url, dead], every=60, timeout=1)
        scraper.start()  # reads each endpoint at once (the baseline), then every 60 s
        deadline = time.monotonic() + 10
        while scraper.scrapes[engine.url] + scraper.failed[dead] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        scraper.scrape_once()
        assert len(list((run_dir / "metrics").glob("*.parquet"))) == 2  # one part per scrape
        engine.record({"engine": 1, "requests": [[2000, 500]]})
        scraper.close()
    assert scraper.scrapes[engine.url] == 3 and scraper.failed[dead] == 2  # the last read of a gone engine: not counted
    assert len(list((run_dir / "metrics").glob("*.parquet"))) == 1
    s = report(str(run_dir))["serving"]
    assert (s["prefix_cache"]["prompt_tokens"], s["prefix_cache"]["cached_tokens"]) == (2000, 500)
    assert {(m["endpoint"], m["engine"]) for m in s["engine_metrics"]} == {
        (engine.url, 0), (engine.url, 1), (sglang.url, None)}


def test_rltrace_collect_scrape_then_rltrace_report(run):
    """As docs/collect.md says: `rltrace collect RUN --scrape URL…` (a process of its own) beside a
    traced trainer, one endpoint vLLM's own metrics code, one that nothing answers; then `rltrace
    report RUN` gives the prefix-cache figure from the counters per weight version. The unreachable
    endpoint costs one line on stderr, however often it fails; spans and metrics are still recorded."""
    from .test_receiver import otlp_json

    run_dir, _ = run
    dead = _closed_port_url()
    with OwnEngine("vllm") as engine:
        engine.record({"requests": [[700, 700]]})  # counted before collect started: not the run's
        collect = subprocess.Popen([PYTHON, "-m", "rltrace", "collect", str(run_dir), "--listen", "127.0.0.1:0",
                                    "--scrape", engine.url, dead, "--scrape-every", "0.1"],
                                   env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([collect.stdout], [], [], START_S)
            line = collect.stdout.readline() if ready else ""
            assert "receiving OTLP/HTTP at http://127.0.0.1:" in line, collect.stderr.read() if not ready else line
            receiver_url = line.split(" at ")[1].split()[0]

            def scraped_after(t_ns: int) -> None:  # a scrape that began after t_ns is stored
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    for f in (run_dir / "metrics").glob("engine-metrics-*.parquet"):  # flush parts and merged ones
                        try:
                            if max(pq.read_table(f, columns=["time_ns"])["time_ns"].to_pylist(), default=0) > t_ns:
                                return
                        except OSError:  # merged away as it was listed
                            pass
                    time.sleep(0.02)
                pytest.fail("no scrape stored within 10 s")

            scraped_after(0)
            for version, requests in ((1, [[2000, 1000]]), (2, [[1000, 100]])):
                with rltrace.phase("weight_sync", step=version, weight_version=version):
                    pass
                engine.record({"requests": requests})
                scraped_after(time.time_ns())
            urllib.request.urlopen(urllib.request.Request(  # a span over OTLP, while one endpoint keeps failing
                receiver_url, data=json.dumps(otlp_json(2)).encode(), headers={"Content-Type": "application/json"}),
                timeout=10).read()
        finally:
            collect.terminate()  # SIGTERM, as Ctrl-C
            out, err = collect.communicate(timeout=60)
    rltrace.shutdown()
    assert collect.returncode == 0, err
    (said,) = [e for e in err.splitlines() if e.strip()]  # one line, no traceback
    assert said.startswith(f"rltrace collect: cannot scrape {dead} (<urlopen error ") and \
        said.endswith("refused>); counting further failures")
    summary = next(t for t in out.splitlines() if "/metrics pages" in t)
    pages, failed = int(summary.split("scraped ")[1].split()[0]), int(summary.split(", ")[-1].split()[0])
    assert pages >= 3 and failed >= 3 and summary.endswith(f"from 2 endpoints, {failed} scrapes failed")
    assert "stopped; 2 spans written from 1 senders" in out

    done = subprocess.run([PYTHON, "-m", "rltrace", "report", str(run_dir)], env=python_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # the report wraps its lines to the terminal
    assert ("Prefix cache: 37% of 3,000 queried prompt tokens hit, measured (Prometheus, vllm:prefix_cache_hits) "
            "(by weight version: v1 50%, v2 10%); the counters do not tell stale hits apart.") in text


def test_a_well_formed_page_is_parsed_once(monkeypatch):
    """The usual page costs one pass of the Prometheus parser (a scrape's whole cost: 143 kB for 8 vLLM
    engines, ~70 ms); a page with a malformed line is parsed again without it."""
    import prometheus_client.parser as prom

    calls = []
    real = prom.text_string_to_metric_families

    def counted(text):
        calls.append(len(text))
        return real(text)

    monkeypatch.setattr(prom, "text_string_to_metric_families", counted)
    page = 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 5\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    assert read_page(page) == ([("vllm:prefix_cache_hits", 0, 5.0), ("vllm:kv_cache_usage_perc", 0, 0.5)], 0)
    assert len(calls) == 1
    samples, bad = read_page(page + 'vllm:oops{engine="0" 12\n')
    assert (samples, bad) == ([("vllm:prefix_cache_hits", 0, 5.0), ("vllm:kv_cache_usage_perc", 0, 0.5)], 1)
    with pytest.raises(ValueError, match="not Prometheus text"):
        read_page("<html>this is { not prometheus</html>\n")


def test_scraped_metrics_joined_to_steps(run):
    """Each scrape goes to the step whose rollout began last before it: the prefix-cache counters per
    step (2,000 tokens queried in each step, 800 then 0 hit), each gauge's peak over one engine (KV usage
    60 % in step 1 on engine 1, a 0-1 fraction shown x100), each counter's rise (1 preemption in step 1,
    none in step 2); the scrape before the first rollout is the baseline, in no step."""
    run_dir, run_id = run
    with OwnEngine("vllm", engines=2) as engine:
        scraper = Scraper(run_dir, run_id, [engine.url], every=60, timeout=1)
        scraper.scrape_once()
        with rltrace.phase("rollout", step=1):
            engine.record({"engine": 0, "requests": [[1000, 200]], "kv_usage": 0.3, "preempted": 1},
                          {"engine": 1, "kv_usage": 0.6})
            scraper.scrape_once()
            engine.record({"engine": 0, "requests": [[1000, 600]], "kv_usage": 0.5}, {"engine": 1, "kv_usage": 0.1})
            scraper.scrape_once()
        with rltrace.phase("rollout", step=2):
            engine.record({"engine": 1, "requests": [[2000, 0]], "kv_usage": 0.2, "waiting": 3})
            scraper.scrape_once()
        scraper.close()
    rltrace.shutdown()
    s = report(str(run_dir))["serving"]
    assert [(v["step"], v["prompt_tokens"], v["cached_tokens"]) for v in s["prefix_cache"]["per_step"]] == \
        [(1, 2000, 800), (2, 2000, 0)]
    by = {(r["step"], r["name"]): r for r in s["engine_metrics_by_step"]}
    assert (by[1, "vllm:kv_cache_usage_perc"]["peak"], by[1, "vllm:kv_cache_usage_perc"]["percent"]) == (0.6, 60.0)
    assert by[2, "vllm:kv_cache_usage_perc"]["peak"] == 0.5  # engine 0 still holds half its blocks
    assert (by[1, "vllm:num_preemptions"]["rise"], by[2, "vllm:num_preemptions"]["rise"]) == (1, 0)
    assert by[1, "vllm:prefix_cache_hits"]["rise"] == 800 and by[1, "vllm:prefix_cache_hits"]["peak"] is None
    assert (by[1, "vllm:num_requests_waiting"]["peak"], by[2, "vllm:num_requests_waiting"]["peak"]) == (0, 3)
    assert {step for step, _ in by} == {1, 2}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_counters_and_gauges_are_read_as_the_engines_declare_them(engine):
    """Every kept family is summed per step as a counter exactly when the engine's own code declares it
    a counter or a histogram (its # TYPE line), and taken at its peak when it declares a gauge."""
    from prometheus_client.parser import text_string_to_metric_families

    from rltrace.analysis.serving import SCRAPED_COUNTERS
    from rltrace.collect.scrape import HISTOGRAMS, KEPT

    with OwnEngine(engine) as own:
        own.record({"requests": [[100, 10]], "kv_usage": 0.1, "preempted": 1} if engine == "vllm" else
                   {"running": {"0": 1}, "queue": {"0": 1}, "retracted": [1, 10, 10], "kv_transfers": [[GIB, 0.5]],
                    "finished": [[100, 10, None]]})
        page = urllib.request.urlopen(own.url, timeout=5).read().decode()
    declared = {}
    for family in text_string_to_metric_families(page):
        name = family.name if family.name in KEPT else family.name.removesuffix("_total")
        if name in KEPT:
            declared[name] = family.type
    assert len(declared) >= 8 and set(declared) <= KEPT
    for name, kind in declared.items():
        if name in HISTOGRAMS:
            assert kind == "histogram" and {f"{name}_sum", f"{name}_count"} <= SCRAPED_COUNTERS
        else:
            assert kind in ("counter", "gauge") and (name in SCRAPED_COUNTERS) == (kind == "counter"), (name, kind)


def test_kv_transfers_without_a_scraped_histogram_say_not_recorded():
    """SGLang's KV transfers where the total_mb histogram was never scraped: the bytes and bandwidth are
    None and read "not recorded", never "moved 0 B"; without the latency sum, no "0.0 ms" either."""
    import pandas as pd

    from rltrace.analysis.serving import kv_transfer_counters
    from rltrace.report.serving_findings import sentences

    def frame(names):
        return pd.DataFrame([{"endpoint": "http://e", "engine": None, "name": n, "value": v, "time_ns": t}
                             for t, vals in ((1, 0.0), (2, 1.0)) for n, v in ((m, vals * k) for m, k in names)])

    kv = kv_transfer_counters(frame([("sglang:kv_transfer_latency_ms_count", 2), ("sglang:kv_transfer_latency_ms_sum", 900)]))
    assert (kv["transfers"], kv["bytes"], kv["bandwidth"]) == (2, None, None)
    assert kv["latency_ms_mean"] == pytest.approx(450.0)
    (said,) = [t for t in sentences({"serving": {"kv_transfer_metrics": kv}}) if t.startswith("KV transfers")]
    assert "bytes not recorded" in said and "0 B" not in said and "450.0 ms each on average" in said
    kv = kv_transfer_counters(frame([("sglang:kv_transfer_latency_ms_count", 2)]))
    assert (kv["seconds"], kv["latency_ms_mean"]) == (None, None)
    (said,) = [t for t in sentences({"serving": {"kv_transfer_metrics": kv}}) if t.startswith("KV transfers")]
    assert "latency not recorded" in said and " ms each" not in said
