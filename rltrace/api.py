"""The public API: `init`, `phase`, `start_phase`, `log_metrics`, `log_samples`, `inject`, `attach`, `shutdown`.

One `Run` per process, held here. Before `init` (and with `RLTRACE_DISABLED=1`) every call is a
no-op that costs well under a microsecond; if `RLTRACE_RUN_DIR` is set, the first call
initialises from the environment, so a loop instrumented with rltrace records without code changes.

User mistakes (a non-integer step, a bad attribute key) raise at the call site. Faults inside
rltrace never break the training loop: they are logged and the phase runs untraced (under
pytest they raise, so tests see them).
"""

from __future__ import annotations

import atexit
import collections
import contextvars
import functools
import inspect
import logging
import operator
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pyarrow as pa
from opentelemetry import baggage, context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Status, StatusCode, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rltrace import _crash, _model, _names, _phases
from rltrace._config import PROFILE_TRIGGERS, RltraceConfigError, env_sets_any, is_set, resolve
from rltrace._values import as_int as _as_int
from rltrace._values import attributes as _attributes
from rltrace._values import baggage_int as _baggage_int
from rltrace._values import metric_value as _metric_value
from rltrace._values import within_limit as _within_limit
from rltrace.otel.live import EXITED
from rltrace.run import Run
from rltrace.store import rows as store_rows

logger = logging.getLogger("rltrace")

_run: Run | None = None
_env_checked = False  # RLTRACE_RUN_DIR is looked at once, on the first call before init
_lock = threading.Lock()
_PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
# The default role is "trainer"; a process that continues another process's trace is rarely the
# trainer, so it is warned (once) when its role was never chosen. Carriers this process handed
# out itself (to its own threads) are remembered, newest last, so attaching them does not count.
_INJECTED_KEPT = 4096
_injected: collections.OrderedDict[str, None] = collections.OrderedDict()
_injected_lock = threading.Lock()
_remote_parent = False  # this process attached a carrier from another process
_default_role = False  # the current run's role is the default, not passed or set by RLTRACE_ROLE
_role_warned = False


