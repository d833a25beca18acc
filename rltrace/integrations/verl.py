"""verl: every `marked_timer` / `simple_timer` block becomes an rltrace phase.

    from rltrace.integrations import verl
    verl.instrument()            # or: rltrace run -- python -m verl.trainer.main_ppo ...

verl times each stage of its trainers' `fit` loop with `marked_timer(name, timing_raw)` (and
`simple_timer` in workers and agent loops); both delegate to `verl.utils.profiler.performance._timer`,
whichever marker backend (NVTX, MSTX, none) verl picked. That one generator is the seam: the
patched one opens `rltrace.phase(name)` around the block and still fills `timing_raw` exactly as
before. Names map through `rltrace.importers.frameworks.VERL_PHASES` (`gen` -> rollout,
`update_actor` -> train, `update_weights` -> weight_sync, ...); any other name becomes a phase
under its own name. The `step` block is the step span; its step is the trainer's
`global_steps - 1` (verl counts from 1, rltrace from 0), read from the trainer object running
the block. `CheckpointEngineManager.update_weights` returns the engine's sync metrics; when they
hold `checkpoint_engine/payload_mbytes` the open `update_weights` phase gets `rl.bytes`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import warnings
from typing import Any, Collection

import rltrace
from rltrace import _names
from rltrace.importers.frameworks import FRAMEWORKS, VERL_PHASES
from rltrace.integrations import BaseInstrumentor, when_imported

logger = logging.getLogger("rltrace")

TIMER_MODULE = "verl.utils.profiler.performance"
SYNC_MODULE = "verl.checkpoint_engine.base"
_FRAMES_UP = 8  # how far up the stack the trainer's `self` may be from the timer generator
_SYNC_BYTES = {k: unit for k, (_, unit) in FRAMEWORKS["verl"].bytes.items()}
_originals: dict[tuple[str, str], Any] = {}


def phase_of(name: str) -> str:
    """rltrace phase of a verl timer block: the mapped one, or the block's own name."""
    return VERL_PHASES.get(name, name)


def _global_step(frame) -> int | None:
    """`self.global_steps` of the trainer whose code opened the timer (verl: from 1), or None."""
    for _ in range(_FRAMES_UP):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        steps = getattr(owner, "global_steps", None) if owner is not None else None
        if isinstance(steps, int) and not isinstance(steps, bool):
            return steps
        frame = frame.f_back
    return None


def _patch_timer(module) -> None:
    original = module._timer
    if not inspect.isgeneratorfunction(original):
        warnings.warn(f"rltrace: verl {_verl_version()} has no generator {TIMER_MODULE}._timer; its timers are not traced",
                      RuntimeWarning, stacklevel=2)
        return
    _originals[(TIMER_MODULE, "_timer")] = original

    @functools.wraps(original)
    def _timer(name: str, timing_raw: dict[str, float]):
        attrs: dict[str, Any] = {}
        try:
            steps = _global_step(sys._getframe(1))
            if steps is not None:
                attrs["step"] = steps - 1
            attrs["verl.timer"] = name
        except Exception:  # never let telemetry break verl's loop
            logger.debug("rltrace: reading verl's global_steps failed", exc_info=True)
        # the span keeps verl's name (gen, update_actor, ...); rl.phase is rltrace's (rollout, train, ...)
        with rltrace.phase(str(name), phase=phase_of(str(name)), **attrs):
            yield from original(name, timing_raw)

    module._timer = _timer


def _patch_sync(module) -> None:
    cls = getattr(module, "CheckpointEngineManager", None)
    if cls is None or not hasattr(cls, "update_weights"):
        warnings.warn(f"rltrace: verl {_verl_version()} has no CheckpointEngineManager.update_weights; "
                      "weight sync spans carry no bytes", RuntimeWarning, stacklevel=2)
        return
    original = cls.update_weights
    _originals[(SYNC_MODULE, "update_weights")] = original

    @functools.wraps(original)
    def update_weights(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if inspect.iscoroutine(result):
            return _awaited(result)
        _record_bytes(result)
        return result

    cls.update_weights = update_weights


async def _awaited(coro):
    result = await coro
    _record_bytes(result)
    return result


def _record_bytes(metrics: Any) -> None:
    """`rl.bytes` on the open `update_weights` phase, from the engine's sync metrics."""
    if not isinstance(metrics, dict):
        return
    try:
        from opentelemetry.trace import get_current_span

        span = get_current_span()
        for key, unit in _SYNC_BYTES.items():
            if key in metrics and getattr(span, "name", None) == "update_weights":
                span.set_attribute(_names.SYNC_BYTES, int(round(float(metrics[key]) * unit)))
                return
    except Exception:
        logger.debug("rltrace: recording verl's weight sync bytes failed", exc_info=True)


def _verl_version() -> str:
    try:
        from importlib import metadata

        return metadata.version("verl")
    except Exception:
        return "?"


class VerlInstrumentor(BaseInstrumentor):
    """Registered under the `rltrace.instrumentors` entry point (`rltrace run -- ...`)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("verl >= 0.5",)

    def _instrument(self, **kwargs: Any) -> None:
        when_imported(TIMER_MODULE, _patch_timer)
        when_imported(SYNC_MODULE, _patch_sync)

    def _uninstrument(self, **kwargs: Any) -> None:
        for (module_name, attr), original in list(_originals.items()):
            module = sys.modules.get(module_name)
            if module is None:
                continue
            if attr == "_timer":
                module._timer = original
            else:
                module.CheckpointEngineManager.update_weights = original
            del _originals[(module_name, attr)]


def instrument() -> bool:
    """Trace verl's timer blocks in this process (patches now if verl is imported, else on import)."""
    return VerlInstrumentor().instrument()


def uninstrument() -> None:
    VerlInstrumentor().uninstrument()
