"""A plain OpenTelemetry SDK process (no rltrace): exports RL-shaped spans over OTLP/HTTP protobuf.

Usage: python sdk_sender.py URL SERVICE RANK STEPS
"""

import sys

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

url, service, rank, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
provider = TracerProvider(resource=Resource.create({"service.name": service, "rl.rank": rank, "host.name": "node-7", "process.pid": 4242}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
tracer = provider.get_tracer("sdk-sender", "1.0")
for step in range(1, steps + 1):
    with tracer.start_as_current_span("rollout", attributes={"rl.phase": "rollout", "rl.step": step, "rl.weight_version": step - 1}):
        with tracer.start_as_current_span("generate", attributes={"rl.phase": "generate", "rl.step": step, "gen_ai.request.model": "tiny"}):
            pass
        with tracer.start_as_current_span("http.request"):  # no rl.phase: kept, phase NULL
            pass
    with tracer.start_as_current_span("train", attributes={"rl.phase": "train", "rl.step": step}):
        pass
provider.shutdown()
