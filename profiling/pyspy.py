"""Running py-spy on this process and reading what it wrote.

`record` samples the process into a Chrome trace until stopped (SIGINT makes py-spy write
the file and exit) or until its `--duration` cap. `dump` prints every thread's stack once, for
hangs. Never `--nonblocking`: it reads the process while it runs and gives impossible stacks.
Every failure is returned as a (status, message) pair, never raised: profiling must not break
the loop it watches.
"""

from __future__ import annotations

import collections
import json
import math
import signal
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

_STOP_TIMEOUT_S = 10.0
_RESEND_S = 0.05  # SIGINT again this often until py-spy stops (see Recording.stop)
_DUMP_TIMEOUT_S = 20.0
MAX_CHILDREN = 16  # descendants dumped on a hang

PTRACE_HINT = (
    "py-spy needs ptrace rights on the process: run as root, or start the container with CAP_SYS_PTRACE "
    "(docker run --cap-add SYS_PTRACE; Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]), "
    "or allow it with `sysctl kernel.yama.ptrace_scope=0`"
)


class Frame(NamedTuple):
    """One row of `profile_frames` (without the profile id)."""

    frame: str
    file: str | None
    line: int | None
    self_share: float
    total_share: float
    samples: int
    thread: str


def missing_message(executable: str, exc: OSError) -> tuple[str, str]:
    if isinstance(exc, FileNotFoundError):
        return "missing_executable", (
            f"py-spy executable {executable!r} not found: pip install py-spy (or 'rltrace[profile]'), "
            "or point RLTRACE_PYSPY at it"
        )
    return "failed", f"py-spy executable {executable!r} could not be started: {exc}"


