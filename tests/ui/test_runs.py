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
