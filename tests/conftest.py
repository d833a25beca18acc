"""Shared fixtures: a fresh run directory per test and a clean rltrace state around it."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import rltrace
from rltrace import api

REPO = Path(__file__).resolve().parents[1]


def unavailable(why: str) -> None:
    """A part `make test` provides is missing: skip on a developer's machine, fail in CI (`CI` set),
    where a skip would hide that the test never ran."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI installs it: a skip would hide this test)")
    pytest.skip(why)


@pytest.fixture(autouse=True)
def clean_rltrace(monkeypatch, tmp_path_factory):
    """No RLTRACE_*/OTEL_* settings leak in from the environment; no run outlives its test; the
    per-step summary cache of each test is its own; parts a writer merges in this process are
    deleted at once (tests of readers during merges set a grace of their own)."""
    for var in list(os.environ):
        if var.startswith(("RLTRACE_", "OTEL_")) or var in ("RANK", "TRACEPARENT", "BAGGAGE"):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path_factory.mktemp("summaries")))
    monkeypatch.setenv("RLTRACE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))  # s3:// copies, folded parts
    monkeypatch.setenv("RLTRACE_MERGE_GRACE", "0")
    rltrace.shutdown()
    monkeypatch.setattr(api, "_env_checked", False)
    yield
    rltrace.shutdown()


@pytest.fixture(autouse=True)
def summaries_match_the_oracle(monkeypatch):
    """Every per-step summary any test computes equals the one the reference implementation
    (`tests/analysis/oracle_compute.py`, plain pandas, kept only to check the product) gives on
    the same spans: every known-answer run in the suite checks the fast analysis."""
    from rltrace.analysis import _compute

    from .analysis import oracle_compute

    fast = _compute.compute

    def checked(spans, checks, firsts=None, lasts=None):
        got = fast(spans, checks, firsts, lasts)
        oracle_compute.assert_same(got, oracle_compute.compute(oracle_compute.frame(spans.table), checks, firsts, lasts))
        return got

    checked.__wrapped__ = fast  # for a test whose run the quadratic reference cannot finish
    monkeypatch.setattr(_compute, "compute", checked)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "run"


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process that imports this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder `build(folder)` fills once per test session, then read by every xdist worker: the
    first to ask builds it while the others wait for it (a demo run costs tens of CPU seconds, and
    `--dist loadfile` sends files that read the same run to both workers). A build that fails
    leaves nothing behind: the next to ask builds it again, and fails the same way."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    shared = root / "built-once"
    shared.mkdir(exist_ok=True)
    out, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a worker dies holding it
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out


def entry_points_site(site: Path) -> Path:
    """A dist-info declaring this checkout's `rltrace.instrumentors` entry points, as an install would."""
    import tomllib

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["rltrace.instrumentors"]
    dist = site / "rltrace_checkout-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rltrace-checkout\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[rltrace.instrumentors]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return site


@pytest.fixture(scope="session")
def hf_crash_run(tmp_path_factory):
    """`rltrace run -- python hf_train.py --steps 3 --raise-at 2` (an unmodified Trainer script whose
    loss raises at step 2), run once a session for every worker (`built_once`): (run dir, the
    finished `rltrace run` process). Read by the HF integration tests and the report's consistency checks."""
    import subprocess

    def build(folder: Path) -> None:
        env = python_env()
        env["PYTHONPATH"] = os.pathsep.join([str(entry_points_site(folder / "site")), env["PYTHONPATH"]])
        out = subprocess.run([PYTHON, "-m", "rltrace", "run", "--run-dir", str(folder / "run"), "--", PYTHON,
                              str(REPO / "tests" / "integrations" / "hf_train.py"), "--steps", "3", "--raise-at", "2"],
                             env=env, capture_output=True, text=True, timeout=600, cwd=folder)
        (folder / "returncode").write_text(str(out.returncode))
        (folder / "stdout.txt").write_text(out.stdout)
        (folder / "stderr.txt").write_text(out.stderr)

    folder = built_once(tmp_path_factory, "hf-crash", build)
    proc = subprocess.CompletedProcess(["rltrace", "run"], int((folder / "returncode").read_text()),
                               (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text())
    return folder / "run", proc


from .phoenix import phoenix  # noqa: E402,F401  (one OTLP backend for the whole session)
