"""The `rltrace` command as a user runs it (a child process): read-only commands end without the
interpreter's teardown, and what they print is whole; `report --json` is indented at a terminal
and one line when piped; a reader that stops early ends the command quietly (status 141)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from rltrace.testing import RunBuilder

from ..conftest import python_env


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run of 300 steps: its `report --json` is larger than a pipe's buffer (64 KB)."""
    b = RunBuilder(tmp_path_factory.mktemp("console") / "run")
    trainer, rollout = b.process("trainer"), b.process("rollout")
    for step in range(300):
        t = 10.0 * step
        rollout.span("rollout", t, t + 6, step=step)
        trainer.span("wait", t, t + 6, step=step, waiting_for="rollout")
        trainer.span("train", t + 6, t + 9, step=step)
    return b.write()


def _rltrace(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rltrace", *args], env=python_env(), capture_output=True, **kw)


def test_report_json_piped_is_one_whole_line_and_the_command_ends_cleanly(run):
    done = _rltrace("report", str(run), "--json", timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode()
    assert text.count("\n") == 1 and text.endswith("}\n")  # one line, nothing cut off by the quick exit
    report = json.loads(text)
    assert report["step_range"]["run_steps"] == 300 and len(report["steps"]) == 300
    assert done.stderr == b""


def test_report_json_at_a_terminal_is_indented(run):
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rltrace", "report", str(run), "--json"], env=python_env(),
                                stdout=follower, stderr=subprocess.PIPE)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    finally:
        os.close(leader)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert text.startswith("{\n  \"run\": {")
    assert json.loads(text)["step_range"]["run_steps"] == 300


def test_a_reader_that_stops_early_ends_the_report_quietly(run):
    """`rltrace report --json | head -c 100`: status 141 (as a shell reports SIGPIPE), no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "rltrace", "report", str(run), "--json"], env=python_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(100)
    proc.stdout.close()  # the report (~400 KB) no longer fits the pipe: its write fails
    code = proc.wait(timeout=300)
    err = proc.stderr.read().decode()
    assert first.startswith(b"{")
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert code == 141


@pytest.mark.parametrize("args", [(), ("--full",)], ids=["text", "full"])
def test_a_reader_that_stops_early_ends_the_text_report_as_the_json_one(run, args):
    """`rltrace report RUN | head -3`: status 141 too (rich's console would exit with 1, a failure)."""
    import fcntl

    read, write = os.pipe()
    fcntl.fcntl(write, 1031, 4096)  # F_SETPIPE_SZ: a 4 KB pipe, so the ~8 KB report cannot fit before its reader leaves
    proc = subprocess.Popen([sys.executable, "-m", "rltrace", "report", str(run), *args], env=python_env(),
                            stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    with os.fdopen(read, "rb") as out:
        first = out.read(100)
    code = proc.wait(timeout=300)
    err = proc.stderr.read().decode()
    assert first and "Traceback" not in err and "Exception ignored" not in err, err
    assert code == 141


def test_a_command_that_fails_prints_its_error_and_nothing_on_stdout(tmp_path):
    for command in ("report", "compact", "info"):
        done = _rltrace(command, str(tmp_path), timeout=120)
        assert done.returncode == 2 and done.stdout == b"", command  # no stray line from a progress display
        assert done.stderr.decode().startswith("rltrace: error:") and done.stderr.count(b"\n") == 1


def test_info_ends_with_its_whole_output(run):
    done = _rltrace("info", str(run), "--json", timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    info = json.loads(done.stdout)  # whole: the quick exit came after the flush
    assert info["run_dir"] == str(run) and info["rows"]["spans"] == 900


@pytest.mark.parametrize("command", ["report", "info"])
def test_the_commands_that_end_without_teardown_close_their_connections(run, monkeypatch, command):
    """A DuckDB connection removes what it spilled to disk when it closes: `report` and `info`
    close theirs before the process ends without the interpreter's teardown."""
    import duckdb

    from rltrace import store
    from rltrace.cli import info, report

    made = []
    real = store.connect
    monkeypatch.setattr(store, "connect", lambda snap: made.append(real(snap)) or made[-1])
    (report if command == "report" else info).collect(str(run))
    assert made
    for con in made:
        with pytest.raises(duckdb.ConnectionException):
            con.execute("SELECT 1")
