"""Taking each kind of profile, from its start to its stored row: the steps that run on rltrace's
profiling thread (and, for starting py-spy, on the watchdog thread). Failures end as a status on
the capture, never as an exception into the training loop."""

from __future__ import annotations

import logging
import os
import signal
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
        path = records.artefact(self.run_dir, self.process, capture, ".speedscope.json")
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
                frames, samples, note = pyspy.speedscope_frames(path, os.getpid(), capture.native_thread_id)
            except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                capture.end("failed", f"py-spy wrote {capture.path} but it could not be read: {exc}")
            else:
                capture.frames, capture.samples = frames, samples
                if frames:
                    capture.end("ok", note)
                else:
                    capture.end(
                        "no_samples",
                        "py-spy took no samples during the phase: it ended before sampling started, or every "
                        "thread was idle (waiting); add idle to RLTRACE_PYSPY_FLAGS to see where it waits",
                    )
        records.mark_span(capture)
        self.write(capture)

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
