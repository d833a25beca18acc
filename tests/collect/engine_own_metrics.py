"""One engine's Prometheus /metrics written by the engine's **own** metrics code (tests/engine_code.py):
vLLM 0.34.0's `PrometheusStatLogger.record` fed `SchedulerStats` / `PrefixCacheStats` / `IterationStats`,
or SGLang 0.5.23's `SchedulerMetricsCollector` (built by its `init_new`, fed `SchedulerStats` /
`QueueCount` through `log_stats`, `increment_retracted_reqs`, `observe_kv_transfer_metrics`) and
`TokenizerMetricsCollector.observe_one_finished_request`, all into prometheus_client's default
registry, served over loopback HTTP as the engine's API server serves it.

Usage: python engine_own_metrics.py vllm|sglang [ENGINES]
ENGINES: vLLM's data-parallel engines of one logger (its `engine` label); SGLang runs one scheduler
per process (each DP rank its own), so one here.
Prints `URL http://127.0.0.1:PORT/metrics` once serving. GET /metrics: the page. POST /record with a
JSON list of events, applied in order through the engine's code (see `vllm_event` / `sglang_event`);
POST /restart: the engine's metric objects built again, as a restarted engine builds them (its
counters begin again from 0). An event that fails answers 500 with the traceback.

Stubs (the engines' files not in engine_src, each labelled where it is set): vLLM's
`create_metric_per_engine` and `histogram_buckets` (vllm/v1/metrics/utils.py, buckets.py), its
`FinishReason` and `CacheHitSource` enums, `envs.VLLM_COMPUTE_NANS_IN_LOGITS`; SGLang's runtime
context getters (`get_observability`, `get_parallel`, ...) and `DisaggregationMode.to_engine_type`.
"""

import enum
import json
import sys
import threading
import traceback
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import engine_code  # noqa: E402

import prometheus_client  # noqa: E402

engine = sys.argv[1]
ENGINES = int(sys.argv[2]) if len(sys.argv) > 2 else 1
engine_code.load(engine)
LOCK = threading.Lock()


# --- vLLM ----------------------------------------------------------------------------------------------
def vllm_setup():
    import vllm.envs
    import vllm.v1.engine
    import vllm.v1.metrics.buckets
    import vllm.v1.metrics.cache_hit_source
    import vllm.v1.metrics.utils

    vllm.envs.VLLM_COMPUTE_NANS_IN_LOGITS = False  # stub: the variable unset

    class FinishReason(enum.IntEnum):  # stub of vllm.v1.engine.FinishReason (its values and str)
        STOP = 0
        LENGTH = 1
        ABORT = 2
        ERROR = 3

        def __str__(self):
            return self.name.lower()

    class CacheHitSource(enum.Enum):  # stub of vllm.v1.metrics.cache_hit_source (the tiers loggers.py names)
        DEVICE = "device"
        HOST = "host"
        DISK = "disk"
        P2P = "p2p"
        EXTERNAL_UNSPECIFIED = "external_unspecified"

    def create_metric_per_engine(metric, per_engine_labelvalues):  # stub of vllm/v1/metrics/utils.py's
        return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}

    def histogram_buckets(name, max_model_len=None, overrides=None):  # stub: rltrace keeps no histogram of vLLM's
        return [1.0, 10.0, 100.0, 1000.0]

    vllm.v1.engine.FinishReason = FinishReason
    vllm.v1.metrics.cache_hit_source.CacheHitSource = CacheHitSource
    vllm.v1.metrics.utils.create_metric_per_engine = create_metric_per_engine
    vllm.v1.metrics.buckets.histogram_buckets = histogram_buckets

    from vllm.v1.metrics.loggers import PrometheusStatLogger

    observability = types.SimpleNamespace(show_hidden_metrics=False, kv_cache_metrics=False,
                                          custom_histogram_buckets=None)
    config = types.SimpleNamespace(observability_config=observability, speculative_config=None,
                                   kv_transfer_config=None, watermark_config=None, lora_config=None,
                                   model_config=types.SimpleNamespace(served_model_name="tiny-policy", max_model_len=4096,
                                                                      is_diffusion=False))
    return lambda: PrometheusStatLogger(config, list(range(ENGINES)))


def vllm_event(logger, e: dict) -> None:
    """One engine-core stats update, as the engine's output loop hands it to `record`:
    {"engine", "running", "waiting", "deferred", "kv_usage" (0-1), "requests": [[prompt tokens, cached], ...],
    "preempted"}."""
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    prefix = PrefixCacheStats()
    for tokens, hits in e.get("requests", []):
        prefix.record(num_tokens=tokens, num_hits=hits, preempted=False)
    sched = SchedulerStats(num_running_reqs=e.get("running", 0), num_waiting_reqs=e.get("waiting", 0),
                           num_skipped_waiting_reqs=e.get("deferred", 0), kv_cache_usage=e.get("kv_usage", 0.0),
                           prefix_cache_stats=prefix)
    it = IterationStats()
    it.num_preempted_reqs = e.get("preempted", 0)
    logger.record(sched, it, engine_idx=e.get("engine", 0))


