"""`rltrace collect --scrape URL`: poll engines' Prometheus /metrics into the run's `metrics` table.

vLLM puts no cached tokens on its request spans; its prefix-cache figures exist only as counters
on /metrics. Each scrape keeps the engine metrics named below (the names vLLM 0.34 and SGLang
0.5.23 register) as `metrics` rows with the scrape's time and no step: they join to steps and
weight versions by time. The endpoint is the engine's identity (`host` = the URL; `rank` = the
`engine` label vLLM gives each data-parallel engine, SGLang's `dp_rank`). An endpoint that cannot be
read is counted and said once, never raised: the scraper runs beside the receiver and must not stop
it; a malformed line costs that line only (counted in `bad_lines`).
"""

from __future__ import annotations

import logging
import threading
import time
import types
import urllib.request
import uuid
from collections import Counter

import pyarrow as pa

from rltrace import _names
from rltrace._config import resolve
from rltrace.store.merge import Merger
from rltrace.store.parts import write_part
from rltrace.store.writer import ProcessInfo

logger = logging.getLogger(__name__)

ROLE = "engine-metrics"  # the process role of scraped rows: how the report finds them
#: metric families kept (counters without their `_total` suffix, as the parser names families);
#: what each one means, per engine version: docs/analysis.md, "Engine metrics"
KEPT = frozenset({
    # vLLM 0.34 (vllm/v1/metrics/loggers.py, PrometheusStatLogger)
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:num_preemptions",
    # SGLang 0.5.23 (sglang/srt/observability/metrics_collector.py): the scheduler's ...
    "sglang:cache_hit_rate", "sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs",
    "sglang:num_retracted_reqs", "sglang:num_retracted_requests", "sglang:kv_transfer_speed_gb_s",
    "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_total_mb",
    # ... and the tokenizer's (per finished request: its prefix-cache figure is cached / prompt tokens)
    "sglang:cached_tokens", "sglang:prompt_tokens",
})
#: histograms: their `_sum` and `_count` are kept (as NAME_sum, NAME_count), never their buckets
HISTOGRAMS = frozenset({"sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_total_mb"})
#: SGLang's queue gauges (`_log_gauge_queue_count`): with priority scheduling the total is the
#: series `priority=""` and each `priority="N"` series a part of it, so only the total is kept
PRIORITY_TOTALS = frozenset({"sglang:num_running_reqs", "sglang:num_queue_reqs"})
#: the label naming one engine of an endpoint: vLLM's data-parallel `engine`, SGLang's `dp_rank`
ENGINE_LABELS = ("engine", "dp_rank")
DEFAULT_EVERY_S = 5.0
#: one row per page read (value 1, no engine), as Prometheus records `up`: the first one is the
#: endpoint's baseline, whether or not the page had a kept metric yet
UP = "up"


def _family_of(name: str) -> str | None:
    """The kept family a sample of an untyped page (no `# TYPE`) belongs to, or None."""
    for suffix in ("_total", "_sum", "_count", ""):
        if name.endswith(suffix) and name[:len(name) - len(suffix)] in KEPT:
            return name[:len(name) - len(suffix)]
    return None


def well_formed(text: str) -> tuple[str, int]:
    """(the page without the lines the Prometheus text parser rejects, how many it dropped): a malformed
    line costs that line only. The whole page is tried first; lines are tried one by one only when it fails."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for _ in text_string_to_metric_families(text):
            pass
        return text, 0
    except Exception:
        pass
    kept, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            for _ in text_string_to_metric_families(line + "\n"):
                pass
            kept.append(line)
        except Exception:
            bad += 1
    return "\n".join(kept) + "\n", bad


def parse(text: str) -> list[tuple[str, int | None, float]]:
    """(metric name, engine or None, value) for each kept family of one well-formed /metrics page.
    Label sets other than the engine's are summed (vLLM's model_name, SGLang's cache_source, is_streaming
    and the tokenizer's per-request `priority`), except SGLang's queue gauges, whose `priority=""` series
    is already the total; histograms give NAME_sum and NAME_count."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter = Counter()
    for family in text_string_to_metric_families(text):
        name = family.name if family.name in KEPT else _family_of(family.name)
        if name is None:
            continue
        for s in family.samples:
            if s.name.endswith(("_created", "_bucket", "_gsum", "_gcount")):
                continue
            if name in HISTOGRAMS:
                if not s.name.endswith(("_sum", "_count")):
                    continue
                key = name + s.name[s.name.rindex("_"):]
            else:
                key = name
            if name in PRIORITY_TOTALS and s.labels.get("priority", "") != "":
                continue  # a part of the priority="" total
            engine = next((s.labels[k] for k in ENGINE_LABELS if k in s.labels), None)
            out[(key, int(engine) if engine is not None and engine.isdigit() else None)] += s.value
    return [(n, e, float(v)) for (n, e), v in out.items()]


def read_page(text: str) -> tuple[list[tuple[str, int | None, float]], int]:
    """(`parse` of the page, malformed lines dropped). A well-formed page (the usual one) is parsed once:
    checking it first and parsing it again doubled the cost of a scrape (a page of 8 vLLM engines,
    143 kB: ~70 ms of CPU per parse). Raises ValueError when no line of it is Prometheus text."""
    try:
        return parse(text), 0
    except Exception:
        pass
    page, bad = well_formed(text)
    if bad and not page.strip():
        raise ValueError(f"not Prometheus text ({bad} malformed lines)")
    return parse(page), bad


