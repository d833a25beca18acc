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


def _writer_holding_its_lock(run_dir, process_id):
    """What a running writer holds (`rltrace.store.merge`): its lock file, locked."""
    import fcntl

    from rltrace.store import merge as merging

    (run_dir / merging.WRITERS).mkdir(exist_ok=True)
    lock = open(run_dir / merging.WRITERS / f"{process_id}.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return lock


def test_compact_leaves_a_running_writers_replaced_parts_and_new_summaries_to_it(tmp_path):
    """A running writer merged parts A and B into M and keeps A and B for its grace (a reader may
    have listed them), and writes M's summary just before M appears: `compact` deletes none of
    these. Once that writer is gone, `compact` deletes what it left."""
    from rltrace import _names
    from rltrace.store import digest
    from rltrace.store import merge as merging
    from rltrace.store.parts import write_part
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    p = b.process("rollout")
    root = p.span("rollout", 0, 10, step=0)
    for i in range(40):
        p.span("generate", i * 0.2, i * 0.2 + 0.1, step=0, parent=root)
    b.write()
    run, spans = b.run_dir, b.run_dir / "spans"
    (whole,) = spans.glob("*.parquet")
    table, pid = pq.read_table(whole), merging.process_of(whole.name)
    whole.unlink()
    a = write_part(spans, f"{pid}-000001.parquet", table.slice(0, 20), _names.SPANS)
    b_ = write_part(spans, f"{pid}-000002.parquet", table.slice(20), _names.SPANS)
    lock = _writer_holding_its_lock(run, pid)
    reader = store.open(run)  # lists A and B
    merging.merge(spans, _names.SPANS, [a, b_], merging.merged_name(pid, 1))  # A and B stay for the writer's grace
    next_name = merging.merged_name(pid, 2)  # its next merge: the summary is written, the part not yet
    summary = write_part(run / _names.SPAN_DIGEST.folder, next_name, digest.build(table), _names.SPAN_DIGEST,
                         digest.footer(next_name, table.num_rows))

    store.compact(run, grace_s=0.1)
    assert a.exists() and b_.exists() and summary.exists()
    assert reader.execute("SELECT count(*) FROM spans").fetchall() == [(41,)]  # the reader that listed A and B

    lock.close()  # the writer is gone (killed: it never deleted them)
    store.compact(run, grace_s=0.1)
    assert not a.exists() and not b_.exists() and not summary.exists()
    assert store.open(run).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchall() == [(41, 41)]


def test_compact_folds_copies_of_a_span_away_whatever_parts_hold_them(run_dir):
    """Copies of spans left in parts that replace nothing (a resent export stored twice by an older
    rltrace, a compaction that took a live writer's parts): compact keeps each span once, also
    when a part holding copies is large (`target_rows`)."""
    import shutil

    record(run_dir, 30)
    rltrace.init(run_dir)  # a second writer: one part of 30 spans
    for step in range(30):
        with rltrace.phase("step", step=step):
            pass
    rltrace.shutdown()
    parts = sorted((run_dir / "spans").glob("*.parquet"))
    big = next(p for p in parts if pq.read_metadata(p).num_rows == 30)
    shutil.copy(next(p for p in parts if p != big), run_dir / "spans" / "copy-a.parquet")  # a small part stored twice
    shutil.copy(big, run_dir / "spans" / "copy-b.parquet")
    assert store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone() == (91,)
    store.compact(run_dir, grace_s=0, target_rows=40)  # the part of 30 counts as large
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (60, 60)
    assert store.compact(run_dir, grace_s=0, target_rows=40)[0].rows == 60  # nothing left to fold


def test_two_merges_of_the_same_parts_are_read_once_by_every_reader(run_dir, capsys):
    """A compaction and a writer that merged the same parts (a writer paused past its heartbeat on
    an `s3://` run): the part whose every input the other parts replaced is left out, so the views,
    the report and the documented pyarrow reader count each span once; compact removes it."""
    import json

    from rltrace import _names
    from rltrace.store import merge

    from .test_other_engines import documented_reader

    record(run_dir, 12)
    flushed = sorted((run_dir / "spans").glob("*.parquet"))
    writer = merge.process_of(flushed[0].name)
    merge.merge(run_dir / "spans", _names.SPANS, flushed[:5], "c-00000000000a.parquet")  # the compaction's
    merge.merge(run_dir / "spans", _names.SPANS, flushed[5:9], "c-00000000000b.parquet")
    merge.merge(run_dir / "spans", _names.SPANS, flushed[:8], merge.merged_name(writer, 1))  # the writer's own,
    merge.merge(run_dir / "spans", _names.SPANS, flushed[8:], merge.merged_name(writer, 2))  # of every flush part
    assert store.open(run_dir).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (12, 12)
    assert cli(["report", str(run_dir), "--json"]) == 0
    assert sum(p["spans"] for p in json.loads(capsys.readouterr().out)["phases"]) == 12
    assert documented_reader(run_dir).num_rows == 12  # the snippet of docs/scale.md follows the same rule
    store.compact(run_dir, grace_s=0)
    assert not list((run_dir / "spans").glob("c-00000000000*.parquet"))
    assert documented_reader(run_dir).num_rows == 12
    assert store.open(run_dir).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (12, 12)
