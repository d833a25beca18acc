"""Runs for the dashboard's tests: the tiny GRPO demo (`python -m examples.tiny_grpo`), short and
with its fault flags on, recorded once per session; and an AppTest factory pointed at them."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from rltrace._config import paths_value
from tests.conftest import REPO, built_once, python_env

APP = REPO / "ui" / "app.py"
RUN_TIMEOUT_S = 120  # an AppTest script run (the first one imports plotly, pandas, the analyses)
DEMO_SHORT = ("--steps", "5", "--warmup-max-steps", "3", "--seed", "0")  # plumbing, not learning
HANG_AT = 4  # the async run's worker hangs here


def _run(*args: str, expect: int = 0, **env: str) -> None:
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=python_env(**env), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]


REPLAY_LABEL = "trainer forward, v_t weights"


@pytest.fixture(scope="session")
def colocated_run(tmp_path_factory) -> Path:
    """Colocated sync demo with a straggler and slow rewards (profiled by py-spy), freezing every
    second batch; then step 2 is replayed twice (the trainer's log-probs from its v_t checkpoint)."""
    return built_once(tmp_path_factory, "ui-colocated", _colocated) / "colocated"


def _colocated(folder: Path) -> None:
    out = folder / "colocated"
    _run("-m", "examples.tiny_grpo", "--out", str(out), *DEMO_SHORT, "--straggler", "--slow-reward", "0.05",
         "--freeze-every", "2", RLTRACE_PROFILE_AFTER="reward=0.3")
    _run("-m", "rltrace", "replay", "run", str(out), "--step", "2", "--repeat", "2",
         "--entry", "examples.tiny_grpo.replay:logprobs", "--label", REPLAY_LABEL)


@pytest.fixture(scope="session")
def async_run(tmp_path_factory) -> Path:
    """Disaggregated async demo (trainer + a Ray rollout worker) whose worker hangs at step HANG_AT."""
    return built_once(tmp_path_factory, "ui-async", _async) / "async"


def _async(folder: Path) -> None:
    _run("-m", "examples.tiny_grpo", "--out", str(folder / "async"), *DEMO_SHORT, "--placement", "disaggregated",
         "--mode", "async", "--hang-after", str(HANG_AT), "--hang-timeout", "5", expect=3)


@pytest.fixture(autouse=True, scope="session")
def components_scanned_once():
    """Each new AppTest scans every installed distribution's metadata for Streamlit components
    (`scan_component_manifests`, about half a second on a loaded machine, and these tests make a
    hundred AppTests): nothing is installed during a session, so the first scan's list is kept
    and every AppTest still registers the components it names."""
    from streamlit.components.v2 import manifest_scanner

    real = manifest_scanner.scan_component_manifests
    found: list = []

    def scan_once(*args, **kwargs):
        if not found:
            found.append(real(*args, **kwargs))
        return list(found[0])

    manifest_scanner.scan_component_manifests = scan_once
    yield
    manifest_scanner.scan_component_manifests = real


@pytest.fixture
def app(monkeypatch):
    """`app(run_dir, ...)`: an AppTest of the dashboard over these runs, run once (on Overview);
    `app()` keeps the RLTRACE_UI_RUNS already set."""

    def make(*run_dirs: Path) -> AppTest:
        if run_dirs:
            monkeypatch.setenv("RLTRACE_UI_RUNS", paths_value([str(p) for p in run_dirs]))
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
