"""slime: its per-sample traces, rollout function and timers, recorded while it runs.

    from rltrace.integrations import slime
    slime.instrument()           # or: rltrace run -- python train.py ...

slime (THUDM/slime) keeps a trace per sample (`sample.trace`, slime/observability/trace_utils.py:
`generate_and_rm`, `sglang_generate`, `reward_model`, group spans, PD children) and times its
trainer with `Timer` (slime/observability/timer.py). Patched at import, nothing else changed:

- every event slime appends to a trace (`trace_utils._append_event`) feeds `_slime_live.Live`,
  which writes each span as it ends, the same row `rltrace import slime` makes from the dump;
- SGLang's answer, as slime turns it into trace attributes (`build_sglang_meta_trace_attrs`),
  gives the engine call its weight version;
- the rollout function (`call_rollout_fn`, which runs any `--rollout-function-path`, and the
  default `sglang_rollout.generate_rollout`) becomes a `rollout` phase with step = rollout id, and
  when it returns, its samples are recorded with the columns the importer writes (SGLang's
  cached tokens, speculative acceptance, ...);
- `Timer.start` / `Timer.end` open and close a phase per timer (`train`, `actor_train`,
  `log_probs`, `update_weights`, `train_wait`, ...; names map through
  `rltrace.importers.frameworks.SLIME_PHASES`, others keep their own) with step = the
  `rollout_id` of the trainer code running it, else the latest rollout id seen;
- slime's weight updaters (`update_weight_from_distributed`, `_from_tensor`, `_from_disk_delta`:
  pause → `flush_cache` on every engine → send → continue): when one returns after it called its
  engines' `flush_cache`, the open `update_weights` phase (`weight_sync`) records
  `rl.cache_flushed` true. A process that did not flush (ranks other than 0; the full-disk mode,
  whose flush runs in the driver after the timer) records nothing: its hits read "may be stale".

Faults in this module are logged at debug level and counted in the run's drop table (`rltrace
info`); slime's own code runs as before, exceptions included.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Collection

import rltrace
from rltrace.importers.frameworks import SLIME_PHASES
from rltrace.integrations import BaseInstrumentor, when_imported

logger = logging.getLogger("rltrace")


def _api():
    """rltrace's API, loaded when slime first does something to record (`rltrace run` imports
    this module in every process at start-up; most of them never record)."""
    from rltrace import api

    return api


def _live():
    """The process's trace state (`_slime_live.Live`), made on first use for the same reason."""
    global _LIVE
    if _LIVE is None:
        from rltrace.integrations._slime_live import Live

        _LIVE = Live()
    return _LIVE


def __getattr__(name: str):
    if name == "live":  # `slime.live`, for tests and benchmarks
        return _live()
    raise AttributeError(name)


_LIVE = None

TRACE_MODULE = "slime.observability.trace_utils"
TIMER_MODULE = "slime.observability.timer"
#: modules that hold the rollout entry points, by the name they hold them under
ROLLOUT_FUNCTIONS = {
    "slime.rollout.base_types": "call_rollout_fn",
    "slime.ray.rollout": "call_rollout_fn",  # imported by name from base_types
    "slime.rollout.sglang_rollout": "generate_rollout",
}
META_USERS = ("slime.rollout.sglang_rollout",)
#: modules of slime's weight updaters whose `update_weights` calls the engines' `flush_cache`
UPDATER_MODULES = tuple(f"slime.backends.megatron_utils.update_weight.update_weight_from_{m}"
                        for m in ("distributed", "tensor", "disk_delta"))  # modules that import build_sglang_meta_trace_attrs by name
_FRAMES_UP = 8  # how far up the stack the trainer's `rollout_id` may be from Timer.start / Timer.end
_WRAPPED = "__rltrace_original__"

_originals: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
_timers: dict[str, Any] = {}  # open timer name -> PhaseHandle
_active = False  # patches still waiting for their module apply only while instrumented
_role_set = False


