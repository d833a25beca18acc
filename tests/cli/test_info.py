"""`rltrace info` and `--help`: what a user sees about a run."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

import rltrace
from rltrace.cli import build_parser
from rltrace.cli import main as cli

from ..conftest import PYTHON, REPO, python_env


@pytest.fixture
def hung_run(run_dir):
    """Two processes; the trainer left a `wait` phase open, as a hung rank does."""
    subprocess.run(
        [PYTHON, "-m", "tests.writer_process", str(run_dir), "--role", "rollout", "--rank", "0", "--steps", "3"],
        cwd=REPO,
        env=python_env(),
        check=True,
        timeout=120,
    )
    rltrace.init(run_dir, role="trainer", rank=0, flush_interval=0.05)
    for step in range(3):
        with rltrace.phase("step", step=step):
            with rltrace.phase("train"):
                pass
    started, release = threading.Event(), threading.Event()

    def hang():
        with rltrace.phase("wait", step=3, waiting_for="rollout"):
            started.set()
            release.wait(30)

    t = threading.Thread(target=hang)
    t.start()
    started.wait(10)
    rltrace.flush()
    yield run_dir
    release.set()
    t.join()


def test_info_json_lists_processes_phases_steps_and_open_spans(hung_run, capsys):
    assert cli(["info", str(hung_run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(p["role"], p["rank"]) for p in data["processes"]} == {("rollout", 0), ("trainer", 0)}
    assert data["spans"]["first_step"] == 0 and data["spans"]["last_step"] == 2  # the steps the report counts
    assert data["spans"]["open_only_steps"] == [3]  # the hung wait's step holds only an open span
    phases = {p["phase"]: p["spans"] for p in data["phases"]}
    assert phases == {"step": 6, "rollout": 3, "train": 6}
    (open_span,) = data["open_spans"]
    assert (open_span["phase"], open_span["step"], open_span["role"]) == ("wait", 3, "trainer")
    assert open_span["age_s"] >= 0 and open_span["open_s"] >= 0
    assert data["spans_dropped"] == 0 and data["rows_dropped"] == 0


def test_info_table_names_the_open_span(hung_run, capsys):
    assert cli(["info", str(hung_run)]) == 0
    out = capsys.readouterr().out
    assert "Open spans" in out and "wait" in out and "Nothing dropped" in out
    assert "rollout" in out and "trainer" in out
    assert "1 open ·" in out
    assert "alive: in progress" in out  # its process is this one, alive; the wait is seconds old
    top = " ".join(out.split("\n", 3)[1:3])
    assert " 0 " not in top and "step_summary" not in top  # tables with nothing in them are not listed


def test_info_counts_with_thousands_separators_and_names_the_summaries(run_dir, capsys, monkeypatch):
    from rltrace.store import merge

    monkeypatch.setattr(merge, "SUMMARISE_ROWS", 0)  # a per-part summary for this small part too
    rltrace.init(run_dir, role="trainer", flush_interval=0.01)
    for step in range(3):
        with rltrace.phase("train", step=step):
            for _ in range(400):
                with rltrace.phase("forward"):
                    pass
        rltrace.flush()
    rltrace.shutdown()  # one merged part, its summary beside it
    assert cli(["info", str(run_dir)]) == 0
    top = " ".join(capsys.readouterr().out.split())
    assert "1,203 spans in 1 part" in top and "(per-part summaries for 1 span part)" in top
    assert "span_digest" not in top


def test_a_span_left_open_at_exit_is_counted_where_it_is_listed(run_dir, capsys):
    """Its process exited with it open (rltrace ended it then): the header counts it as open, as
    the table lists it, and the store's `open_spans` view holds it."""
    code = ("import sys, rltrace\nrltrace.init(sys.argv[1], role='trainer', rank=0)\n"
            "with rltrace.phase('train', step=0):\n    pass\nrltrace.start_phase('step', step=1)\n")
    subprocess.run([PYTHON, "-c", code, str(run_dir)], env=python_env(), check=True, timeout=120)
    assert cli(["info", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 finished spans, 1 open (1 ended by rltrace when its process exited)" in out
    assert "exited with it open" in out
    from rltrace import store

    rows = store.open(run_dir).execute("SELECT phase, step, is_open, ended_at_exit FROM open_spans").fetchall()
    assert rows == [("step", 1, False, True)]


@pytest.mark.parametrize("command", [[], ["info"], ["compact"]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: rltrace" in capsys.readouterr().out


def test_console_script_runs():
    out = subprocess.run([PYTHON, "-m", "rltrace", "--version"], capture_output=True, text=True, env=python_env(), check=True)
    assert out.stdout.startswith("rltrace ")


def test_a_writer_killed_a_moment_ago_is_killed_not_alive(run_dir, capsys):
    """Its heartbeat is seconds old, but the writer lock it held is released (the OS does that at
    kill -9): `info` and the report say killed at once, not after the 30 s heartbeat rule."""
    import signal

    from rltrace import report, store

    proc = subprocess.Popen([PYTHON, "-m", "tests.writer_process", str(run_dir), "--forever"], cwd=REPO,
                            env=python_env(), stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        for _ in range(100):  # until its open phase is flushed (the writer flushes every second)
            assert cli(["info", str(run_dir), "--json"]) == 0
            data = json.loads(capsys.readouterr().out)
            if data["open_spans"]:
                break
            time.sleep(0.1)
        (alive,) = data["processes"]
        assert alive["state"] == "running" and [o["state"] for o in data["open_spans"]] == ["running"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert cli(["info", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (killed,) = data["processes"]
    assert killed["state"] == "killed"
    assert {o["state"] for o in data["open_spans"]} == {"killed"}
    hung = report.build(store.open(run_dir))["open_spans"]
    assert hung and {o["state"] for o in hung} == {"killed"} and not any(o["in_progress"] for o in hung)
