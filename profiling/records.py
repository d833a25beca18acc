"""A profile being taken (`Capture`) and how it lands in the store.

Each capture writes its artefact under `RUN_DIR/profiles/files/<process_id>/`, one `profiles`
row (`profiles/<process_id>-<profile_id>.parquet`, written as `running` when it starts and
replaced atomically by the final row) and its top frames (`profile_frames/`). While the phase
is still running the span gets the profile id as attribute `rl.profile_id` and an event
`rltrace.profile` with the status, so a failure is visible on the span itself.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rltrace import _names
from rltrace.profiling.pyspy import Frame, Recording
from rltrace.store import rows
from rltrace._names import safe_name
from rltrace.store.parts import write_part
from rltrace.store.writer import ProcessInfo

logger = logging.getLogger("rltrace")

PROFILE_ID_ATTR = "rl.profile_id"
PROFILE_EVENT = "rltrace.profile"


@dataclass
class Capture:
    """One profile: what it explains (the span), why it was taken, and how it ended."""

    kind: str  # pyspy_record / pyspy_dump / torch
    trigger: str  # slow / hang / window / manual
    reason: str
    span: Any  # the live OTel span (None once forgotten); events go on it while it runs
    trace_id: str
    span_id: str
    span_name: str
    phase: str | None
    step: int | None
    native_thread_id: int | None
    elapsed_s: float | None = None
    threshold_s: float | None = None
    median_s: float | None = None
    profile_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    path: str | None = None  # relative to the run dir
    status: str = "running"
    message: str = ""
    samples: int | None = None
    command: list[str] | None = None
    started_ns: int = field(default_factory=time.time_ns)
    ended_ns: int | None = None
    frames: list[Frame] = field(default_factory=list)
    recording: Recording | None = None  # py-spy record in flight
    phase_ended: bool = False
    torch_profiler: Any = None
    # py-spy record: the phase's thread and window, to clip the recording to the phase
    thread_ident: int | None = None  # threading.get_ident() of the phase's thread (py-spy's trace `tid`)
    thread_name: str | None = None
    phase_start_ns: int | None = None
    phase_end_ns: int | None = None  # set when the phase ends while recorded
    launched_ns: int | None = None  # just before py-spy was started: the trace's time zero, to within its start-up
    busy_start_ns: int | None = None  # the thread's run + run-queue time then (pyspy.thread_busy_ns) ...
    busy_end_ns: int | None = None  # ... and when the phase ended
    inside_share: float | None = None
    idle_share: float | None = None
    stacks: str | None = None  # py-spy record: folded stacks inside the phase (pyspy.folded_stacks)

    def end(self, status: str, message: str = "") -> None:
        self.status, self.message = status, message
        if self.ended_ns is None:
            self.ended_ns = time.time_ns()


def artefact(run_dir: Path, process: ProcessInfo, capture: Capture, suffix: str) -> Path:
    """Where this capture's file goes; sets `capture.path` (relative to the run dir)."""
    step = "" if capture.step is None else f"-step{capture.step}"
    name = f"{capture.profile_id}-{safe_name(capture.phase or capture.span_name)}{step}{suffix}"
    relative = Path(_names.PROFILE_FILES) / safe_name(process.process_id) / name
    (run_dir / relative).parent.mkdir(parents=True, exist_ok=True)
    capture.path = relative.as_posix()
    return run_dir / relative


def size_of(run_dir: Path, capture: Capture) -> int | None:
    if capture.path is None:
        return None
    try:
        return (run_dir / capture.path).stat().st_size
    except OSError:
        return None


def write(run_dir: Path, process: ProcessInfo, capture: Capture) -> None:
    """Write (or rewrite) the capture's `profiles` row, and its frames once it has ended.

    A profile row is a record rewritten in place as the capture moves from running to done (like
    a process's heartbeat row), on the watchdog's thread, never the training thread; so it does
    not go through the append-only background writer."""
    row = {
        "profile_id": capture.profile_id,
        "trace_id": capture.trace_id,
        "span_id": capture.span_id,
        "span_name": capture.span_name,
        "phase": capture.phase,
        "step": capture.step,
        **rows.who(process),
        "native_thread_id": capture.native_thread_id,
        "kind": capture.kind,
        "trigger": capture.trigger,
        "reason": capture.reason,
        "elapsed_s": capture.elapsed_s,
        "threshold_s": capture.threshold_s,
        "median_s": capture.median_s,
        "path": capture.path if size_of(run_dir, capture) is not None else None,
        "size_bytes": size_of(run_dir, capture),
        "status": capture.status,
        "message": capture.message or None,
        "samples": capture.samples,
        "inside_share": capture.inside_share,
        "idle_share": capture.idle_share,
        "stacks": capture.stacks or None,
        "command": json.dumps(capture.command) if capture.command else None,
        "started_ns": capture.started_ns,
        "ended_ns": capture.ended_ns,
    }
    name = f"{process.process_id}-{capture.profile_id}.parquet"
    if capture.status != "running" and capture.frames:
        frames = pa.Table.from_pylist(
            [{"profile_id": capture.profile_id, "rank": i, **f._asdict()} for i, f in enumerate(capture.frames)],
            schema=_names.PROFILE_FRAMES_SCHEMA,
        )
        write_part(run_dir / _names.PROFILE_FRAMES.folder, name, frames, _names.PROFILE_FRAMES)
    table = pa.Table.from_pylist([row], schema=_names.PROFILES_SCHEMA)
    write_part(run_dir / _names.PROFILES.folder, name, table, _names.PROFILES)


def mark_span(capture: Capture) -> None:
    """Tell the span (if it is still running) about the profile: its id, and an event with the status."""
    span = capture.span
    if span is None or not span.is_recording():
        return
    try:
        span.set_attribute(PROFILE_ID_ATTR, capture.profile_id)
        attrs = {
            "profile_id": capture.profile_id,
            "kind": capture.kind,
            "trigger": capture.trigger,
            "status": capture.status,
        }
        if capture.message:
            attrs["message"] = capture.message
        if capture.path and capture.status in ("running", "ok"):
            attrs["path"] = capture.path
        span.add_event(PROFILE_EVENT, attrs)
    except Exception:  # the span ended meanwhile: the profiles row still says everything
        logger.debug("rltrace: could not mark span %s with profile %s", capture.span_id, capture.profile_id)
