"""`rltrace run`: where it records — `--run-dir`, else RLTRACE_RUN_DIR (as job scripts set it), else runs/<time>."""

from __future__ import annotations

import subprocess

from ..conftest import PYTHON, python_env

LOGS = "import rltrace; rltrace.log_metrics(0, loss=1.0)"


def run(args: list[str], cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "rltrace", "run", *args, "--", PYTHON, "-c", LOGS],
                          env=python_env(**env), cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_run_dir_variable_is_where_it_records_and_the_flag_wins(tmp_path):
    out = run([], tmp_path, RLTRACE_RUN_DIR=str(tmp_path / "job"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "job" / "run.json").exists() and not (tmp_path / "runs").exists()
    assert out.stderr.count("recording into") == 1 and f"recording into {tmp_path / 'job'}\n" in out.stderr

    out = run(["--run-dir", str(tmp_path / "flag")], tmp_path, RLTRACE_RUN_DIR=str(tmp_path / "other"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "flag" / "run.json").exists() and not (tmp_path / "other").exists()
    assert out.stderr.count("recording into") == 1 and f"recording into {tmp_path / 'flag'}\n" in out.stderr

    out = run([], tmp_path, RLTRACE_RUN_DIR="")  # set but empty: as if unset
    assert out.returncode == 0, out.stderr
    (made,) = (tmp_path / "runs").iterdir()
    assert (made / "run.json").exists() and out.stderr.count("recording into") == 1
