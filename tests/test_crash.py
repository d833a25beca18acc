"""Crashes are recorded: uncaught exceptions in the process or a thread, phases left open at exit, kill -9."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time

import pytest

import rltrace
from rltrace import store

from .conftest import PYTHON, python_env


def run_script(run_dir, body: str, **kwargs):
    code = "import sys, threading, time, rltrace\nrltrace.init(sys.argv[1], role='trainer', rank=0)\n" + textwrap.dedent(body)
    return subprocess.run([PYTHON, "-c", code, str(run_dir)], env=python_env(), capture_output=True, text=True,
                          timeout=120, **kwargs)


def rows(run_dir, sql: str) -> list[dict]:
    cur = store.open(run_dir).execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_exception_escaping_phases_and_handles_is_a_crash_record(run_dir):
    out = run_script(run_dir, """
        handle = rltrace.start_phase("step", step=3)
        with rltrace.phase("train"):
            raise RuntimeError("loss is NaN")
    """)
    assert out.returncode == 1 and "RuntimeError: loss is NaN" in out.stderr  # the usual traceback still prints
    (crash,) = rows(run_dir, "SELECT * FROM crashes")
    assert (crash["kind"], crash["exc_type"], crash["message"]) == ("process", "RuntimeError", "loss is NaN")
    assert (crash["phase"], crash["step"], json.loads(crash["phases"])) == ("train", 3, ["train", "step"])
    assert (crash["role"], crash["rank"], crash["thread_name"]) == ("trainer", 0, "MainThread")
    assert 'line 6, in <module>' in crash["traceback"] and crash["traceback"].endswith("RuntimeError: loss is NaN\n")
    spans = {s["name"]: s for s in rows(run_dir, "SELECT * FROM spans")}
    assert not any(s["is_open"] for s in spans.values())  # the open handle was closed by the crash
    assert spans["step"]["status"] == "ERROR" and spans["step"]["status_message"] == "RuntimeError: loss is NaN"
    assert crash["span_id"] == spans["train"]["span_id"]


def test_exception_in_a_thread_is_recorded_and_the_process_goes_on(run_dir):
    out = run_script(run_dir, """
        def score():
            h = rltrace.start_phase("reward", step=2)   # left open by the failure
            raise ValueError("verifier crashed")
        main = rltrace.start_phase("rollout", step=2)
        t = threading.Thread(target=score, name="scorer"); t.start(); t.join()
        main.end()
        print("still running")
    """)
    assert out.returncode == 0 and "still running" in out.stdout and "ValueError: verifier crashed" in out.stderr
    (crash,) = rows(run_dir, "SELECT * FROM crashes")
    assert (crash["kind"], crash["thread_name"], crash["exc_type"], crash["phase"], crash["step"]) == (
        "thread", "scorer", "ValueError", "reward", 2)
    spans = {s["name"]: s for s in rows(run_dir, "SELECT * FROM spans")}
    assert spans["reward"]["status"] == "ERROR" and not spans["reward"]["is_open"]
    assert spans["rollout"]["status"] == "UNSET"  # another thread's phase is not the thread's crash


def test_phases_open_when_the_process_exits_end_with_an_error(run_dir):
    out = run_script(run_dir, """
        def forever():
            with rltrace.phase("generate", step=5):
                time.sleep(600)
        threading.Thread(target=forever, daemon=True, name="engine").start()
        rltrace.start_phase("step", step=5)   # never ended
        time.sleep(0.2)
    """)
    assert out.returncode == 0, out.stderr
    spans = rows(run_dir, "SELECT name, is_open, status, status_message, events FROM spans ORDER BY name")
    assert [(s["name"], s["is_open"], s["status"]) for s in spans] == [("generate", False, "ERROR"), ("step", False, "ERROR")]
    assert all("while this phase was open" in s["status_message"] for s in spans)
    assert rows(run_dir, "SELECT count(*) AS n FROM crashes")[0]["n"] == 0  # exiting is not a crash
    from rltrace import report
    from rltrace.cli import info

    said = report.build(store.open(run_dir))["findings"]
    assert said[0].startswith("Open span: generate on trainer0 (thread engine) at step 5 never ended: open ")
    assert said[0].endswith(" until its process exited; hung, or cut off by the exit.")
    assert [(o["phase"], o["state"]) for o in info.collect(str(run_dir))["open_spans"]] == [
        ("generate", "exited"), ("step", "exited")]


def test_kill_9_leaves_open_phases_and_a_stopped_heartbeat(run_dir):
    code = textwrap.dedent("""
        import sys, time, rltrace
        rltrace.init(sys.argv[1], role="rollout", rank=1, flush_interval=0.1)
        with rltrace.phase("generate", step=7):
            rltrace.flush()
            print("ready", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([PYTHON, "-c", code, str(run_dir)], env=python_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (span,) = rows(run_dir, "SELECT name, step, is_open FROM spans")
    assert (span["name"], span["step"], span["is_open"]) == ("generate", 7, True)
    (proc_row,) = rows(run_dir, "SELECT ended_ns, heartbeat_ns FROM processes")
    assert proc_row["ended_ns"] is None and proc_row["heartbeat_ns"] < time.time_ns()
    assert rows(run_dir, "SELECT count(*) AS n FROM crashes")[0]["n"] == 0


def test_info_and_report_say_the_same_about_a_crash(run_dir):
    from rltrace import report
    from rltrace.cli import info

    run_script(run_dir, """
        def score():
            with rltrace.phase("reward", step=1):
                raise ValueError("verifier broke")
        t = threading.Thread(target=score, name="scorer"); t.start(); t.join()
        with rltrace.phase("step", step=3):
            raise RuntimeError("loss is NaN\\nsecond line")
    """)
    data = info.collect(str(run_dir))
    said = report.build(store.open(run_dir))["findings"]
    expected = ["trainer0 (thread scorer) crashed at step 1 in `reward`: ValueError: verifier broke; the process went on.",
                "trainer0 crashed at step 3 in `step`: RuntimeError: loss is NaN."]
    assert said[:2] == expected
    assert [p["state"] for p in data["processes"]] == ["crashed"]
    from rich.console import Console

    console = Console(record=True, width=200)
    info.render(data, console)
    text = console.export_text()
    assert all("Crash: " + e in text for e in expected) and "hung" not in text


def test_after_kill_9_info_and_report_say_killed_not_hung(run_dir, monkeypatch):
    from rich.console import Console

    from rltrace import report
    from rltrace.analysis._format import seconds_text
    from rltrace.analysis.health import open_text
    from rltrace.cli import info

    test_kill_9_leaves_open_phases_and_a_stopped_heartbeat(run_dir)
    # its heartbeat is still fresh, but the writer lock it held on this host is free: killed at once
    soon = report.build(store.open(run_dir))["findings"][0]
    later = time.time_ns() + 120 * 10**9  # and once the heartbeat is stale, whatever the host
    said = report.build(store.open(run_dir), now_ns=later)["findings"][0]
    (o,) = report.build(store.open(run_dir), now_ns=later)["open_spans"]
    heard = (o["last_heard_ns"] - o["start_ns"]) / 1e9
    assert o["open_s"] == pytest.approx(max(heard, 0.0), abs=1e-6)  # until its last sign of life, whenever it was seen
    for told in (soon, said):  # the same timeline however the kill was seen: its last evidence, each once
        assert told.startswith(f"Open span: generate on rollout1 at step 7 never ended, {open_text(o)}: its last "
                               "heartbeat came ")
        assert told.count("heartbeat came") == 1 and "its writer lock was freed" in told
        assert told.endswith("killed (e.g. SIGKILL or out of memory).")
        assert "crash" not in told and "alive" not in told  # three cases, three sentences
    assert info.collect(str(run_dir))["processes"][0]["state"] == "killed"
    monkeypatch.setattr(info.time, "time_ns", lambda: later)
    data = info.collect(str(run_dir))
    assert data["processes"][0]["state"] == "killed" and data["open_spans"][0]["state"] == "killed"
    assert data["open_spans"][0]["open_s"] == o["open_s"]  # one figure for how long it was open
    console = Console(record=True, width=200)
    info.render(data, console)
    text = console.export_text()
    assert "killed (open at least this)" in text and seconds_text(o["open_s"]) in text


def test_a_crash_that_leaves_a_span_open_is_told_once_as_the_crash(run_dir):
    """The step is held open by a generator the loop iterates, so the exception escapes no phase:
    rltrace ends the step as the process exits. The crash explains it; no hang, no wait."""
    from rich.console import Console

    from rltrace import report
    from rltrace.cli import info

    out = run_script(run_dir, """
        def steps():
            for i in range(10):
                with rltrace.phase("step", step=i):
                    yield i
        loop = steps()
        for step in loop:
            if step == 3:
                time.sleep(0.1)
                raise RuntimeError("loss is NaN")
            with rltrace.phase("rollout"):
                time.sleep(0.01)
            with rltrace.phase("train"):
                time.sleep(0.01)
    """)
    assert out.returncode == 1 and "RuntimeError: loss is NaN" in out.stderr
    said = report.build(store.open(run_dir))["findings"]
    assert said[0].startswith("trainer0 crashed: RuntimeError: loss is NaN; the crash ended what was still open: "
                              "`step` at step 3 (open ")
    assert sum("step 3" in s for s in said) == 1
    assert not any("Open span" in s or "hung" in s or "waited" in s for s in said), said
    data = info.collect(str(run_dir))
    assert [(o["phase"], o["step"], o["state"]) for o in data["open_spans"]] == [("step", 3, "crashed")]
    assert data["spans"]["open"] == len(data["open_spans"]) == 1 and 0.1 <= data["open_spans"][0]["open_s"] < 60
    console = Console(record=True, width=200)
    info.render(data, console)
    text = console.export_text()
    assert "1 open (1 ended by rltrace when its process exited)" in text and "crashed: the crash ended it" in text


def test_crash_sentences():
    from rltrace.report.findings import crash_sentence

    base = {"role": "rollout", "rank": 2, "kind": "process", "thread_name": "MainThread", "step": None, "phase": None}
    assert crash_sentence({**base, "exc_type": "OSError", "message": ""}) == "rollout2 crashed: OSError."
    assert crash_sentence({**base, "exc_type": "KeyboardInterrupt", "message": "", "step": 4, "phase": "generate"}) == (
        "rollout2 was interrupted (Ctrl-C) at step 4 in `generate`.")
    long = crash_sentence({**base, "exc_type": "mylib.Error", "message": "x" * 1000 + "\nmore"})
    assert long == "rollout2 crashed: mylib.Error: " + "x" * 300 + "."


def test_finished_spans_are_not_kept_alive(run_dir):
    run = rltrace.init(run_dir)
    for i in range(100):
        with rltrace.phase("train", step=i):
            pass
    handle = rltrace.start_phase("step")
    assert len(run.live_spans) == 1
    handle.end()
    assert len(run.live_spans) == 0
