"""Runs for the dashboard's tests, recorded once per session with the real rltrace API
(`record_run.py`: real processes, OTel spans, Parquet parts, a py-spy profile, frozen batches),
and an AppTest factory pointed at them."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import python_env

RECORDER = Path(__file__).with_name("record_run.py")
APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"
RUN_TIMEOUT_S = 120  # an AppTest script run (the first one imports plotly, pandas, the analyses)


def record(run_dir: Path, *args: str) -> Path:
    done = subprocess.run([sys.executable, str(RECORDER), str(run_dir), *args], env=python_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


@pytest.fixture(scope="session")
def colocated_run(tmp_path_factory) -> Path:
    """Sync, one process: 6 steps, a profiled slow reward at step 3, batches frozen at steps 1 and 4."""
    return record(tmp_path_factory.mktemp("ui") / "colocated", "--layout", "colocated")


@pytest.fixture(scope="session")
def async_run(tmp_path_factory) -> Path:
    """Async, trainer + rollout process: 6 overlapping steps, then a generate span left open (a hang)."""
    return record(tmp_path_factory.mktemp("ui") / "async", "--layout", "async", "--hang")


@pytest.fixture
def app(monkeypatch):
    """`app(run_dir, ...)`: an AppTest of the dashboard over these runs, run once (on Overview)."""

    def make(*run_dirs: Path) -> AppTest:
        monkeypatch.setenv("RLTRACE_UI_RUNS", os.pathsep.join(str(p) for p in run_dirs))
        at = AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)
        at.run()
        return at

    return make


def snapshot(run_dir: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under a run dir: (size, mtime_ns, sha256), to prove nothing was written."""
    out = {}
    for path in sorted(run_dir.rglob("*")):
        if path.is_file():
            stat = path.stat()
            out[str(path.relative_to(run_dir))] = (stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def no_exceptions(at: AppTest) -> None:
    assert not at.exception, "\n".join(e.message + "\n" + "\n".join(e.stack_trace) for e in at.exception)
    assert not at.error, [e.value for e in at.error]
