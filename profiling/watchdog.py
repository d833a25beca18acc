"""The watchdog: an OpenTelemetry span processor that notices slow and hung phases while they run.

`on_start`/`on_end` run on the training thread and only note the phase in a dict and, at the
end, its duration in a bounded per-phase history (about a microsecond; no I/O, no waiting).
One daemon thread (`rltrace-watchdog`) wakes a few times a second, compares each running
phase's age with its limits and starts py-spy; a second thread (`rltrace-profiler`, started
with the first profile) stops recordings, runs dumps, exports traces and writes the rows.
torch.profiler windows are the exception: the profiler records the thread that starts it, so
a window starts and stops inside the phase's own hooks (only for the phases and steps chosen).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import statistics
import threading
import time
from pathlib import Path
from typing import Callable

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from rltrace import _names
from rltrace.profiling import pyspy, records, torch_prof
from rltrace.profiling.captures import Capturer
from rltrace.profiling.policy import ProfilePolicy, pyspy_executable
from rltrace.profiling.records import Capture
from rltrace.store.writer import after_fork_in_child

logger = logging.getLogger("rltrace")

HISTORY = 50  # finished runs per phase kept for the rolling median
MAX_PHASES = 1000  # phase names tracked; more (generated names) are not given a median
_TICK_S = 0.1


def _internal_error(what: str) -> None:
    if "PYTEST_CURRENT_TEST" in os.environ:
        raise
    logger.exception("rltrace: profiling %s failed; your code still runs", what)


class _Running:
    """A phase that has started and not ended."""

    __slots__ = ("span", "phase", "step", "start_ns", "native_thread_id", "thread", "recorded", "dumped", "torch")

    def __init__(self, span: Span, phase: str, step, start_ns: int, native_thread_id: int,
                 thread: threading.Thread | None = None):
        self.span, self.phase, self.step, self.start_ns, self.native_thread_id = (
            span,
            phase,
            step,
            start_ns,
            native_thread_id,
        )
        self.thread = thread if thread is not None else threading.current_thread()
        self.recorded = self.dumped = False
        self.torch: Capture | None = None


class Watchdog(SpanProcessor):
    """Profiles phases by `policy`; add it with `run.add_span_processor` (see `rltrace.profiling.arm`)."""

    def __init__(self, run_dir: Path, process, rank: int | None, policy: ProfilePolicy):
        self.run_dir = Path(run_dir)
        self.process = process
        self.policy = policy
        self._capturer = Capturer(self.run_dir, process, pyspy_executable(policy.pyspy), policy)
        self._after = dict(policy.thresholds())
        self._phases = set(policy.phases) if policy.phases else None
        self._windows = tuple(policy.torch or ()) if not (policy.torch_rank0_only and rank not in (None, 0)) else ()
        self._window_phases = frozenset(w.phase for w in self._windows)
        limits = [policy.min_seconds, policy.hang_timeout, *self._after.values()]
        self._tick_s = min([_TICK_S] + [limit / 4 for limit in limits if limit])
        self._start()
        after_fork_in_child(self._start)

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}
        self._history: dict[str, collections.deque] = {}
        self._recording: Capture | None = None
        self._torch_busy = False
        self._dumping = 0  # dumps queued or running: no recording starts meanwhile
        self._count = 0
        self._closed = False
        self._wake = threading.Event()
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._thread = threading.Thread(target=self._watch, name="rltrace-watchdog", daemon=True)
        self._thread.start()
        if self._windows:
            self._submit(self._warm_up)

    @staticmethod
    def _warm_up() -> None:
        try:
            torch_prof.warm_up()
        except Exception as exc:  # no torch: each window will say so on its profile row
            logger.debug("rltrace: torch.profiler warm-up failed: %s", exc)

    @property
    def has_windows(self) -> bool:
        """Whether this process takes torch.profiler windows."""
        return bool(self._windows)

    # --- span hooks (training thread) --------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            attrs = span.attributes
            phase = attrs.get(_names.PHASE) if attrs else None
            if phase is None:
                return
            running = _Running(span, phase, attrs.get(_names.STEP), span.start_time, threading.get_native_id())
            with self._lock:
                self._running[span.context.span_id] = running
            if phase in self._window_phases:
                self._start_window(running)
        except Exception:
            _internal_error("on phase start")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            with self._lock:
                running = self._running.pop(span.context.span_id, None)
                if running is None:
                    return
                history = self._history.get(running.phase)
                if history is None and len(self._history) < MAX_PHASES:
                    history = self._history[running.phase] = collections.deque(maxlen=HISTORY)
                if history is not None:
                    history.append(span.end_time - span.start_time)
            if running.torch is not None:
                self._stop_window(running.torch)
            recording = self._recording
            # the SDK hands on_end a copy of the span (a ReadableSpan), never the span itself
            if recording is not None and recording.span.context.span_id == span.context.span_id:
                recording.phase_end_ns = span.end_time
                recording.busy_end_ns = pyspy.thread_busy_ns(recording.native_thread_id)  # a /proc read, once a profile
                recording.phase_ended = True
                pyspy_run = recording.recording
                if pyspy_run is not None:
                    pyspy_run.interrupt()  # one signal, no waiting: the file is read on the profiler thread
                self._wake.set()
        except Exception:
            _internal_error("on phase end")

    def before_end(self, span: Span) -> None:
        """Stop a torch.profiler window while its phase's span is still open (the run's ending
        hook, on the phase's thread): the stop costs ~0.1 s, which belongs to the phase."""
        with self._lock:
            running = self._running.get(span.context.span_id)
        if running is not None and running.torch is not None:
            capture, running.torch = running.torch, None
            self._stop_window(capture)

    # --- the watchdog thread -----------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closed:
            self._wake.wait(self._tick_s)
            self._wake.clear()
            try:
                self._check(time.time_ns())
            except Exception:
                logger.exception("rltrace: profiling watchdog check failed; it keeps watching")

    def _check(self, now_ns: int) -> None:
        recording = self._recording
        if recording is not None:
            too_long = (now_ns - recording.started_ns) / 1e9 > self.policy.max_seconds + 5
            end_ns = recording.span.end_time  # on_end notes the end (and the thread's time) just after it is set
            ended = recording.phase_ended or (end_ns is not None and now_ns - end_ns > 1e9)
            if ended or not recording.recording.running() or too_long:
                self._recording = None
                self._submit(self._capturer.finish_record, recording)
        with self._lock:
            running = sorted(self._running.values(), key=lambda r: r.start_ns, reverse=True)  # innermost first
        hang = self.policy.hang_timeout
        memo: dict[str, float | None] = {}
        for phase in running:
            elapsed = (now_ns - phase.start_ns) / 1e9
            if hang and not phase.dumped and elapsed >= hang and self._take():
                self._dump_hang(phase, running, elapsed, hang)
            if phase.recorded or self._recording is not None or self._dumping:
                continue
            limit = self._limit(phase.phase, memo)
            if limit is not None and elapsed > limit[0] and self._take():
                for r in running:  # phases enclosing it on its thread are slow because of it: not again
                    if r.native_thread_id == phase.native_thread_id and r.start_ns <= phase.start_ns:
                        r.recorded = True
                threshold, median = limit
                if median is None:
                    reason = f"{phase.phase} ran {elapsed:.3g} s > limit {threshold:g} s"
                else:
                    reason = (
                        f"{phase.phase} ran {elapsed:.3g} s > {self.policy.slow:g} x its rolling median "
                        f"{median:.3g} s (limit {threshold:.3g} s)"
                    )
                self._start_record(self._capture(phase, "pyspy_record", "slow", reason, elapsed, threshold, median))

    def _dump_hang(self, phase: _Running, running: list[_Running], elapsed: float, hang: float) -> None:
        """One dump per hung thread, attached to the innermost phase running on it (its enclosing
        phases, which cross the timeout first, are the same hang)."""
        same_thread = [r for r in running if r.native_thread_id == phase.native_thread_id]
        for r in same_thread:
            r.dumped = True
        target = max(same_thread, key=lambda r: r.start_ns)
        reason = f"{phase.phase} open for {elapsed:.1f} s (hang timeout {hang:g} s)"
        if target is not phase:
            reason += f"; innermost running phase: {target.phase}"
        if self._recording is not None:  # py-spy attaches one at a time: end the recording first
            recording, self._recording = self._recording, None
            self._submit(self._capturer.finish_record, recording)
        with self._lock:
            self._dumping += 1
        self._submit(self._dump, self._capture(target, "pyspy_dump", "hang", reason, elapsed, hang))

    def _limit(self, phase: str, memo: dict[str, float | None]) -> tuple[float, float | None] | None:
        """(threshold_s, median_s or None) of the tightest slow rule for `phase`, or None."""
        if self._phases is not None and phase not in self._phases:
            return None
        limits = []
        after = self._after.get(phase, self._after.get("*"))
        if after:
            limits.append((after, None))
        if self.policy.slow:
            median = self._median(phase, memo)
            if median is not None:
                limits.append((max(self.policy.slow * median, self.policy.min_seconds), median))
        return min(limits, key=lambda limit: limit[0]) if limits else None

    def _median(self, phase: str, memo: dict[str, float | None]) -> float | None:
        """The rolling median of `phase` in seconds (None before `min_samples` runs), once per check."""
        if phase not in memo:
            with self._lock:
                history = self._history.get(phase)
                durations = list(history) if history is not None else []
            enough = len(durations) >= self.policy.min_samples
            memo[phase] = statistics.median(durations) / 1e9 if enough else None
        return memo[phase]

    def _take(self) -> bool:
        """Count one more profile, unless this process has taken its maximum."""
        with self._lock:
            if self._count >= self.policy.max_profiles:
                return False
            self._count += 1
        if self._count == self.policy.max_profiles:
            logger.warning("rltrace: this process took %d profiles, its maximum (RLTRACE_PROFILE_MAX)", self._count)
        return True

    def _capture(
        self, phase: _Running, kind: str, trigger: str, reason: str, elapsed=None, threshold=None, median=None
    ):
        ctx = phase.span.context
        return Capture(
            kind=kind,
            trigger=trigger,
            reason=reason,
            span=phase.span,
            trace_id=f"{ctx.trace_id:032x}",
            span_id=f"{ctx.span_id:016x}",
            span_name=phase.span.name,
            phase=phase.phase,
            step=phase.step,
            native_thread_id=phase.native_thread_id,
            elapsed_s=elapsed,
            threshold_s=threshold,
            median_s=median,
            thread_ident=phase.thread.ident,
            thread_name=phase.thread.name,
            phase_start_ns=phase.start_ns,
        )

    # --- py-spy ------------------------------------------------------------------------------
    def _start_record(self, capture: Capture) -> None:
        if self._capturer.start_record(capture):
            self._recording = capture
        self._submit(self._capturer.write, capture)

    def _dump(self, capture: Capture) -> None:
        try:
            self._capturer.dump(capture)
        finally:
            with self._lock:
                self._dumping = max(0, self._dumping - 1)

    # --- torch.profiler windows (phase thread for start/stop) --------------------------------
    def _start_window(self, phase: _Running) -> None:
        window = next((w for w in self._windows if w.covers(phase.phase, phase.step)), None)
        if window is None or self._torch_busy or not self._take():
            return
        capture = self._capture(phase, "torch", "window", f"torch.profiler window {window}")
        try:
            torch_prof.start(capture, self.policy)
        except Exception as exc:  # torch missing, or another profiler already running
            capture.end("failed", f"torch.profiler could not start: {type(exc).__name__}: {exc}")
            records.mark_span(capture)
            self._submit(self._capturer.write, capture)
            return
        self._torch_busy = True
        phase.torch = capture
        records.mark_span(capture)
        self._submit(self._capturer.write, capture)

    def _stop_window(self, capture: Capture) -> None:
        self._torch_busy = False
        try:
            torch_prof.stop(capture)
            capture.ended_ns = time.time_ns()
        except Exception as exc:
            capture.torch_profiler = None
            capture.end("failed", f"torch.profiler could not stop: {type(exc).__name__}: {exc}")
            self._submit(self._capturer.write, capture)
            return
        self._submit(self._capturer.export_window, capture)

    # --- the profiling thread ----------------------------------------------------------------
    def _submit(self, task: Callable, *args) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="rltrace-profiler", daemon=True)
            self._worker.start()
        self._tasks.put((task, args))

    def _work(self) -> None:
        while True:
            task, args = self._tasks.get()
            if task is None:
                return
            try:
                task(*args)
            except Exception:
                logger.exception("rltrace: a profiling task failed; the run goes on")

    def dump_now(self, span: Span, reason: str) -> str | None:
        """Queue a stack dump attached to the running phase `span` (trigger `manual`)."""
        with self._lock:
            phase = self._running.get(span.context.span_id)
        if phase is None:  # started before profiling was armed: it runs on the calling thread
            attrs = span.attributes or {}
            phase = _Running(
                span, attrs.get(_names.PHASE), attrs.get(_names.STEP), span.start_time, threading.get_native_id()
            )
        if not self._take():
            return None
        capture = self._capture(phase, "pyspy_dump", "manual", reason)
        with self._lock:
            self._dumping += 1
        self._submit(self._dump, capture)
        return capture.profile_id

    def shutdown(self) -> None:
        """Stop watching; finish a recording in flight and the queued work (bounded wait)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        recording, self._recording = self._recording, None
        if recording is not None:
            self._submit(self._capturer.finish_record, recording)
        if self._worker is not None:
            self._tasks.put((None, ()))
            self._worker.join(timeout=30)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
