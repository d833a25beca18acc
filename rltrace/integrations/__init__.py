"""Hooks into the frameworks people train with, and the mechanism that loads them.

An *instrumentor* patches one library so that its own loop records rltrace phases. Explicit use:
`rltrace.integrations.hf.RltraceCallback` (or `HFInstrumentor().instrument()`); zero-code use:
`rltrace run -- python train.py` loads every instrumentor registered under the package entry
point group `rltrace.instrumentors` (and any named in `RLTRACE_INSTRUMENTORS`) at the start of
every Python process of the command. See docs/integrations.md.

This package imports nothing heavy: it runs at interpreter start-up under `rltrace run`, and
each instrumentor patches its library only once that library is imported (`when_imported`).
"""

from rltrace.integrations._base import BaseInstrumentor, DependencyConflict
from rltrace.integrations._hooks import when_imported
from rltrace.integrations._load import GROUP, load_instrumentors

__all__ = ["BaseInstrumentor", "DependencyConflict", "GROUP", "load_instrumentors", "when_imported"]