# --- SGLang --------------------------------------------------------------------------------------------
def sglang_setup():
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.observability import metrics_collector as mc

    # stubs of the runtime context an SGLang server publishes (priority scheduling on, one DP rank each)
    DisaggregationMode.to_engine_type = staticmethod(lambda mode: "unified")
    observability = types.SimpleNamespace(enable_metrics=True, enable_metrics_for_all_schedulers=False,
                                          kv_events_config=None, extra_metric_labels=None, stat_loggers=None,
                                          prompt_tokens_buckets=None, generation_tokens_buckets=None,
                                          tokenizer_metrics_allowed_custom_labels=None)
    mc.get_observability = lambda: observability
    mc.get_disagg = lambda: types.SimpleNamespace(enable_pd_role_switch=False,
                                                  disaggregation_mode=DisaggregationMode.NULL)
    mc.get_serving = lambda: types.SimpleNamespace(served_model_name="tiny-policy", enable_streaming_session=False)
    mc.get_schedule = lambda: types.SimpleNamespace(enable_priority_scheduling=True, prefill_delayer_max_delay_passes=30,
                                                    prefill_delayer_forward_passes_buckets=None,
                                                    prefill_delayer_wait_seconds_buckets=None)
    mc.exports_expert_balancedness_to_prometheus = lambda: False
    mc.get_context = lambda: types.SimpleNamespace(is_config_namespace_published=lambda name: False)
    server_args = types.SimpleNamespace()

    def build():
        mc.get_parallel = lambda: types.SimpleNamespace(attn_tp_rank=0, attn_cp_rank=0, tp_rank=0, pp_rank=0,
                                                        moe_ep_rank=0, dp_rank=None)
        ctx = mc.SchedulerMetricsCollector.init_new(server_args=server_args, enable_priority_scheduling=True,
                                                    enable_lora=False, enable_hierarchical_cache=False)
        schedulers = [ctx.collector]
        tokenizer = mc.TokenizerMetricsCollector(server_args=server_args, labels=mc.tokenizer_metric_labels())
        return schedulers, tokenizer

    return build


def sglang_event(collectors, e: dict) -> None:
    """{"running": {priority: n}, "queue": {priority: n}, "token_usage" (0-1),
    "cache_hit_rate", "retracted": [reqs, input tokens, output tokens], "kv_transfers": [[bytes, seconds], ...]
    (a prefill request's finished transfer: its `SchedulerReqTimeStats.compute_and_observe_kv_transfer_metrics`),
    "finished": [[prompt tokens, cached tokens, priority or null], ...] (the tokenizer's, per request)}."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.observability.metrics_collector import QueueCount, SchedulerStats
    from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats

    schedulers, tokenizer = collectors
    s = schedulers[0]

    def count(by: dict | None) -> QueueCount:
        by = {int(k): v for k, v in (by or {}).items()}
        return QueueCount(total=sum(by.values()), by_priority=by)

    if "running" in e or "queue" in e or "token_usage" in e:
        s.log_stats(SchedulerStats(num_running_reqs=count(e.get("running")), num_queue_reqs=count(e.get("queue")),
                                   token_usage=e.get("token_usage", 0.0), cache_hit_rate=e.get("cache_hit_rate", 0.0)))
    if "retracted" in e:
        s.increment_retracted_reqs(*e["retracted"])
    for total_bytes, seconds in e.get("kv_transfers", []):
        stats = SchedulerReqTimeStats(disagg_mode=DisaggregationMode.PREFILL)
        stats.set_metrics_collector(s)
        stats.compute_and_observe_kv_transfer_metrics(  # what the KV sender's get_transfer_metric() reports
            types.SimpleNamespace(transfer_total_bytes=total_bytes, transfer_latency_s=seconds, alloc_latency_s=None))
    for prompt, cached, priority in e.get("finished", []):
        labels = dict(tokenizer.labels)
        if priority is not None:
            labels["priority"] = str(priority)  # as TokenizerManager labels each finished request
        tokenizer.observe_one_finished_request(labels, prompt, 10, cached, 1.0, False)


def unregister(prefix: str) -> None:
    """A restarted engine's process starts with an empty registry."""
    registry = prometheus_client.REGISTRY
    for collector in list(registry._collector_to_names):
        if getattr(collector, "_name", "").startswith(prefix):
            registry.unregister(collector)


build = vllm_setup() if engine == "vllm" else sglang_setup()
apply = vllm_event if engine == "vllm" else sglang_event
state = {"metrics": build()}


class Handler(BaseHTTPRequestHandler):
    def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        with LOCK:
            body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
        self._answer(200, body, prometheus_client.CONTENT_TYPE_LATEST)

    def do_POST(self):  # noqa: N802
        events = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"[]")
        try:
            with LOCK:
                if self.path == "/restart":
                    unregister(f"{engine}:")
                    state["metrics"] = build()
                for e in events:
                    apply(state["metrics"], e)
        except Exception:
            self._answer(500, traceback.format_exc().encode())
            return
        self._answer(200, b"ok")

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"URL http://127.0.0.1:{server.server_address[1]}/metrics", flush=True)
server.serve_forever()
