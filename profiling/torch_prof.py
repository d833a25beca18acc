"""torch.profiler windows: one trace per chosen phase run, tied to that phase's span.

torch.profiler records the operators of the thread that started it, so `start` and `stop` run
on the phase's own thread (in the span's start and end hooks); exporting the trace and
summing the top operators happen later on rltrace's profiling thread. The schedule
(`wait=0, warmup=1, active=1`) keeps Kineto's set-up out of the recorded window, and each
window is one phase run, so memory stays bounded by what one phase does.
"""

from __future__ import annotations

from pathlib import Path

from rltrace.profiling.policy import ProfilePolicy
from rltrace.profiling.pyspy import Frame
from rltrace.profiling.records import Capture

_HIDDEN = ("ProfilerStep",)  # the schedule's own step marker, not user work


def warm_up() -> None:
    """Import what the profiler's first start imports (torch._inductor.config: ~1.6 s on 2 cores),
    on rltrace's thread, so the first window does not stall the training thread."""
    import torch
    import torch.profiler  # noqa: F401

    hasattr(torch, "_inductor")  # torch imports torch._inductor lazily on first access


def start(capture: Capture, policy: ProfilePolicy) -> None:
    """Begin recording this thread (call on the phase's thread). Raises if the profiler cannot start."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    if torch.autograd.profiler._is_profiler_enabled:  # the user's own profiler: starting ours would end it
        raise RuntimeError("another torch profiler is already recording; this window is skipped")
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
        record_shapes=policy.record_shapes,
        with_stack=policy.with_stack,
    )
    profiler.start()  # warm-up: Kineto prepares, nothing recorded yet
    profiler.step()  # recording from here to the end of the phase
    capture.torch_profiler = profiler


def stop(capture: Capture) -> None:
    """End recording at the end of the phase (on its thread); the trace waits in memory for `export`."""
    profiler = capture.torch_profiler
    profiler.step()  # closes the active step: the schedule saves the trace
    profiler.stop()


def export(capture: Capture, path: Path, top: int = 20) -> None:
    """Write the Chrome trace (gzip, for Perfetto) and keep the top operators by self time."""
    profiler = capture.torch_profiler
    capture.torch_profiler = None
    profiler.export_chrome_trace(str(path))
    averages = [e for e in profiler.key_averages() if not e.key.startswith(_HIDDEN)]
    capture.samples = sum(e.count for e in averages)
    capture.frames = _top(averages, "self_cpu_time_total", "cpu_time_total", "cpu", top)
    if any(getattr(e, "self_device_time_total", 0) for e in averages):
        capture.frames += _top(averages, "self_device_time_total", "device_time_total", "cuda", top)


def _top(averages: list, self_key: str, total_key: str, label: str, top: int) -> list[Frame]:
    selfs = [(getattr(e, self_key, 0) or 0, e) for e in averages]
    whole = sum(s for s, _ in selfs)
    if whole <= 0:
        return []
    ranked = sorted((item for item in selfs if item[0] > 0), key=lambda item: -item[0])[:top]
    return [
        Frame(e.key, None, None, s / whole, min(1.0, (getattr(e, total_key, 0) or 0) / whole), int(s), label)
        for s, e in ranked
    ]
