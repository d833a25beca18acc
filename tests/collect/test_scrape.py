"""`rltrace collect --scrape`: engines' Prometheus /metrics into the run, and the report's prefix-cache
figure from vLLM's counters. The page is written by prometheus_client itself under vLLM's metric names
(vllm/v1/metrics/loggers.py: counters with `model_name` and `engine` labels)."""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import prometheus_client
import pytest

from rltrace.analysis.serving import COUNTERS_KIND
from rltrace.cli.report import collect as report
from rltrace.collect.scrape import Scraper, parse
from rltrace.store import layout


class Engine:
    """A loopback /metrics endpoint with vLLM's prefix-cache counters, two data-parallel engines."""

    def __init__(self):
        self.registry = prometheus_client.CollectorRegistry()
        labels = ["model_name", "engine"]
        self.queries = prometheus_client.Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                                 "queried tokens.", labels, registry=self.registry)
        self.hits = prometheus_client.Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                              "tokens.", labels, registry=self.registry)
        self.usage = prometheus_client.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", labels, registry=self.registry)
        self.other = prometheus_client.Counter("vllm:unrelated_thing", "not kept", registry=self.registry)
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = prometheus_client.generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, engine: str, queries: int, hits: int, usage: float) -> None:
        self.queries.labels("m", engine).inc(queries)
        self.hits.labels("m", engine).inc(hits)
        self.usage.labels("m", engine).set(usage)


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/metrics"


def test_scraped_vllm_counters_give_the_reports_prefix_cache_figure(tmp_path, caplog):
    run = tmp_path / "run"
    run_id = layout.create_or_join(run, run_name=None, config=None)["run_id"]
    engine, dead = Engine(), _closed_port_url()
    try:
        engine.serve("0", 0, 0, 0.0)
        engine.serve("1", 0, 0, 0.0)
        scraper = Scraper(run, run_id, [engine.url, dead], every=60, timeout=1)
        with caplog.at_level(logging.WARNING, logger="rltrace.collect.scrape"):
            scraper.scrape_once()  # the baseline: what the engines counted before the run is not the run's
            engine.serve("0", 1000, 250, 0.3)
            engine.serve("1", 3000, 150, 0.5)
            scraper.scrape_once()
            engine.serve("0", 1000, 600, 0.4)
            scraper.scrape_once()
    finally:
        engine.server.shutdown()
    assert scraper.scrapes[engine.url] == 3
    assert scraper.failed[dead] == 3  # counted every time, said once, never raised
    assert sum(dead in r.getMessage() for r in caplog.records) == 1

    s = report(str(run))["serving"]
    p = s["prefix_cache"]
    assert p["kind"] == COUNTERS_KIND
    assert p["prompt_tokens"] == 5000 and p["cached_tokens"] == 1000
    assert p["hit_rate"] == pytest.approx(1000 / 5000)
    assert "prefix_cache.hit_rate_within_version" in s["missing"]
    from rltrace.report.serving_findings import sentences

    said = [t for t in sentences({"serving": s}) if t.startswith("Prefix cache")]
    assert said == ["Prefix cache: 20% of 5,000 queried prompt tokens hit, measured (Prometheus, vllm:prefix_cache_hits); "
                    "the counters do not tell stale hits apart."]
    last = {(m["engine"], m["name"]): m["value"] for m in s["engine_metrics"] if m["endpoint"] == engine.url}
    assert last[(0, "vllm:kv_cache_usage_perc")] == 0.4 and last[(1, "vllm:kv_cache_usage_perc")] == 0.5
    assert last[(0, "vllm:prefix_cache_hits")] == 850
    assert not any(name == "vllm:unrelated_thing" for _, name in last)


def test_a_counter_reset_is_an_engine_restart_and_bad_pages_are_counted(tmp_path):
    from rltrace.analysis.serving import counter_increase
    import pandas as pd

    m = pd.DataFrame({"endpoint": ["u"] * 4, "engine": [0] * 4, "name": ["vllm:prefix_cache_hits"] * 4,
                      "value": [10.0, 30.0, 5.0, 8.0], "time_ns": [1, 2, 3, 4]})
    assert counter_increase(m, "vllm:prefix_cache_hits") == 20 + 5 + 3
    assert counter_increase(m, "vllm:prefix_cache_queries") is None
    assert parse("# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine=\"2\"} 7\n"
                 "sglang:num_queue_reqs 3\n") == [("vllm:num_preemptions", 2, 7.0), ("sglang:num_queue_reqs", None, 3.0)]
    run = tmp_path / "run"
    run_id = layout.create_or_join(run, run_name=None, config=None)["run_id"]

    class Garbage(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b"this is { not prometheus\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        scraper = Scraper(run, run_id, [url], every=60, timeout=1)
        scraper.scrape_once()
    finally:
        server.shutdown()
    assert scraper.failed[url] == 1 and scraper.rows == 0


def test_counters_split_by_the_weight_version_in_force_at_each_scrape(tmp_path):
    import rltrace

    run = tmp_path / "run"
    rltrace.init(run, role="trainer")
    run_id = layout.read_manifest(run)["run_id"]
    engine = Engine()
    try:
        scraper = Scraper(run, run_id, [engine.url], every=60, timeout=1)
        engine.serve("0", 0, 0, 0.0)
        scraper.scrape_once()
        with rltrace.phase("weight_sync", step=1, weight_version=1):
            pass
        engine.serve("0", 2000, 1000, 0.1)  # version 1: 50 %
        scraper.scrape_once()
        with rltrace.phase("weight_sync", step=2, weight_version=2):
            pass
        engine.serve("0", 3000, 300, 0.1)  # version 2: 10 %
        scraper.scrape_once()
    finally:
        engine.server.shutdown()
        rltrace.shutdown()
    p = report(str(run))["serving"]["prefix_cache"]
    assert p["hit_rate"] == pytest.approx(1300 / 5000) and p["versions_known"]
    assert [(v["weight_version"], v["prompt_tokens"], v["cached_tokens"]) for v in p["per_version"]] == \
        [(1, 2000, 1000), (2, 3000, 300)]
