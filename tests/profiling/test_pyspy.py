"""py-spy captures with the real py-spy: a slow phase gets a recording naming the slow function,
a hang gets a stack dump, and every failure leaves a clear status while the loop carries on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

import rltrace
from rltrace import store
from rltrace.profiling import artefact_path, profiles_for_spans, watchdog_of
from rltrace.profiling import pyspy as pyspy_mod

from .conftest import PYSPY, frames, kill_program, profiles, run_program, start_program, wait_for, wait_for_profiles

SLOW = {"RLTRACE_PROFILE_SLOW": "3", "RLTRACE_PROFILE_MIN_SECONDS": "0.3", "RLTRACE_PROFILE_MIN_SAMPLES": "3"}


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("slow") / "run"
    done = run_program(run_dir, "slow", **SLOW)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def test_slow_phase_gets_a_recording_linked_to_its_span(slow_run):
    [profile] = profiles(slow_run)
    assert (profile["kind"], profile["trigger"], profile["status"]) == ("pyspy_record", "slow", "ok")
    con = store.open(slow_run)
    span = con.execute(
        "SELECT phase, step, duration_s, attr(attributes, 'rl.profile_id') FROM spans "
        "WHERE trace_id = ? AND span_id = ?",
        [profile["trace_id"], profile["span_id"]],
    ).fetchall()
    assert span == [("reward", 6, pytest.approx(1.5, abs=0.3), profile["profile_id"])]
    assert profile["step"] == 6 and profile["phase"] == "reward"
    assert profile["median_s"] < 0.1 and profile["elapsed_s"] > profile["threshold_s"] >= 0.3
    assert profile["samples"] > 20  # the rest of a 1.5 s phase at 100 samples/s


def test_recording_names_the_slow_function(slow_run):
    [profile] = profiles(slow_run)
    top = frames(slow_run, profile["profile_id"])
    assert top[0]["frame"] == "slow_verifier" and top[0]["file"].endswith("program.py")
    assert top[0]["self_share"] > 0.8
    assert "MainThread" in top[0]["thread"]
    path = artefact_path(slow_run, profile["path"])
    assert path.is_relative_to(slow_run.resolve()) and not Path(profile["path"]).is_absolute()
    trace = json.loads(path.read_text())  # a Chrome trace (Perfetto opens it): each stack with its time
    assert {"B", "E"} <= {e["ph"] for e in trace} and path.stat().st_size == profile["size_bytes"]
    assert path.name.endswith(".pyspy.trace.json")
    assert json.loads(profile["command"])[1:3] == ["record", "--pid"]


def test_the_report_names_the_profile_of_the_slow_stage(slow_run):
    from rltrace import report

    [profile] = profiles(slow_run)
    data = report.build(store.open(slow_run))
    assert [p["profile_id"] for p in data["bottleneck"]["profiles"]] == [profile["profile_id"]]
    assert any(profile["profile_id"] in line and profile["path"] in line for line in data["findings"])


def test_a_hang_gets_a_stack_dump_of_the_process_and_its_children(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_program(run_dir, "hang", RLTRACE_HANG_TIMEOUT="0.5")
    try:
        [dump] = wait_for_profiles(run_dir, lambda rows: rows and rows[0]["status"] != "running")
        span = wait_for(
            lambda: (
                store.open(run_dir).execute("SELECT is_open FROM spans WHERE span_id = ?", [dump["span_id"]]).fetchall()
            ),
            lambda rows: rows,
            what="the generate span",
        )
        assert len(profiles(run_dir)) == 1  # not one more for the enclosing rollout phase
    finally:
        kill_program(proc)
    assert span == [(True,)]  # the dump explains a span that never ended
    assert (dump["kind"], dump["trigger"], dump["status"], dump["phase"]) == ("pyspy_dump", "hang", "ok", "generate")
    assert "hang timeout 0.5" in dump["reason"]  # one dump for the hung thread, on its innermost phase
    stack = [f["frame"] for f in frames(run_dir, dump["profile_id"])]
    assert stack.index("wait_for_engine") < stack.index("hang.<locals>.worker")
    assert "rollout-worker" in frames(run_dir, dump["profile_id"])[0]["thread"]
    # the stack starts in threading.py; the top frame is where the worker is stuck in its own code
    assert profiles_for_spans(store.open(run_dir))["top_frame"].tolist() == ["wait_for_engine"]
    text = artefact_path(run_dir, dump["path"]).read_text()
    assert "wait_for_engine" in text and "stuck_child" in text  # the child process is dumped too


@pytest.mark.parametrize("executable", ["/nonexistent/py-spy", "denied"])
def test_a_failed_capture_leaves_a_status_and_the_loop_finishes(tmp_path, executable):
    if executable == "denied":
        executable = _ptrace_denied_pyspy(tmp_path)
    run_dir = tmp_path / "run"
    done = run_program(run_dir, "slow", RLTRACE_PYSPY=executable, **SLOW)
    assert done.returncode == 0 and "loop finished" in done.stdout, done.stdout + done.stderr
    [profile] = profiles(run_dir)
    if executable.startswith("/nonexistent"):
        assert profile["status"] == "missing_executable" and "not found: pip install py-spy" in profile["message"]
    else:
        assert profile["status"] == "permission_denied" and "CAP_SYS_PTRACE" in profile["message"]
    assert profile["path"] is None and profile["size_bytes"] is None
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM spans WHERE phase = 'reward' AND NOT is_open").fetchone() == (9,)
    (events,) = con.execute("SELECT events FROM spans WHERE span_id = ?", [profile["span_id"]]).fetchone()
    statuses = [e["attributes"]["status"] for e in json.loads(events) if e["name"] == "rltrace.profile"]
    assert statuses[-1] == profile["status"]  # the span itself says why it has no profile


def _ptrace_denied_pyspy(tmp_path: Path) -> str:
    """The real py-spy, run as an unprivileged user: the kernel refuses ptrace, as in a container
    without CAP_SYS_PTRACE. Not root (so no setpriv): a stand-in that fails the way py-spy does."""
    script = tmp_path / "py-spy-denied"
    if os.geteuid() == 0 and shutil.which("setpriv"):
        body = f'exec setpriv --reuid=65534 --regid=65534 --clear-groups "{PYSPY}" "$@"\n'
    else:
        body = 'echo "Permission Denied: Try running again with elevated permissions" >&2\nexit 1\n'
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_phase_ending_before_sampling_starts_is_no_samples(tmp_path):
    # in a process of its own: py-spy attached to the test runner itself (the whole suite loaded)
    # sometimes kept sampling for 10 s after SIGINT, which says nothing about this path
    done = run_program(tmp_path / "run", "brief", RLTRACE_PROFILE_AFTER="0.05")
    assert done.returncode == 0 and "loop finished" in done.stdout, done.stdout + done.stderr
    [profile] = profiles(tmp_path / "run")
    assert profile["status"] == "no_samples", f"{profile['status']}: {profile['message']} ({profile['command']})"


@pytest.mark.parametrize("sampling", [False, True])
def test_a_py_spy_that_does_not_answer_control_c(tmp_path, monkeypatch, sampling):
    """py-spy reads the process's memory maps before it samples, and does not answer Control-C
    meanwhile (slow in a large process): killed before it said it was sampling, the phase simply
    got no samples; killed while sampling, the capture failed. A stand-in that ignores SIGINT."""
    monkeypatch.setattr(pyspy_mod, "_STOP_TIMEOUT_S", 0.5)
    script = tmp_path / "py-spy-stuck"
    said = 'echo "py-spy> Sampling process 100 times a second. Press Control-C to exit."\n' if sampling else ""
    script.write_text(f"#!/bin/sh\ntrap '' INT\n{said}sleep 30\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    rltrace.init(tmp_path / "run", profile={"after": 0.05, "pyspy": str(script)})
    watchdog = watchdog_of(rltrace.current_run())
    with rltrace.phase("reward", step=0):
        deadline = time.monotonic() + 10
        while watchdog._recording is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.2)  # the stand-in has printed what it prints
    rltrace.shutdown()
    [profile] = profiles(tmp_path / "run")
    if sampling:
        assert profile["status"] == "failed" and "did not stop within" in profile["message"], profile["message"]
    else:
        assert profile["status"] == "no_samples" and "still attaching" in profile["message"], profile["message"]


def test_a_sigint_lost_before_py_spy_listens_is_sent_again(tmp_path):
    """A process started with SIGINT ignored passes that on to py-spy, which then loses a SIGINT
    that comes before it sets up its Control-C handler: stopping it asks again until it listens.
    A stand-in started with SIGINT ignored that sets up its handler after 0.3 s and exits on it."""
    late = ("import signal, sys, time; time.sleep(0.3); "
            "signal.signal(signal.SIGINT, lambda *_: sys.exit(0)); time.sleep(30)")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup: the child inherits it
    try:
        recording = pyspy_mod.start_record([sys.executable, "-c", late])
    finally:
        signal.signal(signal.SIGINT, previous)
    started = time.monotonic()
    returncode, _ = recording.stop()
    assert returncode == 0 and time.monotonic() - started < 5  # not killed after the 10 s limit


def test_dump_stacks_attaches_a_manual_dump_to_the_running_phase(tmp_path):
    rltrace.init(tmp_path / "run", profile=False)
    with rltrace.phase("eval", step=3) as p:
        profile_id = rltrace.profiling.dump_stacks("checking")
        rows = wait_for_profiles(tmp_path / "run", lambda rows: rows and rows[0]["status"] != "running")
        span_id = p.span_id
    assert rows[0]["profile_id"] == profile_id and rows[0]["span_id"] == span_id
    assert (rows[0]["trigger"], rows[0]["status"]) == ("manual", "ok")
    stack = [f["frame"] for f in frames(tmp_path / "run", profile_id)]
    assert "test_dump_stacks_attaches_a_manual_dump_to_the_running_phase" in stack
    assert rltrace.profiling.dump_stacks() is None  # no phase running


def _trace(path: Path, tid: int, pid: int, slices: list[tuple[float, float, list[str]]]) -> Path:
    """A py-spy Chrome trace by hand: one thread's stacks, each (start_us, end_us, outermost first)."""
    events = []
    for start, end, stack in slices:
        events += [{"ph": "B", "name": f, "tid": tid, "pid": pid, "ts": start, "args": {"filename": "x.py", "line": 1}}
                   for f in stack]
        events += [{"ph": "E", "name": f, "tid": tid, "pid": pid, "ts": end, "args": {"filename": "x.py", "line": 1}}
                   for f in reversed(stack)]
    events.append({"ph": "B", "name": "writer", "tid": tid + 1, "pid": pid, "ts": 0, "args": {}})  # another thread
    events.append({"ph": "E", "name": "writer", "tid": tid + 1, "pid": pid, "ts": 10_000_000, "args": {}})
    path.write_text(json.dumps(events))
    return path


