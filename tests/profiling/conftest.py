"""Helpers for the profiling tests: run the instrumented test program, wait for stored profiles."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rltrace import store
from tests.conftest import python_env

PROGRAM = Path(__file__).with_name("program.py")
PYSPY = str(Path(sys.executable).parent / "py-spy")


#: the test program with SIGINT at its default, whatever this runner inherited (under nohup, or as a
#: script's background job, it is ignored, and the program's py-spy would inherit that)
_DEFAULT_SIGINT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"]


def program_env(**settings: str) -> dict[str, str]:
    return python_env(**{"RLTRACE_PYSPY": PYSPY, **settings})


def run_program(run_dir: Path, mode: str, timeout: float = 120, **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_DEFAULT_SIGINT, str(PROGRAM), str(run_dir), mode],
        env=program_env(**settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_program(run_dir: Path, mode: str, **settings: str) -> subprocess.Popen:
    """The test program in its own process group, so `kill_program` also ends its children."""
    return subprocess.Popen(
        [*_DEFAULT_SIGINT, str(PROGRAM), str(run_dir), mode],
        env=program_env(**settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill_program(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for(fetch, done, timeout: float = 60.0, what: str = "the store"):
    """Poll `fetch()` until `done(value)` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = fetch()
        if done(value):
            return value
        time.sleep(0.05)
    pytest.fail(f"{what} never reached the expected state; last value: {value}")


def wait_for_profiles(run_dir: Path, done, timeout: float = 60.0) -> list[dict]:
    """Poll the store until `done(rows)` holds for its profiles rows."""
    return wait_for(lambda: profiles(run_dir) if (run_dir / "run.json").exists() else [], done, timeout, "profiles")


def profiles(run_dir: Path) -> list[dict]:
    cur = store.open(run_dir).execute("SELECT * FROM profiles ORDER BY started_ns")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def frames(run_dir: Path, profile_id: str) -> list[dict]:
    cur = store.open(run_dir).execute("SELECT * FROM profile_frames WHERE profile_id = ? ORDER BY rank", [profile_id])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
