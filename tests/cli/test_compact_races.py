"""`compact` where it cannot write, and a `report` that a short-grace `compact` races: one line
that says what to do, never a traceback."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

import rltrace
from rltrace import store
from rltrace.cli import main

from ..conftest import PYTHON, python_env


def _record(run_dir, parts: int = 6):
    rltrace.init(run_dir)
    for step in range(parts):
        with rltrace.phase("train", step=step):
            pass
        rltrace.log_metrics(step, loss=1.0)
        rltrace.flush()  # one part per step: something to compact
    rltrace.shutdown()
    return run_dir


def _without_write_permission() -> list[str]:
    """A prefix that runs a command without the power to ignore file permissions (root has it)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only directory cannot be made here")
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def test_compact_on_a_read_only_run_is_one_line_that_says_what_to_do(run_dir):
    _record(run_dir)
    before = sorted(p.name for p in run_dir.rglob("*"))
    modes = {}
    for path in [run_dir, *run_dir.rglob("*")]:
        modes[path] = path.stat().st_mode
        path.chmod(modes[path] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        done = subprocess.run([*_without_write_permission(), PYTHON, "-m", "rltrace", "compact", str(run_dir)],
                              env=python_env(), capture_output=True, text=True, timeout=120)
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"cannot compact {run_dir}: Permission denied" in done.stderr and "compact a copy" in done.stderr
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_a_report_that_a_short_grace_compaction_races_reads_the_run_again(run_dir, monkeypatch, capsys):
    _record(run_dir)
    connect = store.connect

    def racing(snap):  # the compaction lands between the report's listing of the parts and its reads
        con = connect(snap)
        store.compact(run_dir, grace_s=0)
        return con

    monkeypatch.setattr(store, "connect", racing)
    assert main(["report", str(run_dir), "--json"]) == 0
    assert '"steps"' in capsys.readouterr().out

    def always_racing(snap):  # parts vanish after every listing
        con = connect(snap)
        for part in (run_dir / "spans").glob("*.parquet"):
            part.rename(part.with_name(f"{part.stem}-moved.parquet"))
        return con

    monkeypatch.setattr(store, "connect", always_racing)
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "changed on each of 5 reads of this command" in err and "--grace" in err


def test_a_report_reads_again_while_writers_exit_one_after_another(run_dir, monkeypatch, capsys):
    """Writers leaving one after another each remove their merged-away parts: the parts a report
    listed may vanish on several reads in a row. It reads again until they hold still."""
    _record(run_dir)
    connect = store.connect
    left = [3]  # three writers exiting: three reads lose a part

    def exiting(snap):
        con = connect(snap)
        if left[0]:
            left[0] -= 1
            for part in (run_dir / "spans").glob("*.parquet"):
                part.rename(part.with_name(f"{part.stem}-{left[0]}.parquet"))  # gone under its listed name
        return con

    monkeypatch.setattr(store, "connect", exiting)
    assert main(["report", str(run_dir), "--json"]) == 0
    assert '"steps"' in capsys.readouterr().out and left == [0]
