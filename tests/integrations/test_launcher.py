"""`rltrace run -- COMMAND`: instrumentors load in every Python process of a command that never imports rltrace."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rltrace import store

from ..conftest import PYTHON, python_env

FAKE = Path(__file__).parent / "fake"


def launch(run_dir, *command, cwd=None, **env):
    extra = env.pop("PYTHONPATH", None)
    base = python_env(**env)
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE), extra, base["PYTHONPATH"]]))
    argv = [PYTHON, "-m", "rltrace", "run", *(["--run-dir", str(run_dir)] if run_dir else []), "--", *command]
    return subprocess.run(argv, env=base, cwd=cwd, capture_output=True, text=True, timeout=120)


def fake_spans(run_dir) -> list[tuple]:
    con = store.open(run_dir)
    return con.execute("SELECT name, step, pid, status FROM spans WHERE NOT is_open ORDER BY step").fetchall()


def test_env_var_instrumentor_traces_the_script_and_its_child(run_dir):
    out = launch(run_dir, PYTHON, str(FAKE / "script.py"), FAKE_CHILD="1",
                 RLTRACE_INSTRUMENTORS="rltrace_fake_instrumentor:FakeInstrumentor")
    assert out.returncode == 0, out.stderr
    assert "work 0" in out.stdout and f"recording into {run_dir}" in out.stderr
    rows = fake_spans(run_dir)
    assert [(name, step) for name, step, _, _ in rows] == [("fake_work", 0), ("fake_work", 1)]
    assert rows[0][2] != rows[1][2]  # the child is its own process
    con = store.open(run_dir)
    assert con.execute("SELECT count(DISTINCT process_id) FROM processes").fetchone()[0] == 2


def test_entry_point_instrumentor_is_found_without_any_setting(run_dir, tmp_path):
    dist = tmp_path / "site" / "rltrace_fake-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rltrace-fake\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rltrace.instrumentors]\nfake = rltrace_fake_instrumentor:FakeInstrumentor\n")
    out = launch(run_dir, PYTHON, str(FAKE / "script.py"), "4", PYTHONPATH=str(tmp_path / "site"))
    assert out.returncode == 0, out.stderr
    assert [(n, s) for n, s, _, _ in fake_spans(run_dir)] == [("fake_work", 4)]


def test_broken_or_missing_instrumentors_warn_once_and_the_command_runs(run_dir):
    out = launch(run_dir, PYTHON, str(FAKE / "script.py"), "2", RLTRACE_INSTRUMENTORS=(
        "rltrace_fake_instrumentor:broken,no_such_module_xyz:Thing,rltrace_fake_instrumentor:FakeInstrumentor"))
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("instrumentor 'rltrace_fake_instrumentor:broken'") == 1
    assert "this instrumentor is broken" in out.stderr
    assert out.stderr.count("instrumentor 'no_such_module_xyz:Thing'") == 1 and "No module named" in out.stderr
    assert [(n, s) for n, s, _, _ in fake_spans(run_dir)] == [("fake_work", 2)]


def test_exit_status_is_propagated_and_a_crash_is_recorded(run_dir):
    out = launch(run_dir, PYTHON, str(FAKE / "script.py"), FAKE_EXIT="3",
                 RLTRACE_INSTRUMENTORS="rltrace_fake_instrumentor:FakeInstrumentor")
    assert out.returncode == 3
    out = launch(run_dir, PYTHON, str(FAKE / "script.py"), "-5",
                 RLTRACE_INSTRUMENTORS="rltrace_fake_instrumentor:FakeInstrumentor")
    assert out.returncode == 1 and "RuntimeError: negative work" in out.stderr  # the program's own traceback
    con = store.open(run_dir)
    assert con.execute("SELECT exc_type, message, phase, step FROM crashes").fetchall() == [
        ("RuntimeError", "negative work", "fake_work", 5)]


def test_disabled_runs_the_command_untouched(run_dir):
    out = launch(run_dir, PYTHON, "-c", "import sys, os; print(sys.modules.get('rltrace')); sys.exit(4)",
                 RLTRACE_DISABLED="1", RLTRACE_INSTRUMENTORS="rltrace_fake_instrumentor:FakeInstrumentor")
    assert out.returncode == 4 and out.stdout.strip() == "None"
    assert not run_dir.exists() and "recording" not in out.stderr


def test_an_existing_sitecustomize_still_runs(run_dir, tmp_path):
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    out = launch(run_dir, PYTHON, "-c", "import os, sys; print(os.environ.get('USER_SITECUSTOMIZE_RAN'), "
                 "'rltrace.integrations' in sys.modules)", PYTHONPATH=str(site))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"]
    assert "nothing was recorded" in out.stderr


def test_default_run_dir_and_bad_commands(tmp_path):
    out = launch(None, PYTHON, "-c", "import rltrace; rltrace.log_metrics(0, loss=1.0)", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (made,) = (tmp_path / "runs").iterdir()
    assert (made / "run.json").exists() and f"trace in runs/{made.name}" in out.stderr
    out = launch(tmp_path / "r", PYTHON, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert out.returncode == 128 + 15  # killed by a signal: the shell's convention
    out = launch(tmp_path / "r", "no-such-command-xyz")
    assert out.returncode == 2 and "command not found: no-such-command-xyz" in out.stderr
    out = subprocess.run([PYTHON, "-m", "rltrace", "run"], env=python_env(), capture_output=True, text=True)
    assert out.returncode == 2 and "needs a command" in out.stderr


@pytest.mark.slow
def test_torchrun_ranks_are_traced_with_their_rank(run_dir, tmp_path):
    pytest.importorskip("torch")
    out = launch(run_dir, PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 str(FAKE / "script.py"), "3", RLTRACE_INSTRUMENTORS="rltrace_fake_instrumentor:FakeInstrumentor",
                 cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    con = store.open(run_dir)
    rows = con.execute("SELECT rank, count(*) FROM spans WHERE name = 'fake_work' AND step = 3 GROUP BY rank ORDER BY rank")
    assert rows.fetchall() == [(0, 1), (1, 1)]


def test_a_helper_process_that_records_nothing_leaves_no_crash(run_dir):
    out = launch(run_dir, PYTHON, "-c", "import no_such_module_probe")
    assert out.returncode == 1 and "No module named 'no_such_module_probe'" in out.stderr
    assert not run_dir.exists()