class Scraper:
    """One thread polling every URL each `every` seconds; `close()` stops it after one last scrape, so what
    the engines counted since the last periodic one is kept (an engine already gone by then is not a
    failure: engines usually stop before the collector)."""

    def __init__(self, run_dir, run_id: str, urls: list[str], every: float = DEFAULT_EVERY_S, timeout: float = 2.0):
        self.run_dir, self.run_id, self.urls, self.every, self.timeout = run_dir, run_id, list(urls), every, timeout
        self.scrapes: Counter = Counter()  # url -> pages read
        self.failed: Counter = Counter()  # url -> scrapes that could not be read
        self.bad_lines: Counter = Counter()  # url -> malformed lines dropped from pages that were read
        self.rows = 0
        self._said: set = set()
        self._processes: dict[tuple[str, int | None], ProcessInfo] = {}
        # one part per scrape, all endpoints and engines together, named after the scraper and merged by it
        # as a writer merges its own (a part per engine and scrape made a day's run ~10^5 files to read)
        self._writer = types.SimpleNamespace(process_id=f"{ROLE}-{uuid.uuid4().hex[:12]}")
        self._merger = Merger(run_dir, self._writer, enabled=resolve("merge_parts"), grace_s=resolve("merge_grace"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rltrace-scrape", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.timeout * len(self.urls) + 5)  # a scrape under way, then the last
        self._merger.close()  # every part left merged, as a writer does at exit

    def _run(self) -> None:
        while True:
            self.scrape_once()
            if self._stop.wait(self.every):
                self.scrape_once(last=True)
                return

    def scrape_once(self, last: bool = False) -> None:
        """Read every URL once and write what it kept (one part); failures are counted, never raised
        (`last`: the scrape at close, whose failures are neither counted nor said)."""
        kept: list[tuple[str, int, list]] = []
        for url in self.urls:
            now = time.time_ns()
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as r:  # noqa: S310 - the user's own endpoints
                    page = r.read().decode("utf-8", "replace")
                samples, bad = read_page(page)
            except Exception as exc:  # unreachable, not Prometheus text: counted and said once
                if last:
                    logger.debug("rltrace collect: last scrape of %s at close failed (%s)", url, exc)
                    continue
                self.failed[url] += 1
                if url not in self._said:
                    self._said.add(url)
                    logger.warning("rltrace collect: cannot scrape %s (%s); counting further failures", url, exc)
                continue
            self.scrapes[url] += 1
            if bad:
                self.bad_lines[url] += bad
                if ("lines", url) not in self._said:
                    self._said.add(("lines", url))
                    logger.warning("rltrace collect: %s gave %d malformed /metrics lines, dropped (the rest kept); "
                                   "counting further ones", url, bad)
            kept.append((url, now, samples + [(UP, None, 1.0)]))  # `up`: this scrape read the page
        if kept:
            self._write(kept)
        self._merger.tick()

    def _process(self, url: str, engine: int | None) -> ProcessInfo:
        key = (url, engine)
        if key not in self._processes:
            self._processes[key] = ProcessInfo(run_id=self.run_id, role=ROLE, rank=engine, service_name=url, host=url,
                                               pid=0, process_id=f"{ROLE}-{uuid.uuid4().hex[:12]}")
        return self._processes[key]

    def _write(self, pages: list[tuple[str, int, list]]) -> None:
        """One part holding each page's rows (url, scrape time, samples), each row under its endpoint and
        engine's process id; a part that cannot be written counts as a failed scrape of each endpoint."""
        cols: dict[str, list] = {k: [] for k in ("name", "value", "time_ns", "process_id", "rank", "host")}
        for url, now, samples in pages:
            for name, engine, value in samples:
                for k, v in zip(cols, (name, value, now, self._process(url, engine).process_id, engine, url)):
                    cols[k].append(v)
        n = len(cols["name"])
        table = pa.table({"step": pa.nulls(n, pa.int64()), "name": cols["name"],
                          "value": pa.array(cols["value"], pa.float64()), "time_ns": pa.array(cols["time_ns"], pa.int64()),
                          "process_id": cols["process_id"], "role": [ROLE] * n,
                          "rank": pa.array(cols["rank"], pa.int64()), "host": cols["host"],
                          "pid": pa.array([0] * n, pa.int64())}, schema=_names.METRICS_SCHEMA)
        try:
            self._merger.claim()
            path = write_part(self.run_dir / _names.METRICS_TABLE.folder,
                              f"{self._writer.process_id}-{pages[0][1]}.parquet", table, _names.METRICS_TABLE)
        except Exception as exc:  # a full disk: counted as a failed scrape, the next one tries again
            for url, _, _ in pages:
                self.failed[url] += 1
            logger.warning("rltrace collect: could not write scraped metrics of %s: %s",
                           ", ".join(u for u, _, _ in pages), exc)
            return
        self._merger.wrote(_names.METRICS_TABLE, path, n)
        self.rows += sum(name != UP for name in cols["name"])
