"""Taking each kind of profile, from its start to its stored row: the steps that run on rltrace's
profiling thread (and, for starting py-spy, on the watchdog thread). Failures end as a status on
the capture, never as an exception into the training loop."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rltrace.profiling import pyspy, records, torch_prof
from rltrace.profiling.policy import ProfilePolicy
from rltrace.profiling.records import Capture
from rltrace.store.writer import ProcessInfo

logger = logging.getLogger("rltrace")


@dataclass
class Capturer:
    """Where captures go (the run dir, as which process) and how they are taken (py-spy, policy)."""

    run_dir: Path
    process: ProcessInfo
    executable: str  # py-spy
    policy: ProfilePolicy

    def write(self, capture: Capture) -> None:
        """Store the capture's row (and frames once it ended); a failure is logged, not raised."""
        try:
            records.write(self.run_dir, self.process, capture)
        except Exception as exc:
            logger.warning("rltrace: could not store profile %s: %s", capture.profile_id, exc)

    # --- py-spy record ----------------------------------------------------------------------
    def start_record(self, capture: Capture) -> bool:
        """Launch `py-spy record` on this process; False (and the capture ended) if it cannot run."""
        path = records.artefact(self.run_dir, self.process, capture, ".pyspy.trace.json")
        policy = self.policy
        capture.command = pyspy.record_command(
            self.executable,
            os.getpid(),
            path,
            rate=policy.rate,
            max_seconds=policy.max_seconds,
            flags=policy.pyspy_flags,
        )
        records.mark_span(capture)  # before py-spy starts: a phase that ends meanwhile still names its profile
        capture.busy_start_ns = pyspy.thread_busy_ns(capture.native_thread_id)
        capture.launched_ns = time.time_ns()
        try:
            capture.recording = pyspy.start_record(capture.command)
        except OSError as exc:
            capture.end(*pyspy.missing_message(self.executable, exc))
            records.mark_span(capture)
        return capture.recording is not None

    def finish_record(self, capture: Capture) -> None:
        """Stop py-spy (it writes its file), read the top frames, store the row."""
        returncode, output = capture.recording.stop()
        capture.recording = None
        path = self.run_dir / capture.path
        if returncode == -signal.SIGINT:  # stopped before py-spy had set up its Control-C handler
            capture.end("no_samples", "the phase ended before py-spy started sampling")
        elif returncode is None and not pyspy.started_sampling(output):
            # still attaching (py-spy reads the process's memory maps first, slow in a large
            # process), where it does not answer Control-C: it was killed, and nothing was sampled
            capture.end("no_samples", "the phase ended while py-spy was still attaching to the process "
                                      "(it did not stop when asked and was killed)")
        elif returncode != 0 or not path.is_file():
            capture.end(*pyspy.classify(returncode, output, os.getpid()))
        else:
            try:
                self._clip(capture, path)
            except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                capture.end("failed", f"py-spy wrote {capture.path} but it could not be read: {exc}")
        records.mark_span(capture)
        self.write(capture)

    def _clip(self, capture: Capture, path: Path) -> None:
        """The frames of the phase's own thread inside the phase; the share of its samples that
        were, and of its time it was blocked; a status saying when nothing of the phase was caught."""
        ended = getattr(capture.span, "end_time", None)
        end_ns = capture.phase_end_ns or ended or time.time_ns()
        if ended is None:  # still running (the recording hit its cap)
            capture.busy_end_ns = pyspy.thread_busy_ns(capture.native_thread_id)
        zero = capture.launched_ns or capture.started_ns
        window = ((capture.phase_start_ns or zero) - zero) / 1e3, (end_ns - zero) / 1e3
        label = f"{capture.thread_name or 'thread'} ({capture.native_thread_id})"
        clipped = pyspy.chrome_frames(path, os.getpid(), capture.thread_ident, label, window, self.policy.rate)
        capture.frames, capture.samples, capture.stacks = clipped.frames, clipped.samples, clipped.stacks
        if clipped.thread_samples:
            capture.inside_share = min(1.0, clipped.samples / clipped.thread_samples)
        recorded_ns = end_ns - zero
        if capture.busy_start_ns is not None and capture.busy_end_ns is not None and recorded_ns > 0:
            capture.idle_share = min(1.0, max(0.0, 1 - (capture.busy_end_ns - capture.busy_start_ns) / recorded_ns))
        if not clipped.samples:
            if clipped.thread_samples:
                why = (f"all {clipped.thread_samples} samples py-spy took of the phase's thread came after the phase "
                       f"ended ({clipped.after_s:.2g} s of them): it ended as py-spy began sampling")
            else:
                why = f"py-spy took no sample of the phase's thread {label}: the phase ended before sampling started"
            capture.end("no_samples", why)
        elif capture.inside_share is not None and capture.inside_share < 0.5:
            capture.end("ok", f"only {capture.inside_share:.0%} of py-spy's samples of the phase's thread fell inside "
                              "the phase (it ended soon after sampling began); the frames are from those")
        else:
            capture.end("ok")

    # --- py-spy dump -------------------------------------------------------------------------
    def dump(self, capture: Capture) -> None:
        """Dump every stack of this process and its children to a text file; store the phase thread's stack."""
        path = records.artefact(self.run_dir, self.process, capture, ".dump.txt")
        pid, flags, executable = os.getpid(), self.policy.pyspy_flags, self.executable
        capture.command = pyspy.dump_command(executable, pid, json_output=False, flags=flags)
        try:
            returncode, text = pyspy.dump_tree(executable, pid, flags)
            if returncode == 0:
                span = f"{capture.trace_id}/{capture.span_id}"
                header = f"# rltrace {capture.trigger} dump {capture.profile_id}: {capture.reason}\n# span {span}\n\n"
                path.write_text(header + text)
                returncode, text = pyspy.run_dump(pyspy.dump_command(executable, pid, json_output=True, flags=flags))
        except OSError as exc:
            capture.end(*pyspy.missing_message(executable, exc))
        else:
            if returncode != 0:
                capture.end(*pyspy.classify(returncode, text, pid))
            else:
                try:
                    capture.frames, note = pyspy.dump_frames(pyspy.dump_threads(text), capture.native_thread_id)
                    capture.samples = 1
                    capture.end("ok", note)
                except ValueError as exc:
                    capture.end("ok", f"the stacks are in the file, but py-spy's JSON could not be read: {exc}")
        records.mark_span(capture)
        self.write(capture)

    # --- torch.profiler ----------------------------------------------------------------------
    def export_window(self, capture: Capture) -> None:
        """Write a stopped window's Chrome trace and top operators; store the row."""
        path = records.artefact(self.run_dir, self.process, capture, ".pt.trace.json.gz")
        try:
            torch_prof.export(capture, path)
            capture.end("ok")
        except Exception as exc:
            capture.end("failed", f"the torch.profiler trace could not be written: {type(exc).__name__}: {exc}")
        self.write(capture)
