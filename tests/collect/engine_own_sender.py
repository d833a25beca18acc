"""One engine process tracing its requests with the engine's **own** code (tests/engine_code.py):
vLLM 0.34.0's `init_tracer` + `OutputProcessor.do_tracing`, or SGLang 0.5.23's `process_tracing_init`
+ `APIServerReqTimeStats` (its `TraceReqContext`) with `TokenizerManager.convert_to_span_attrs`, and
a scheduler thread's `copy_for_thread` / `rebuild_thread_context` slice per request,
exporting through the real OTel SDK over OTLP/HTTP. Only the clock is set: each request is traced
at the times given, as the engine would have traced it then.

Usage: python engine_own_sender.py vllm|sglang URL REQUESTS.json [--old-sdk]
REQUESTS.json: a list of {"id", "start_ns", "end_ns", "prompt_tokens", "completion_tokens",
"cached_tokens", "queue_s" (waiting for the scheduler), "prefill_s" (the prefill forward itself),
"role" (SGLang's disaggregation mode: unified / prefill / decode), optional "traceparent" (the W3C
header the caller sent, e.g. `rltrace.inject()`'s: the engine continues that trace)}. `--old-sdk`: the resource as
an OTel SDK before 1.40 builds it (no random `service.instance.id`).
The resource comes from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, as a real engine's does.
"""

import json
import os
import sys
import threading
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import engine_code  # noqa: E402

engine, url, spec = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
if "--old-sdk" in sys.argv:
    from opentelemetry.sdk import resources

    resources.ServiceInstanceIdResourceDetector.detect = lambda self: resources.Resource({})

import opentelemetry.sdk.trace as sdk_trace  # noqa: E402

engine_code.load(engine)
requests = json.loads(Path(spec).read_text())
NOW = [0]
sdk_trace.time_ns = lambda: NOW[0]  # the SDK's clock, for spans the engine ends "now"


def vllm() -> None:
    from opentelemetry import trace

    from vllm.tracing import init_tracer
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState
    from vllm.v1.metrics.stats import IterationStats, RequestStateStats

    init_tracer("vllm.llm_engine", url)
    processor = OutputProcessor.__new__(OutputProcessor)  # do_tracing reads only its arguments
    for r in requests:
        start, end = r["start_ns"] / 1e9, r["end_ns"] / 1e9
        state = RequestState(request_id=r["id"] + "-0", external_req_id=r["id"], parent_req=None, request_index=0,
                             lora_request=None, output_kind=None, prompt=None,
                             prompt_token_ids=list(range(r["prompt_tokens"])), prompt_embeds=None,
                             logprobs_processor=None, detokenizer=None, max_tokens_param=512, arrival_time=start,
                             queue=None, log_stats=True, stream_interval=1, top_p=1.0, n=1, temperature=1.0)
        core = 1000.0  # engine-core clock (monotonic): only differences are used
        state.stats = RequestStateStats(num_generation_tokens=r["completion_tokens"], arrival_time=start,
                                        queued_ts=core, scheduled_ts=core + r["queue_s"],
                                        first_token_ts=core + r["queue_s"] + r["prefill_s"],
                                        last_token_ts=core + (end - start),
                                        first_token_latency=r["queue_s"] + r["prefill_s"])
        stats = IterationStats()
        stats.iteration_timestamp = end
        NOW[0] = r["end_ns"]
        processor.do_tracing(types.SimpleNamespace(trace_headers=_headers(r)), state, stats)
    trace.get_tracer_provider().shutdown()


def sglang() -> None:
    from opentelemetry import trace

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.observability import req_time_stats
    from sglang.srt.observability.trace import process_tracing_init

    process_tracing_init(url, None)
    req_time_stats.global_diff_realtime_monotonic = 0.0  # its perf_counter times are given in wall seconds
    manager = types.SimpleNamespace(enable_trace=True, served_model_name="tiny-policy")
    for k, r in enumerate(requests):
        start, end = r["start_ns"] / 1e9, r["end_ns"] / 1e9
        mode = DisaggregationMode(r.get("role", "unified").replace("unified", "null"))
        stats = req_time_stats.APIServerReqTimeStats(disagg_mode=mode)
        stats.init_trace_ctx(r["id"], None if mode is DisaggregationMode.NULL else 1000 + k, _headers(r))
        stats.set_created_time(start)
        stats.set_tokenize_finish_time(start + 0.0002)
        stats.set_api_server_dispatch_time(start + 0.0002)
        stats.set_api_server_dispatch_finish_time(start + 0.0005)
        first = start + 0.0005 + r["queue_s"] + r["prefill_s"]  # the scheduler's queue, then the prefill forward
        scheduler = threading.Thread(target=_scheduler, args=(stats.trace_ctx, start + 0.0006, first - r["prefill_s"], first))
        scheduler.start()  # as SGLang's scheduler traces the request: its own thread span below the request's
        scheduler.join()
        stats.set_first_token_time(first)
        state = types.SimpleNamespace(obj=types.SimpleNamespace(rid=r["id"], sampling_params={
            "max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0}))
        out = types.SimpleNamespace(completion_tokens=[r["completion_tokens"]], prompt_tokens=[r["prompt_tokens"]],
                                    cached_tokens=[r.get("cached_tokens") or 0], finished_reasons=[{"type": "stop"}])
        attrs = TokenizerManager.convert_to_span_attrs(manager, state, out, 0)
        NOW[0] = r["end_ns"]
        stats.set_finished_time(end, span_attrs=attrs)
    trace.get_tracer_provider().shutdown()


def _headers(r: dict) -> dict | None:
    """The request's HTTP headers as the engine's server hands them to its tracing code."""
    return {"traceparent": r["traceparent"]} if r.get("traceparent") else None


def _scheduler(ctx, received: float, forward: float, first: float) -> None:
    """The scheduler's side of a request (another thread: another pid on its thread span), later
    than the request's own thread span."""
    from sglang.srt.observability.trace import trace_set_thread_info

    trace_set_thread_info("scheduler", tp_rank=0)
    copy = ctx.copy_for_thread()
    copy.rebuild_thread_context(ts=round(received * 1e9))
    copy.trace_slice_start("prefill_forward", 1, ts=round(forward * 1e9))
    copy.trace_slice_end("prefill_forward", 1, ts=round(first * 1e9), thread_finish_flag=True)


{"vllm": vllm, "sglang": sglang}[engine]()
