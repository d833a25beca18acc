"""`rltrace collect`: an OTLP/HTTP receiver that writes spans from any OpenTelemetry sender into a
run (vLLM, SGLang, services in other languages, an OTel Collector fanning in many nodes).
See docs/collect.md."""

from rltrace.collect.receiver import Limits, Receiver

__all__ = ["Limits", "Receiver"]