class DisabledRun:
    """What `init` returns when rltrace is disabled: every method is a no-op."""

    disabled = True  # `Run.disabled` is False

    def __init__(self, run_dir: Path | None):
        self.run_dir = run_dir

    def flush(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"DisabledRun(run_dir={self.run_dir!r})"


# --- init / shutdown ---------------------------------------------------------------------------
def _same_place(a: str | Path, b: str | Path) -> bool:
    if isinstance(a, Path) and isinstance(b, Path):
        return a.resolve() == b.resolve()
    return str(a).rstrip("/") == str(b).rstrip("/")


def init(
    run_dir: str | os.PathLike | None = None,
    *,
    run_name: str | None = None,
    role: str | None = None,
    rank: int | None = None,
    otlp_endpoint: str | None = None,
    config: Any = None,
    service_name: str | None = None,
    disabled: bool | None = None,
    flush_interval: float | None = None,
    max_queue: int | None = None,
    max_pending_rows: int | None = None,
    profile: Any = None,
    resources: bool | None = None,
    resources_interval: float | None = None,
    model: Any = None,
) -> Run | DisabledRun:
    """Start recording this process into `run_dir`; every process of a run passes the same dir.

    Example:
        >>> run = rltrace.init("runs/exp1", role="rollout", rank=3, config=cfg)

    Each argument falls back to its environment variable (`RLTRACE_RUN_DIR`, `RLTRACE_ROLE`,
    `RLTRACE_RANK` or `RANK`, `RLTRACE_DISABLED`, `RLTRACE_FLUSH_INTERVAL`, `RLTRACE_MAX_QUEUE`,
    `RLTRACE_MAX_PENDING_ROWS`, `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`), then to its
    default; see `rltrace._config.PARAMS`. `config` (dict, dataclass or Namespace) is saved in
    `run.json` by the first process. `profile` (a `rltrace.profiling.ProfilePolicy`, a dict of
    its fields, or False to ignore the `RLTRACE_PROFILE_*`/`RLTRACE_HANG_TIMEOUT` variables)
    attaches py-spy / torch.profiler captures to slow phases; see docs/profiling.md. `resources`
    (`RLTRACE_RESOURCES=1`) samples this process's CPU, memory and NVIDIA GPUs every
    `resources_interval` seconds (`RLTRACE_RESOURCES_INTERVAL`, default 1) into the `resources`
    table; see docs/store.md. Calling
    `init` again with the same dir, role and rank returns the same run; with others it ends the
    current run first.
    """
    global _run, _env_checked, _default_role
    with _lock:
        _env_checked = True
        if resolve("disabled", disabled):
            if _run is not None:
                _run.shutdown()
                _run = None
            dir_value = resolve("run_dir", run_dir)
            return DisabledRun(Path(dir_value) if dir_value else None)
        dir_value = resolve("run_dir", run_dir)
        if not dir_value:
            raise RltraceConfigError("rltrace.init needs a run directory: pass run_dir=... or set RLTRACE_RUN_DIR")
        role_chosen, role = is_set("role", role), resolve("role", role)
        if not isinstance(role, str) or not role:
            raise RltraceConfigError(f"role must be a non-empty string such as 'trainer' or 'rollout', got {role!r}")
        rank = resolve("rank", rank)
        if rank is not None:
            try:
                rank = operator.index(rank)
            except TypeError:
                raise RltraceConfigError(f"rank must be an integer >= 0, got {rank!r}") from None
            if rank < 0:
                raise RltraceConfigError(f"rank must be an integer >= 0, got {rank!r}")
        from rltrace.store import objstore

        path = str(dir_value) if objstore.is_uri(dir_value) else Path(dir_value)
        sample = resolve("resources", resources)
        interval = resolve("resources_interval", resources_interval)
        if sample and not (isinstance(interval, (int, float)) and interval > 0):
            raise RltraceConfigError(f"resources_interval must be a number of seconds > 0, got {interval!r}")
        model_config = _model.read_config(model_value) if (model_value := resolve("model", model)) is not None else None
        policy = None
        if profile is not False and (profile is not None or env_sets_any(PROFILE_TRIGGERS)):
            from rltrace.profiling import resolve_policy  # only when asked: profiling is optional

            policy = resolve_policy(profile)
        if _run is not None:
            if _same_place(_run.location, path) and _run.role == role and _run.rank == rank:
                if model_config is not None:
                    _record_model(_run, *model_config)
                return _run
            _run.shutdown()
            _run = None
        _run = Run(
            path,
            run_name=resolve("run_name", run_name),
            role=role,
            rank=rank,
            service_name=resolve("service_name", service_name),
            config=config,
            flush_interval=resolve("flush_interval", flush_interval),
            max_queue=resolve("max_queue", max_queue),
            max_pending_rows=resolve("max_pending_rows", max_pending_rows),
            otlp_endpoint=resolve("otlp_endpoint", otlp_endpoint),
        )
        _default_role = not role_chosen
        if model_config is not None:
            _record_model(_run, *model_config)
        _warn_if_default_role(stacklevel=3)
        _crash.install()
        if policy is not None and policy.armed:
            try:
                from rltrace.profiling import arm

                arm(_run, policy)
            except Exception:
                _internal_error("arming profiling")
        if resolve("stacks"):
            try:
                from rltrace.stacks import start as start_stacks

                start_stacks(_run)
            except Exception:
                _internal_error("starting the stack thread")
        if sample:
            try:
                from rltrace.resources import start

                start(_run, float(interval))
            except Exception:
                _internal_error("starting resource sampling")
        return _run


def _record_model(run: Run, config: dict, source: str) -> None:
    """The model's config as a zero-length span (`_model.MODEL_SPAN`): stored like every span, on every path."""
    try:
        run.tracer.start_span(_model.MODEL_SPAN, attributes={_model.CONFIG_ATTR: _model.to_text(config),
                                                            _model.SOURCE_ATTR: source}).end()
    except Exception:
        _internal_error("recording the model config")


def recording_run() -> Run | None:
    """The run a recording call writes into; before `init`, the first recording call initialises
    once from RLTRACE_RUN_DIR if it is set (rltrace's own recording paths use this too)."""
    global _env_checked
    if _run is not None or _env_checked:
        return _run
    if os.environ.get("RLTRACE_RUN_DIR"):
        init()
    _env_checked = True
    return _run


def current_run() -> Run | None:
    """The run this process records into, or None before `init` (or when disabled). It only looks:
    unlike a recording call, it never starts a run (or creates its directory) from RLTRACE_RUN_DIR."""
    return _run


def flush() -> None:
    """Write everything recorded so far (blocks; for tests and checkpoints, not the hot path)."""
    if _run is not None:
        _run.flush()


def shutdown() -> None:
    """Flush and end this process's run. Runs by itself at interpreter exit."""
    global _run
    with _lock:
        if _run is not None:
            end_open_phases(EXITED)
            _run.shutdown()
            _run = None


atexit.register(shutdown)


# --- phase -------------------------------------------------------------------------------------
def _internal_error(what: str) -> None:
    if "PYTEST_CURRENT_TEST" in os.environ:
        raise
    logger.exception("rltrace: %s failed; your code still runs, with less telemetry", what)


def _inherited(parent) -> tuple[int | None, int | None]:
    """`rl.step` and `rl.weight_version` of the enclosing phase, in this process or a remote one."""
    attrs = getattr(parent, "attributes", None)
    if attrs:
        return attrs.get(_names.STEP), attrs.get(_names.WEIGHT_VERSION)
    return _baggage_int(_names.STEP), _baggage_int(_names.WEIGHT_VERSION)


#: The step of the last outermost phase (no enclosing phase in this process) that had one, in this
#: thread or asyncio task (a context variable: concurrent tasks never see each other's). The
#: README's loop passes `step=` to `rollout` only: its siblings `reward`, `train`, `weight_sync`
#: that follow take that step, the one the loop is in. Once a `step` container has run, nothing is
#: taken: containers say where steps end, and what is outside them is in none. Held with its run,
#: so a new run starts afresh.
_last_step: contextvars.ContextVar[tuple[Run, int] | None] = contextvars.ContextVar("rltrace_last_step", default=None)


def _start_span(run: Run, name: str, step: int | None, version: int | None, attrs: dict[str, Any]):
    """Start the span of a phase; `step` and `weight_version` default to the enclosing phase's, and
    an outermost phase without a step takes the step of the outermost phase before it (`_last_step`)."""
    parent = get_current_span()
    if step is None or version is None:
        parent_step, parent_version = _inherited(parent)
        step = parent_step if step is None else step
        version = parent_version if version is None else version
    if not parent.is_recording():  # outermost in this process (a remote parent does not record here)
        last = _last_step.get()
        last = last if last is not None and last[0] is run else None
        if name in _phases.ALWAYS_CONTAINER:  # steps marked by containers: what is outside them is in none
            _last_step.set((run, None))
        elif step is None:
            step = last[1] if last is not None else None
        elif last is None or last[1] is not None:
            _last_step.set((run, step))
    values = {_names.PHASE: name, _names.THREAD_ID: threading.get_ident()}
    group = _names.SEMCONV_GROUP_OF_PHASE.get(name)
    if group is not None:
        values[_names.SEMCONV_OPERATION] = group
    if step is not None:
        values[_names.STEP] = step
    if version is not None:
        values[_names.WEIGHT_VERSION] = version
    values.update(attrs)
    if len(values) > run.max_attributes:
        values = _within_limit(run, values, 0)
    return run.tracer.start_span(name, attributes=values)


def _ending(span) -> None:
    """Run the run's `ending_hooks` (a torch.profiler window's stop) while the span is still open."""
    run = _run
    if run is None or not run.ending_hooks:
        return
    for hook in run.ending_hooks:
        try:
            hook(span)
        except Exception:
            _internal_error("finishing a profile at the end of a phase")


#: Attribute set on an exception as it escapes phases: [(phase, step, span_id), ...], innermost
#: first, so a crash record names the phases it went through (see rltrace._crash).
ESCAPED_PHASES = "_rltrace_phases"


def _record_error(span, name: str, error: BaseException | str) -> None:
    """Mark a span as failed: an `exception` event and status ERROR (a string gives the status only)."""
    if isinstance(error, BaseException):
        span.record_exception(error, escaped=True)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        ctx = span.get_span_context()
        try:
            getattr(error, "__dict__", {}).setdefault(ESCAPED_PHASES, []).append(
                (name, (span.attributes or {}).get(_names.STEP), f"{ctx.span_id:016x}")
            )
        except Exception:  # an exception type without a __dict__ keeps its phases on the spans only
            pass
    else:
        span.set_status(Status(StatusCode.ERROR, str(error)))


class Phase:
    """A span for one RL phase: a context manager (`with`) and a decorator (sync and async).

    `with rltrace.phase("reward", step=3) as p: ...; p.set(n=64)` records span `reward` with
    `rl.phase`, `rl.step`, `rl.weight_version` and `rl.<key>` attributes. `step` and
    `weight_version` default to the enclosing phase's. An exception is recorded as an
    `exception` event with status ERROR and re-raised.
    """

    __slots__ = ("name", "_step", "_weight_version", "_attrs", "_span", "_token")

    def __init__(self, name: str, step: int | None, weight_version: int | None, attrs: dict[str, Any]):
        if not isinstance(name, str) or not name:
            raise ValueError(f"phase name must be a non-empty string, got {name!r}")
        self.name = name
        self._step = None if step is None else _as_int("step", step)
        self._weight_version = None if weight_version is None else _as_int("weight_version", weight_version)
        self._attrs = _attributes(attrs)
        self._span = None
        self._token = None

    def __enter__(self) -> Phase:
        run = _run if _run is not None else recording_run()
        if run is None:
            return self
        if self._span is not None:
            raise RuntimeError(f"phase {self.name!r} is already running: call rltrace.phase() again for a new span")
        try:
            self._span = _start_span(run, self.name, self._step, self._weight_version, self._attrs)
            self._token = context.attach(set_span_in_context(self._span))
        except Exception:
            self._span = self._token = None
            _internal_error(f"starting phase {self.name!r}")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        span, token = self._span, self._token
        if span is None:
            return
        self._span = self._token = None
        try:
            _ending(span)
            if exc is not None:
                _record_error(span, self.name, exc)
            span.end()
        except Exception:
            _internal_error(f"ending phase {self.name!r}")
        finally:
            context.detach(token)

    def set(self, **attrs: Any) -> None:
        """Add attributes to the running span (`rl.<key>`), e.g. sizes known only at the end."""
        values = _attributes(attrs)
        for key, name in ((_names.STEP, "step"), (_names.WEIGHT_VERSION, "weight_version")):
            if key in values:  # rltrace's own integers: checked as in phase()
                values[key] = _as_int(name, values[key])
        span, run = self._span, _run
        if span is not None:
            current = span.attributes
            if run is not None and len(current) + len(values) > run.max_attributes:
                present = sum(1 for key in current if key not in _names.RESERVED_ATTRS)
                values = _within_limit(run, values, present, current)
            span.set_attributes(values)

    @property
    def span(self):
        """The OpenTelemetry span (None outside `with` or when not recording)."""
        return self._span

    @property
    def trace_id(self) -> str | None:
        return None if self._span is None else f"{self._span.get_span_context().trace_id:032x}"

    @property
    def span_id(self) -> str | None:
        return None if self._span is None else f"{self._span.get_span_context().span_id:016x}"

    def __call__(self, fn: Callable) -> Callable:
        name, step, version, attrs = self.name, self._step, self._weight_version, self._attrs

        def fresh() -> Phase:
            p = Phase.__new__(Phase)
            p.name, p._step, p._weight_version, p._attrs, p._span, p._token = name, step, version, attrs, None, None
            return p

        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            warnings.warn(
                f"rltrace.phase({name!r}) cannot time generator function {fn.__qualname__}: the span would end "
                "when the generator is created. Wrap the loop that consumes it in `with rltrace.phase(...)` instead.",
                stacklevel=2,
            )
            return fn
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                with fresh():
                    return await fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with fresh():
                return fn(*args, **kwargs)

        return wrapper


def phase(name: str, *, step: int | None = None, weight_version: int | None = None, **attrs: Any) -> Phase:
    """Record an RL phase as a span. See `Phase`.

    Example:
        >>> with rltrace.phase("weight_sync", step=7, method="object_store") as p:
        ...     nbytes = push_weights()
        ...     p.set(bytes=nbytes)
    """
    return Phase(name, step, weight_version, attrs)


# --- callback-style phases ----------------------------------------------------------------------
_local = threading.local()  # .stack: this thread's handles in start order (context to restore)
_open_handles: dict[int, PhaseHandle] = {}  # every recording handle not yet ended, for crash and exit
os.register_at_fork(after_in_child=_open_handles.clear)  # a forked child must not end its parent's phases


def _stack() -> list[PhaseHandle]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _unwind() -> None:
    """Restore the context of this thread past handles that have ended, innermost first."""
    stack = _stack()
    while stack and stack[-1]._ended and context.get_current() is stack[-1]._ctx:
        context.detach(stack.pop()._token)


class PhaseHandle:
    """A phase opened by `start_phase` and closed by `end()`: for frameworks that hand out
    begin/end events (callbacks) instead of a block to wrap.

    It nests and inherits `step`/`weight_version` like `phase`: until it ends, phases started
    in the same thread are its children. Misuse (ending twice, out of order, from another
    thread) is a warning; the span is still recorded, and the training loop never breaks.
    """

    __slots__ = ("name", "_span", "_token", "_ctx", "_thread", "_ended")

    def __init__(self, name: str):
        self.name = name
        self._span = self._token = self._ctx = None
        self._thread = threading.get_ident()
        self._ended = False

    def end(self, error: BaseException | str | None = None) -> None:
        """Close the phase; `error` (an exception or a message) records it as failed (status ERROR)."""
        if self._ended:
            warnings.warn(f"rltrace: phase {self.name!r} was already ended; this end() is ignored", stacklevel=2)
            return
        self._ended = True
        span = self._span
        if span is None:
            return
        _open_handles.pop(id(self), None)
        try:
            _ending(span)
            if error is not None:
                _record_error(span, self.name, error)
            span.end()
        except Exception:
            _internal_error(f"ending phase {self.name!r}")
        if threading.get_ident() != self._thread:
            warnings.warn(
                f"rltrace: phase {self.name!r} was ended in thread {threading.current_thread().name!r}, not the "
                "thread that started it; it is recorded, and that thread's next phases stop nesting under it "
                "when it starts or ends another one",
                stacklevel=2,
            )
            return
        if context.get_current() is not self._ctx:
            inner = get_current_span()
            inner_name = getattr(inner, "name", None) if inner.is_recording() else None
            warnings.warn(
                f"rltrace: phase {self.name!r} was not the innermost open phase when it ended (the current one is "
                + (f"{inner_name!r}" if inner_name else "none")
                + "); end phases in the reverse order they started. It is recorded",
                stacklevel=2,
            )
        _unwind()

    def set(self, **attrs: Any) -> None:
        """Add attributes to the open span (`rl.<key>`)."""
        values = _attributes(attrs)
        if self._span is not None and not self._ended:
            self._span.set_attributes(values)

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def span(self):
        """The OpenTelemetry span (None when not recording)."""
        return self._span

    @property
    def span_id(self) -> str | None:
        return None if self._span is None else f"{self._span.get_span_context().span_id:016x}"

    def __repr__(self) -> str:
        return f"PhaseHandle({self.name!r}, {'ended' if self._ended else 'open'})"


def start_phase(name: str, *, step: int | None = None, weight_version: int | None = None, **attrs: Any) -> PhaseHandle:
    """Open a phase now and return its handle; close it with `handle.end()` from a later call.

    Example (a framework callback):
        >>> def on_step_begin(self, step):
        ...     self.handle = rltrace.start_phase("step", step=step)
        >>> def on_step_end(self):
        ...     self.handle.end()          # or .end(error=exc) when the step failed
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"phase name must be a non-empty string, got {name!r}")
    step = None if step is None else _as_int("step", step)
    weight_version = None if weight_version is None else _as_int("weight_version", weight_version)
    values = _attributes(attrs)
    handle = PhaseHandle(name)
    run = _run if _run is not None else recording_run()
    if run is None:
        return handle
    try:
        _unwind()
        span = _start_span(run, name, step, weight_version, values)
        handle._ctx = set_span_in_context(span)
        handle._token = context.attach(handle._ctx)
        handle._span = span
        _stack().append(handle)
        _open_handles[id(handle)] = handle
    except Exception:
        _internal_error(f"starting phase {name!r}")
    return handle


def _crashed(exc: BaseException, *, thread: threading.Thread | None = None, kind: str = "process") -> bool:
    """Record an uncaught exception as a crash (rltrace._crash's hooks call this): the phases still
    open in the dying thread (or process) end with it. False when this process records nothing: a
    process that never started recording (a helper probing `python -c "import apex"` under
    `rltrace run`, say) is not one of the run's."""
    run = current_run()  # never starts one
    if run is None:
        return False
    thread = thread or threading.current_thread()
    end_open_phases(exc, thread=None if kind == "process" else thread.ident)
    _crash.record(run, exc, list(getattr(exc, ESCAPED_PHASES, None) or []), thread=thread, kind=kind)
    return True


_crash.set_recorder(_crashed)


def end_open_phases(error: BaseException | str, *, thread: int | None = None) -> list[PhaseHandle]:
    """End every handle still open (in `thread` only, if given) with `error`; innermost first.

    Used when an exception escapes to the top of a thread or the process exits with phases open.
    """
    handles = [h for h in list(_open_handles.values()) if thread is None or h._thread == thread]
    for handle in reversed(handles):
        if handle._ended:
            continue
        handle._ended = True
        _open_handles.pop(id(handle), None)
        try:
            _record_error(handle._span, handle.name, error)
            handle._span.end()
        except Exception:
            _internal_error(f"ending phase {handle.name!r}")
    return handles


# --- metrics and samples -----------------------------------------------------------------------
def log_metrics(step: int, **scalars: Any) -> None:
    """Record step-level scalars: `rltrace.log_metrics(step, reward_mean=0.4, loss=1.2)`.

    Values are numbers: Python or numpy numbers, 0-d tensors of any dtype (bf16 too), with or
    without grad. A 0-d CUDA tensor is copied here (no device sync on this thread) and read on the
    writer thread once the copy is done; any other value is converted with `float()` here (a
    1-element tensor of more dimensions syncs its device). Writing happens on a background thread.
    """
    run = _run if _run is not None else recording_run()
    if run is None or not scalars:
        return
    step = _as_int("step", step)
    values = {name: _metric_value(name, value) for name, value in scalars.items()}
    now = time.time_ns()
    process, drops = run.process, run.drops
    build = lambda: store_rows.metrics_table(step, values, now, process, drops=drops)  # noqa: E731
    run.submit_rows(_names.METRICS_TABLE, len(values), build)


def log_samples(step: int, rows: Iterable[Mapping[str, Any]] | pa.Table | Any) -> None:
    """Record one row per sample: a list of dicts, a dict of columns, a pyarrow Table or a DataFrame.

    The per-sample columns rltrace reads (`sample_id`, `group_id`, `prompt_len`, `response_len`,
    `finish_reason`, `reward`, `weight_version`, `train_version`, `gen_start`, `gen_end`) are
    stored with fixed types; ids (`sample_id`, `group_id`, any `*_id`) as text, so integer and
    string ids both work; any other column is kept as it comes. A row with a value its column
    cannot hold is dropped alone and counted with the reason (`rltrace info`). Values that are 0-d
    tensors (any dtype, any device, with or without grad) or numpy scalars are stored as the numbers
    they hold. The caller pays only for a shallow copy; conversion to Arrow and the write happen on
    the background writer, so do not change the rows or their tensors in place after the call
    (CUDA tensors are read there on the default stream: made on a side stream, synchronise it first).
    """
    run = _run if _run is not None else recording_run()
    if run is None:
        return
    step = _as_int("step", step)
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    if isinstance(rows, pa.Table):
        names, nrows, payload = rows.column_names, rows.num_rows, rows
    elif isinstance(rows, Mapping):
        names = list(rows)
        payload = {k: list(v) for k, v in rows.items()}
        lengths = {len(v) for v in payload.values()}
        if len(lengths) > 1:
            raise ValueError(f"log_samples: columns have different lengths {sorted(lengths)}; give one value per sample")
        nrows = lengths.pop() if lengths else 0
    elif isinstance(rows, (list, tuple)):
        payload = list(rows)  # the caller pays for a shallow copy only: later rows are checked on the writer
        if payload and not isinstance(payload[0], Mapping):
            raise TypeError(f"log_samples: rows must be dicts (one per sample), got {type(payload[0]).__name__}")
        names, nrows = (list(payload[0]) if payload else []), len(payload)
    elif hasattr(rows, "__arrow_c_stream__") or hasattr(rows, "to_dict"):
        payload = rows
        names, nrows = [str(c) for c in getattr(rows, "columns", [])], len(rows)
    else:
        raise TypeError(f"log_samples: rows must be a list of dicts, a dict of columns or a table, got {type(rows).__name__}")
    clash = store_rows.RESERVED_SAMPLE_COLUMNS.intersection(names)
    if clash:
        raise ValueError(f"log_samples: column(s) {sorted(clash)} are set by rltrace itself; rename yours")
    if nrows == 0:
        return
    now = time.time_ns()
    process, drops = run.process, run.drops
    run.submit_rows(_names.SAMPLES, nrows, lambda: store_rows.samples_table(step, payload, now, process, drops=drops))


# --- context across processes ------------------------------------------------------------------
def inject() -> dict[str, str]:
    """A carrier for the current phase (W3C `traceparent`, plus `baggage` with step and version).

    Pass it to another process (a Ray call argument, an HTTP header, an env var) and call
    `rltrace.attach(carrier)` there, so the remote spans become children of this one.
    """
    run = _run if _run is not None else recording_run()
    if run is None:
        return {}
    ctx = context.get_current()
    step, version = _inherited(get_current_span(ctx))
    if step is not None:
        ctx = baggage.set_baggage(_names.STEP, str(step), ctx)
    if version is not None:
        ctx = baggage.set_baggage(_names.WEIGHT_VERSION, str(version), ctx)
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    parent = carrier.get("traceparent")
    if parent is not None:
        with _injected_lock:
            _injected[parent] = None
            if len(_injected) > _INJECTED_KEPT:
                _injected.popitem(last=False)
    return carrier


class Attachment:
    """A remote parent made current by `attach`; `with` (or `.detach()`) restores the old context."""

    def __init__(self, token):
        self._token = token

    def detach(self) -> None:
        if self._token is not None:
            context.detach(self._token)
            self._token = None

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


def attach(carrier: Mapping[str, str] | None = None) -> Attachment:
    """Continue a trace from `inject()` of another process: `with rltrace.attach(carrier): ...`.

    With no carrier, reads the `TRACEPARENT`/`TRACESTATE`/`BAGGAGE` environment variables
    (the spec's names for a parent handed to a child process).
    """
    if carrier is None:
        carrier = {k.lower(): v for k in ("TRACEPARENT", "TRACESTATE", "BAGGAGE") if (v := os.environ.get(k))}
    if not carrier:
        return Attachment(None)
    _note_parent(carrier.get("traceparent"))
    return Attachment(context.attach(_PROPAGATOR.extract(dict(carrier))))


def _note_parent(traceparent: str | None) -> None:
    """Remember that a parent came from another process (not one of this process's own carriers)."""
    global _remote_parent
    if _remote_parent or traceparent is None:  # known already: init warns if the role is then defaulted
        return
    with _injected_lock:
        local = traceparent in _injected
    if not local:
        _remote_parent = True
        _warn_if_default_role(stacklevel=4)


def _warn_if_default_role(stacklevel: int) -> None:
    """Once per process: it continues another process's trace but records under the default role."""
    global _role_warned
    if _role_warned or not (_remote_parent and _default_role and _run is not None):
        return
    _role_warned = True
    warnings.warn(
        f"rltrace: this process continues a trace from another process but records as role {_run.role!r}, "
        "the default; pass role= to rltrace.init (e.g. role='rollout') or set RLTRACE_ROLE",
        stacklevel=stacklevel,
    )
