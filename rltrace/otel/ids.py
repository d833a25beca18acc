"""Span and trace ids that user seeds cannot touch.

OpenTelemetry's default `RandomIdGenerator` draws from the global `random` module. RL code seeds
it on every rank (`random.seed(1337)`), so every rank would mint the same ids. This generator
owns a `random.Random` seeded from the OS and reseeds it in the child after `fork`.
"""

from __future__ import annotations

import os
import random

from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import IdGenerator


class ForkSafeRandomIdGenerator(IdGenerator):
    def __init__(self) -> None:
        self._random = random.Random(os.urandom(32))
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._random.seed(os.urandom(32))

    def generate_span_id(self) -> int:
        span_id = self._random.getrandbits(64)
        while span_id == trace.INVALID_SPAN_ID:
            span_id = self._random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._random.getrandbits(128)
        while trace_id == trace.INVALID_TRACE_ID:
            trace_id = self._random.getrandbits(128)
        return trace_id

    def is_trace_id_random(self) -> bool:
        return True
