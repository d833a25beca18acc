"""Compaction merges parts without losing or duplicating a row, while readers and writers run."""

from __future__ import annotations

import os
import threading

import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import store
from rltrace.cli import main as cli
from rltrace.store import StoreError


def record(run_dir, steps: int) -> None:
    """A writer that leaves its parts as written (as a process killed, or of an older version, does)."""
    os.environ["RLTRACE_MERGE_PARTS"] = "0"
    try:
        rltrace.init(run_dir, flush_interval=0.01)
        for step in reversed(range(steps)):  # written out of step order: compaction sorts
            with rltrace.phase("step", step=step):
                pass
            rltrace.log_metrics(step, loss=float(step))
            rltrace.flush()  # one part per step
        rltrace.shutdown()
    finally:
        del os.environ["RLTRACE_MERGE_PARTS"]


def test_compact_merges_and_sorts_by_step(run_dir, capsys):
    record(run_dir, 30)
    before = len(list((run_dir / "spans").glob("*.parquet")))
    assert before >= 30
    assert cli(["compact", str(run_dir), "--grace", "0"]) == 0
    assert "spans:" in capsys.readouterr().out
    parts = list((run_dir / "spans").glob("*.parquet"))
    assert len(parts) == 1
    steps = pq.read_table(parts[0], columns=["step"]).column("step").to_pylist()
    assert steps == sorted(steps) == list(range(30))
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (30, 30)
    assert con.execute("SELECT count(*) FROM metrics").fetchone() == (30,)


def test_readers_never_see_a_row_twice_or_miss_one_during_compaction(run_dir):
    record(run_dir, 40)
    counts, errors = [], []
    done = threading.Event()

    def reader():
        while not done.is_set():
            try:
                counts.append(store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone()[0])
            except Exception as exc:  # a torn view would show up here
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(3):
            store.compact(run_dir, target_rows=15, grace_s=0.5)
    finally:
        done.set()
        t.join()
    assert not errors
    assert counts and set(counts) == {40}


def test_leftovers_of_an_interrupted_compaction_are_resolved(run_dir):
    record(run_dir, 10)
    parts = sorted((run_dir / "spans").glob("*.parquet"))
    saved = {p: p.read_bytes() for p in parts}
    store.compact(run_dir, grace_s=0)
    for path, data in saved.items():  # as if the compactor died before deleting its inputs
        path.write_bytes(data)
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (10,)
    store.compact(run_dir, grace_s=0)
    assert len(list((run_dir / "spans").glob("*.parquet"))) == 1
    assert store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone() == (10,)


def test_compact_refuses_a_non_run(tmp_path):
    with pytest.raises(StoreError, match="not an rltrace run"):
        store.compact(tmp_path)
    assert not (tmp_path / ".compact.lock").exists()