def phase_of(name: str) -> str:
    """rltrace phase of a slime timer: the mapped one, or the timer's own name."""
    return SLIME_PHASES.get(name, name)


def _fault(what: str, exc: BaseException | None = None) -> None:
    """Count and log a fault of this hook; never raise into slime."""
    _live().faults += 1
    reason = f"{what}: {type(exc).__name__}: {exc}" if exc is not None else what
    logger.debug("rltrace: slime hook: %s", reason, exc_info=exc is not None)
    try:
        run = _api().recording_run()
        if run is not None:
            run.drops.add("slime traces", 1, reason[:200])
    except Exception:
        pass


def _rollout_run():
    """The run slime's rollout records into. Started here (under `rltrace run`, from RLTRACE_RUN_DIR,
    with no RLTRACE_ROLE), its role is `rollout`: the process is slime's rollout manager."""
    global _role_set
    if not _role_set and _api().current_run() is None and os.environ.get("RLTRACE_RUN_DIR") and not os.environ.get("RLTRACE_ROLE"):
        _role_set = True
        try:
            rltrace.init(role="rollout")
        except Exception as exc:  # a bad setting is reported by rltrace.init's own checks; slime still runs
            _fault("starting the rollout process's run", exc)
    return _api().recording_run()


def _patch(owner: Any, attr: str, make) -> Any:
    """Replace `owner.attr` by `make(original)` (once); returns the wrapper, or None."""
    original = getattr(owner, attr, None)
    if not _active or original is None or getattr(original, _WRAPPED, None) is not None:
        return None
    wrapper = make(original)
    setattr(wrapper, _WRAPPED, original)
    _originals.append((owner, attr, original))
    setattr(owner, attr, wrapper)
    return wrapper


# --- traces --------------------------------------------------------------------------------------
def _patch_trace(module) -> None:
    def make_append(original):
        @functools.wraps(original)
        def _append_event(handle, **kwargs):
            event = original(handle, **kwargs)
            try:
                run = _rollout_run()
                if run is not None and not _live().evaluating:
                    if _live().run is not run:
                        from rltrace.integrations._slime_live import SpanWriter

                        _live().run, _live().emit = run, SpanWriter(run)
                    _live().on_event(handle.carrier, event)
            except Exception as exc:  # a malformed event costs its span, never slime's rollout
                _fault("a slime trace event could not be recorded", exc)
            return event

        return _append_event

    def make_meta(original):
        @functools.wraps(original)
        def build_sglang_meta_trace_attrs(meta):
            attrs = original(meta)
            try:
                stack = module._TRACE_STACK.get()
                if stack and isinstance(meta, dict) and "weight_version" in meta:
                    trace_id, span_id = stack[-1]
                    _live().request_version(trace_id, span_id, meta["weight_version"])
            except Exception as exc:
                _fault("the weight version of an engine call could not be read", exc)
            return attrs

        return build_sglang_meta_trace_attrs

    _patch(module, "_append_event", make_append)
    _patch(module, "build_sglang_meta_trace_attrs", make_meta)
    for name in META_USERS:
        if name in sys.modules:
            _rebind_meta(sys.modules[name])


def _rebind_meta(user) -> None:
    """A module that imported `build_sglang_meta_trace_attrs` by name gets the patched one."""
    traces = sys.modules.get(TRACE_MODULE)
    wrapper = getattr(traces, "build_sglang_meta_trace_attrs", None)
    current = getattr(user, "build_sglang_meta_trace_attrs", None)  # None while it is still being imported
    original = getattr(wrapper, _WRAPPED, None)
    if _active and original is not None and current is not None and current is not wrapper:
        _originals.append((user, "build_sglang_meta_trace_attrs", getattr(current, _WRAPPED, current)))
        user.build_sglang_meta_trace_attrs = wrapper


# --- rollouts ------------------------------------------------------------------------------------
def _samples(output: Any) -> list:
    """The samples of a rollout function's output, flat, in slime's order (what it dumps)."""
    groups = getattr(output, "samples", output)
    out: list = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif hasattr(x, "to_dict"):
            out.append(x)

    walk(groups)
    return out