def classify(returncode: int | None, output: str, pid: int) -> tuple[str, str]:
    """(status, message) for a py-spy run that did not produce what was asked."""
    lowered = output.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered or "eperm" in lowered:
        return "permission_denied", f"py-spy may not read process {pid} (Permission Denied): {PTRACE_HINT}"
    if "no such process" in lowered:
        return "failed", f"process {pid} exited before py-spy could read it"
    lines = [line.removeprefix("py-spy> ").strip() for line in output.splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    return "failed", f"py-spy exited with status {returncode}: {last}"


@dataclass
class Recording:
    """A running `py-spy record`: its process and the unnamed file holding its output."""

    proc: subprocess.Popen
    output: IO[bytes]
    interrupted: bool = False

    def running(self) -> bool:
        return self.proc.poll() is None

    def interrupt(self) -> None:
        """Ask py-spy to stop sampling and write its file (SIGINT, like Control-C); returns at once.

        Sent the moment the phase ends, so samples of what runs after it do not join its profile."""
        if not self.interrupted:
            self.interrupted = True
            self.proc.send_signal(signal.SIGINT)  # does nothing once py-spy has exited

    def stop(self) -> tuple[int | None, str]:
        """Interrupt py-spy and wait for its file; kill it if it does not stop.

        SIGINT is sent again every `_RESEND_S`: a process started with SIGINT ignored (under
        nohup, or as a background job of a script) passes that on to py-spy, which then loses a
        SIGINT that comes before it sets up its Control-C handler."""
        self.interrupt()
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while True:
            try:
                self.proc.wait(timeout=_RESEND_S)
                returncode = self.proc.returncode
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    self.proc.kill()
                    self.proc.wait()
                    returncode = None
                    break
                self.proc.send_signal(signal.SIGINT)
        self.output.seek(0)
        text = self.output.read().decode(errors="replace")
        self.output.close()
        if returncode is None:
            text += f"\npy-spy did not stop within {_STOP_TIMEOUT_S:.0f} s after SIGINT and was killed"
        return returncode, text


def started_sampling(output: str) -> bool:
    """Whether py-spy got as far as sampling (it says so once attached: "Sampling process ...")."""
    return "Sampling process" in output


def record_command(
    executable: str, pid: int, path: Path, *, rate: int, max_seconds: float, flags: tuple[str, ...]
) -> list[str]:
    """A Chrome trace (each stack with its time, so samples are clipped to the phase) of every
    thread, idle ones too: a slow phase is as often one that waits (a sleep, a lock, I/O) as one
    that computes, and only with every sample kept does each stack's time stay its own."""
    command = [executable, "record", "--pid", str(pid), "--format", "chrometrace", "--output", str(path)]
    command += ["--duration", str(max(1, math.ceil(max_seconds))), "--rate", str(rate), "--idle"]
    return command + [f"--{flag}" for flag in flags if flag != "idle"]


def start_record(command: list[str]) -> Recording:
    """Start py-spy record; raises OSError when the executable cannot be run."""
    output = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
    except OSError:
        output.close()
        raise
    return Recording(proc, output)


def dump_command(executable: str, pid: int, *, json_output: bool, flags: tuple[str, ...]) -> list[str]:
    command = [executable, "dump", "--pid", str(pid)]
    return command + (["--json"] if json_output else []) + (["--native"] if "native" in flags else [])


def run_dump(command: list[str]) -> tuple[int | None, str]:
    """Run one py-spy dump; raises OSError when the executable cannot be run."""
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, timeout=_DUMP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy dump did not finish within {_DUMP_TIMEOUT_S:.0f} s"
    return done.returncode, done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")


def descendants(pid: int, limit: int = MAX_CHILDREN) -> list[int]:
    """Child processes of `pid`, their children, ... (Linux /proc; empty elsewhere), at most `limit`."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process exited meanwhile
        children[int(fields[1])].append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo and len(found) < limit:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found[:limit]


def dump_tree(executable: str, pid: int, flags: tuple[str, ...]) -> tuple[int | None, str]:
    """`py-spy dump` of the process, then of each descendant (py-spy's own --subprocesses fails
    when py-spy is itself a child of the process). The status is the process's own dump's."""
    children = descendants(pid)
    returncode, text = run_dump(dump_command(executable, pid, json_output=False, flags=flags))
    if returncode != 0:
        return returncode, text
    parts = [text]
    for child in children:
        code, child_text = run_dump(dump_command(executable, child, json_output=False, flags=flags))
        if code != 0:
            why = child_text.strip().splitlines()[0] if child_text.strip() else f"status {code}"
            child_text = f"Process {child}: no Python stacks ({why})\n"
        parts.append(child_text)
    return 0, ("\n" + "-" * 80 + "\n").join(parts)


# --- reading the output ---------------------------------------------------------------------
class Clipped(NamedTuple):
    """The phase's part of a recording: its thread's samples inside the phase's window."""

    frames: list[Frame]
    samples: int  # samples of the phase's thread inside the phase
    thread_samples: int  # samples of the phase's thread in the whole recording
    after_s: float  # seconds of the thread's samples that came after the phase ended
    stacks: str = ""  # folded stacks inside the phase ("outer;…;inner samples" a line, `folded_stacks`)


def chrome_frames(path: Path, pid: int, thread_ident: int | None, label: str, window_us: tuple[float, float],
                  rate: int, top: int = 20) -> Clipped:
    """Top frames by self time of the phase's thread, from the part of the recording inside the phase.

    `window_us`: the phase's start and end in the trace's microseconds (from py-spy's start).
    py-spy writes a stack once and ends it when the thread's stack changes; with every thread
    sampled each time (idle included) a stack holds from its `B` to its `E`. Samples are its
    seconds x `rate`. Frames of other threads (rltrace's writer, a data loader) are never counted."""
    events = json.loads(Path(path).read_text())
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    lo, hi = window_us
    stack: list[tuple[str, str | None, int | None]] = []
    last_ts = None
    inside: collections.Counter = collections.Counter()  # stack -> microseconds inside the window
    whole = after = 0.0
    for event in events:
        if event.get("tid") != thread_ident or event.get("pid") != pid:
            continue
        ts = float(event.get("ts", 0))
        if stack and last_ts is not None and ts > last_ts:
            whole += ts - last_ts
            overlap = min(ts, hi) - max(last_ts, lo)
            if overlap > 0:
                inside[tuple(stack)] += overlap
            after += max(0.0, ts - max(last_ts, hi))
        last_ts = ts
        args = event.get("args") or {}
        if event.get("ph") == "B":
            stack.append((event.get("name") or "?", args.get("filename"), args.get("line")))
        elif event.get("ph") == "E" and stack:
            stack.pop()
    total = sum(inside.values())
    selfs: collections.Counter = collections.Counter()
    totals: collections.Counter = collections.Counter()
    lines: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for frames, us in inside.items():
        keys = [(name, file) for name, file, _ in frames]
        selfs[keys[-1]] += us
        lines[keys[-1]][frames[-1][2]] += us
        for key in set(keys):
            totals[key] += us
    per_sample = 1e6 / rate
    out = [
        Frame(name, file, lines[(name, file)].most_common(1)[0][0], us / total, totals[(name, file)] / total,
              max(1, round(us / per_sample)), label)
        for (name, file), us in selfs.most_common(top)
    ] if total else []
    return Clipped(out, round(total / per_sample), round(whole / per_sample), after / 1e6,
                   folded_stacks({k: us / per_sample for k, us in inside.items()}))


MAX_STACKS = 200  # distinct stacks kept with a profile (the most sampled): its flame graph, bounded
MAX_DEPTH = 64  # frames kept of one stack, outermost first


def folded_stacks(samples: Mapping[tuple, float]) -> str:
    """Brendan Gregg's folded format of {stack of (name, file, line), outermost first: samples}: one
    "outer;…;inner N" line per stack, the MAX_STACKS most sampled, each cut to MAX_DEPTH frames;
    a frame is "name (file's base name)". Bounded (~ MAX_STACKS x MAX_DEPTH frames) so it can be
    stored with the profile's record and drawn without the recording."""
    merged: collections.Counter = collections.Counter()
    for stack, n in samples.items():
        key = ";".join((f"{name} ({Path(file).name})" if file else str(name)).replace(";", ",")
                       for name, file, _ in stack[:MAX_DEPTH]).replace("\n", " ")
        merged[key] += n
    return "\n".join(f"{key} {max(1, round(n))}" for key, n in merged.most_common(MAX_STACKS) if key)


def thread_busy_ns(native_thread_id: int | None) -> int | None:
    """Nanoseconds a thread of this process has run or waited for a CPU (Linux schedstat); the
    rest of its time it was blocked: sleeping, on a lock, on I/O. None where it cannot be read."""
    if native_thread_id is None:
        return None
    try:
        running, waiting, _ = Path(f"/proc/self/task/{native_thread_id}/schedstat").read_text().split()
        return int(running) + int(waiting)
    except (OSError, ValueError):
        return None


def dump_threads(text: str) -> list[dict]:
    """The threads of `py-spy dump --json` output (a list of {os_thread_id, thread_name, frames})."""
    start = text.find("[")
    threads = json.loads(text[start:]) if start >= 0 else []
    if not isinstance(threads, list):
        raise ValueError("py-spy dump --json did not print a list of threads")
    return threads


def dump_frames(threads: list[dict], thread_id: int | None) -> tuple[list[Frame], str]:
    """The stack of the phase's thread, innermost first (an active thread if it is not found)."""
    chosen = next((t for t in threads if t.get("os_thread_id") == thread_id), None)
    note = ""
    if chosen is None and threads:
        chosen = next((t for t in threads if t.get("active")), threads[0])
        note = f"the phase's thread {thread_id} was not in the dump; showing thread {chosen.get('os_thread_id')}"
    if chosen is None:
        return [], "py-spy dump listed no threads"
    state = "active" if chosen.get("active") else "idle"
    label = f"{chosen.get('thread_name') or 'thread'} ({chosen.get('os_thread_id')}, {state})"
    stack = chosen.get("frames") or []
    stuck = next((i for i, f in enumerate(stack) if not _in_stdlib(f.get("filename"))), 0)
    frames = [
        Frame(f.get("name") or "?", f.get("filename"), f.get("line"), 1.0 if i == stuck else 0.0, 1.0, 1, label)
        for i, f in enumerate(stack)
    ]
    return frames, note


_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def _in_stdlib(filename: str | None) -> bool:
    """Frames of Python's own library (threading, queue, selectors): where a thread waits, not why."""
    if not filename:
        return False
    return filename.startswith("<frozen") or (filename.startswith(_STDLIB) and "site-packages" not in filename)
