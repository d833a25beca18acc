"""How the dashboard notices a run changing: the file fingerprint and the live-run test."""

from __future__ import annotations

import time

import pandas as pd

from rltrace.testing import RunBuilder
from rltrace.ui import data, runs


def test_the_fingerprint_changes_with_every_new_part_and_only_then(tmp_path):
    b = RunBuilder(tmp_path / "run")
    proc = b.process("trainer")
    proc.span("train", 0, 1, step=0)
    b.write()
    first = runs.fingerprint(str(b.run_dir))
    assert runs.fingerprint(str(b.run_dir)) == first
    (b.run_dir / "spans" / ".half-written.parquet.tmp").write_bytes(b"x")  # a writer's temp file: ignored
    assert runs.fingerprint(str(b.run_dir)) == first
    proc.span("train", 1, 2, step=1)
    b.write()
    assert runs.fingerprint(str(b.run_dir)) != first


def _procs(ended_ns, heartbeat_ns) -> dict:
    return {"processes": pd.DataFrame({"ended_ns": [ended_ns], "heartbeat_ns": [heartbeat_ns]})}


def test_a_run_is_live_while_a_process_that_has_not_shut_down_keeps_writing():
    now = time.time_ns()
    assert data.is_live(_procs(None, now - 5 * 10**9), now)
    assert not data.is_live(_procs(now - 10**9, now - 10**9), now)  # shut down
    assert not data.is_live(_procs(None, now - 3600 * 10**9), now)  # silent for an hour: dead or hung


def test_run_dirs_with_colons_reach_the_dashboard_whole(tmp_path, monkeypatch, app):
    """ISO timestamps put ":" in run dir names: `rltrace ui` passes each dir whole, and the page shows that run."""
    from rltrace.cli import build_parser
    from rltrace.cli import ui as ui_cli

    dirs = []
    for name in ("runs:2026-12-01T05:00:00", "other"):
        b = RunBuilder(tmp_path / name, name=f"named {name}")
        b.process("trainer").span("train", 0, 1, step=0)
        dirs.append(b.write())
    (tmp_path / "runs").mkdir()  # what splitting on ":" would have pointed at
    _, env = ui_cli.command(build_parser().parse_args(["ui", *map(str, dirs)]))
    monkeypatch.setenv("RLTRACE_UI_RUNS", env["RLTRACE_UI_RUNS"])
    assert runs.run_dirs() == [str(d.resolve()) for d in dirs]
    at = app()  # the dashboard over what `rltrace ui` passed, unchanged
    assert not at.error and not at.exception
    assert at.title[0].value == "named runs\\:2026\\-12\\-01T05\\:00\\:00"  # the first run's name, escaped for markdown
    monkeypatch.setenv("RLTRACE_UI_RUNS", str(dirs[0]))  # a plain value is one run dir, colons and all
    assert runs.run_dirs() == [str(dirs[0])]