def _rollout(rollout_id: Any, evaluation: bool, call):
    """Run one rollout function call inside a `rollout` phase, then record its samples.

    An evaluation rollout is an `eval` phase; its samples' traces are not recorded, as `rltrace
    import slime` skips evaluation dumps (its samples are no training batch).
    """
    if not isinstance(rollout_id, int) or isinstance(rollout_id, bool) or _live().rollout == rollout_id or _live().evaluating:
        return call()  # a nested entry point (call_rollout_fn -> generate_rollout) is the same rollout
    if evaluation:
        _live().evaluating = True
        try:
            with rltrace.phase("eval", phase="eval", step=rollout_id):
                return call()
        finally:
            _live().evaluating = False
    try:
        _rollout_run()
        _live().begin(rollout_id)
    except Exception as exc:
        _fault("starting a slime rollout", exc)
    try:
        with rltrace.phase("rollout", phase="rollout", step=rollout_id):
            output = call()
    finally:
        _live().rollout = None
    try:
        if _api().recording_run() is not None:
            for step, rows in _live().end(rollout_id, _samples(output)).items():
                rltrace.log_samples(step, rows)
    except Exception as exc:
        _fault("the samples of a slime rollout could not be recorded", exc)
    return output


def _patch_rollout(module, attr: str) -> None:
    def make(original):
        if attr == "call_rollout_fn":
            @functools.wraps(original)
            def call_rollout_fn(fn, *args, evaluation: bool, **kwargs):
                rid = args[1] if len(args) > 1 else kwargs.get("rollout_id")
                return _rollout(rid, evaluation, lambda: original(fn, *args, evaluation=evaluation, **kwargs))

            return call_rollout_fn

        @functools.wraps(original)
        def generate_rollout(args, rollout_id, data_source, evaluation: bool = False, **kwargs):
            return _rollout(rollout_id, evaluation,
                            lambda: original(args, rollout_id, data_source, evaluation=evaluation, **kwargs))

        return generate_rollout

    _patch(module, attr, make)


# --- timers --------------------------------------------------------------------------------------
def _rollout_id(frame) -> int | None:
    """`rollout_id` of the slime code that started or ended a timer, or None."""
    for _ in range(_FRAMES_UP):
        if frame is None:
            return None
        value = frame.f_locals.get("rollout_id")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        frame = frame.f_back
    return None


def _patch_timer(module) -> None:
    cls = module.Timer

    def make_start(original):
        @functools.wraps(original)
        def start(self, name):
            original(self, name)  # slime's own checks (a timer started twice) raise as before
            try:
                rid = _rollout_id(sys._getframe(1))
                if rid is not None:
                    _live().last = rid
                step = rid if rid is not None else _live().last
                _timers[name] = rltrace.start_phase(str(name), phase=phase_of(str(name)), step=step,
                                                    **{"slime.timer": str(name)})
            except Exception as exc:
                _fault(f"opening the phase of slime timer {name!r}", exc)

        return start

    def make_end(original):
        @functools.wraps(original)
        def end(self, name):
            original(self, name)
            try:
                handle = _timers.pop(name, None)
                if handle is None:
                    return
                rid = _rollout_id(sys._getframe(1))
                if rid is not None:  # train_wait ends in the train of the rollout it waited for
                    _live().last = rid
                    if handle.span is not None:
                        from rltrace._names import STEP

                        handle.span.set_attribute(STEP, rid)
                handle.end()
            except Exception as exc:
                _fault(f"closing the phase of slime timer {name!r}", exc)

        return end

    _patch(cls, "start", make_start)
    _patch(cls, "end", make_end)


