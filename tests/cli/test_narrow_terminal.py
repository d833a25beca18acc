"""Every table of the CLI fits an 80-column terminal when piped: no cell cut to `samp…`, no line
past the edge (rich folds long text instead)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import python_env
from tests.ui.conftest import colocated_run  # noqa: F401  (fixture: the demo with faults, frozen batches, a replay)


@pytest.mark.parametrize("command", [["info"], ["report", "--full"], ["replay", "list"], ["profile", "list"]])
def test_tables_fit_80_columns(command, colocated_run):  # noqa: F811
    argv = [sys.executable, "-m", "rltrace", *command[:1], *(command[1:2] if command[0] in ("replay", "profile") else ()),
            str(colocated_run), *(command[1:] if command[0] not in ("replay", "profile") else ())]
    done = subprocess.run(argv, env=python_env(COLUMNS="80"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) > 3
    assert [line for line in lines if len(line) > 80] == []
    assert [line for line in lines if "…" in line] == []