def test_a_recording_is_clipped_to_its_phase_and_its_thread(tmp_path):
    path = _trace(tmp_path / "t.json", 7, 1, [(0, 500_000, ["loop", "reward", "judge"]),
                                               (500_000, 1_000_000, ["loop", "train"])])
    clipped = pyspy_mod.chrome_frames(path, 1, 7, "MainThread (7)", (0, 500_000), rate=100)
    assert [(f.frame, f.self_share, f.samples) for f in clipped.frames] == [("judge", 1.0, 50)]
    assert (clipped.samples, clipped.thread_samples, clipped.after_s) == (50, 100, 0.5)
    assert clipped.stacks == "loop (x.py);reward (x.py);judge (x.py) 50"  # the phase's stacks only, for its flame graph
    nothing = pyspy_mod.chrome_frames(path, 1, 7, "t", (-200_000, -1), rate=100)  # ended before the first sample
    assert (nothing.frames, nothing.samples, nothing.thread_samples) == ([], 0, 100)


def test_a_recording_with_nothing_inside_its_phase_says_so(tmp_path):
    from rltrace.profiling.captures import Capturer
    from rltrace.profiling.policy import resolve_policy
    from rltrace.profiling.records import Capture

    path = _trace(tmp_path / "t.json", 7, os.getpid(), [(300_000, 900_000, ["loop", "train"])])
    capture = Capture(kind="pyspy_record", trigger="slow", reason="r", span=None, trace_id="0" * 32, span_id="1" * 16,
                      span_name="reward", phase="reward", step=3, native_thread_id=7, thread_ident=7,
                      thread_name="MainThread", phase_start_ns=0, phase_end_ns=200_000_000, launched_ns=0)
    Capturer(tmp_path, None, "py-spy", resolve_policy({}))._clip(capture, path)
    assert capture.status == "no_samples" and capture.samples == 0 and capture.frames == []
    assert "all 60 samples py-spy took of the phase's thread came after the phase ended" in capture.message


def test_the_stored_stacks_are_bounded_most_sampled_first():
    deep = {tuple((f"f{d};x", f"/a/m{k}.py", d) for d in range(pyspy_mod.MAX_DEPTH + 30)): float(k + 1)
            for k in range(pyspy_mod.MAX_STACKS + 50)}
    lines = pyspy_mod.folded_stacks(deep).splitlines()
    assert len(lines) == pyspy_mod.MAX_STACKS and lines[0].endswith(f" {pyspy_mod.MAX_STACKS + 50}")
    assert all(len(line.rpartition(" ")[0].split(";")) == pyspy_mod.MAX_DEPTH for line in lines)  # `;` in a name is no split
    assert pyspy_mod.folded_stacks({}) == ""