# --- weight updates: the engines' prefix-cache flush -------------------------------------------
class _Watched:
    """An engine handle's `flush_cache` (a Ray actor method) that notes each `.remote()` call."""

    def __init__(self, method, calls: list):
        self._method, self._calls = method, calls

    def remote(self, *args, **kwargs):
        ref = self._method.remote(*args, **kwargs)
        self._calls.append(ref)
        return ref

    def __getattr__(self, name):  # .options(...), .bind(...): the actor method's own
        return getattr(self._method, name)


def _watch_flushes(engines, calls: list) -> list:
    """Wrap each engine handle's `flush_cache` for one update; returns what to restore."""
    saved = []
    for engine in engines or ():
        try:
            method = getattr(engine, "flush_cache", None)
            if method is None or not callable(getattr(method, "remote", None)):
                continue
            before = engine.__dict__.get("flush_cache", _UNSET)
            engine.flush_cache = _Watched(method, calls)
            saved.append((engine, before))
        except Exception as exc:  # a handle that takes no attribute: its flush is not seen
            _fault("watching an engine's flush_cache", exc)
    return saved


def _restore_flushes(saved: list) -> None:
    for engine, before in saved:
        try:
            if before is _UNSET:
                engine.__dict__.pop("flush_cache", None)
            else:
                engine.flush_cache = before
        except Exception as exc:
            _fault("restoring an engine's flush_cache", exc)


def _sync_phase():
    """The open phase of slime's weight-update timer, or None."""
    for name, handle in reversed(list(_timers.items())):
        if phase_of(str(name)) == "weight_sync":
            return handle
    return None


def _patch_updater(module) -> None:
    def make(original):
        @functools.wraps(original)
        def update_weights(self, *args, **kwargs):
            calls: list = []
            saved = _watch_flushes(getattr(self, "rollout_engines", None), calls)
            try:
                out = original(self, *args, **kwargs)  # slime's errors (a flush that timed out) raise as before
            finally:
                _restore_flushes(saved)
            if calls:  # it returned: slime waited on every flush it asked for (`ray.get`)
                try:
                    phase = _sync_phase()
                    if phase is not None:
                        phase.set(cache_flushed=True)
                except Exception as exc:
                    _fault("recording the engines' prefix-cache flush", exc)
            return out

        return update_weights

    for cls in list(vars(module).values()):
        if isinstance(cls, type) and cls.__module__ == module.__name__ and "update_weights" in vars(cls):
            _patch(cls, "update_weights", make)


_UNSET = object()


# --- the instrumentor ----------------------------------------------------------------------------
class SlimeInstrumentor(BaseInstrumentor):
    """Registered under the `rltrace.instrumentors` entry point (`rltrace run -- ...`).

    slime is installed from its source (not from PyPI), so there is no version to check: the
    patches wait for slime's modules to be imported and leave alone a module that lacks a seam.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        global _active
        _active = True
        when_imported(TRACE_MODULE, _patch_trace)
        when_imported(TIMER_MODULE, _patch_timer)
        for module_name, attr in ROLLOUT_FUNCTIONS.items():
            when_imported(module_name, functools.partial(_patch_rollout, attr=attr))
        for module_name in META_USERS:
            when_imported(module_name, _rebind_meta)
        for module_name in UPDATER_MODULES:
            when_imported(module_name, _patch_updater)

    def _uninstrument(self, **kwargs: Any) -> None:
        global _active
        _active = False
        while _originals:
            owner, attr, original = _originals.pop()
            setattr(owner, attr, original)
        _timers.clear()


def generate_rollout(args, rollout_id, data_source, evaluation: bool = False):
    """slime's default rollout, traced: `--rollout-function-path rltrace.integrations.slime.generate_rollout`,
    for a job not started under `rltrace run` (the rollout process then needs RLTRACE_RUN_DIR or `rltrace.init`)."""
    instrument()
    from slime.rollout import sglang_rollout

    return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=evaluation)


def instrument() -> bool:
    """Record slime's traces, rollouts and timers in this process (patches now if slime is imported, else on import)."""
    return SlimeInstrumentor().instrument()


def uninstrument() -> None:
    SlimeInstrumentor().uninstrument()
