"""A stand-in for one vLLM engine process's tracing (no rltrace, no GPU): the real OpenTelemetry SDK
exporting `llm_request` spans with the attributes vLLM sets on them (vllm/tracing.py
`SpanAttributes`, v1 `OutputProcessor.do_tracing`: SERVER spans from arrival to finish), over
OTLP/HTTP protobuf. Its resource comes from the environment, as a real engine's does:
OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (e.g. `service.instance.id=0,rl.engine.role=prefill`).

Usage: python engine_sender.py URL REQUESTS.json
REQUESTS.json: a list of {"id", "start_ns", "end_ns", "prompt_tokens", "completion_tokens",
"cached_tokens", "queue_s", "ttft_s", "prefill_s", "decode_s"} (cached_tokens as the
`gen_ai.usage.cached_tokens` attribute, the name SGLang's tracing also uses).
"""

import json
import sys

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

url, spec = sys.argv[1], sys.argv[2]
provider = TracerProvider(resource=Resource.create())  # service.name and the rest from OTEL_* variables
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
tracer = provider.get_tracer("vllm.llm_engine")
for r in json.loads(open(spec).read()):
    attrs = {
        "gen_ai.response.model": "tiny-policy", "gen_ai.request.id": r["id"], "gen_ai.request.temperature": 1.0,
        "gen_ai.request.top_p": 1.0, "gen_ai.request.max_tokens": 512, "gen_ai.request.n": 1,
        "gen_ai.usage.prompt_tokens": r["prompt_tokens"], "gen_ai.usage.completion_tokens": r["completion_tokens"],
        "gen_ai.latency.time_in_queue": r["queue_s"], "gen_ai.latency.time_to_first_token": r["ttft_s"],
        "gen_ai.latency.e2e": (r["end_ns"] - r["start_ns"]) / 1e9,
        "gen_ai.latency.time_in_model_prefill": r["prefill_s"], "gen_ai.latency.time_in_model_decode": r["decode_s"],
        "gen_ai.latency.time_in_model_inference": r["prefill_s"] + r["decode_s"],
    }
    if r.get("cached_tokens") is not None:
        attrs["gen_ai.usage.cached_tokens"] = r["cached_tokens"]
    span = tracer.start_span("llm_request", kind=SpanKind.SERVER, attributes=attrs, start_time=r["start_ns"])
    span.end(end_time=r["end_ns"])
provider.shutdown()
