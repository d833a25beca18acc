"""Writers merge their own parts: in the background and at exit, without a reader ever seeing a
row twice or missing one, and leaving `rltrace compact` only the parts of writers that are gone."""

from __future__ import annotations

import errno
import signal
import subprocess
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import store
from rltrace.store import merge

from ..conftest import PYTHON, REPO, python_env


def _parts(run_dir, folder="spans"):
    return sorted(p.name for p in (run_dir / folder).glob("*.parquet"))


def test_a_run_is_compact_once_its_writer_exits(run_dir):
    rltrace.init(run_dir, flush_interval=0.01)
    for step in range(40):
        with rltrace.phase("step", step=step):
            with rltrace.phase("train"):
                pass
        rltrace.log_metrics(step, loss=float(step))
        rltrace.flush()  # a part per step and table
    assert len(_parts(run_dir)) >= 20 or any("-m" in n for n in _parts(run_dir))
    rltrace.shutdown()
    spans, metrics = _parts(run_dir), _parts(run_dir, "metrics")
    assert len(spans) == 1 and "-m" in spans[0] and len(metrics) == 1  # nothing replaced is left behind
    steps = pq.read_table(run_dir / "spans" / spans[0], columns=["step"]).column("step").to_pylist()
    assert steps == sorted(steps)  # merged parts are sorted by step
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (80, 80)
    assert con.execute("SELECT count(*) FROM metrics").fetchone() == (40,)
    assert not list((run_dir / merge.WRITERS).glob("*.lock"))  # a clean exit leaves no lock file


def test_readers_never_see_a_row_twice_or_miss_one_while_a_writer_merges(run_dir, monkeypatch):
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)  # merge every few flushes, and the merged parts again
    monkeypatch.setattr(merge, "TIER", 2)
    monkeypatch.setenv("RLTRACE_MERGE_GRACE", "2")
    run = rltrace.init(run_dir, flush_interval=0.02)
    flushed, seen, errors = [0], [], []
    done = threading.Event()

    def reader():
        while not done.is_set():
            try:
                before = flushed[0]
                total, distinct = store.reading(lambda: store.open(run_dir).execute(
                    "SELECT count(*), count(DISTINCT span_id) FROM spans WHERE NOT is_open").fetchone())
                seen.append((before, total, distinct))
            except Exception as exc:  # a torn view or a part gone too early would show here
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for step in range(150):
            with rltrace.phase("step", step=step):
                pass
            rltrace.flush()
            flushed[0] = step + 1
    finally:
        done.set()
        t.join()
    assert not errors, errors[:3]
    assert run.merger.merges >= 10  # merged many times while the reader read
    assert seen and all(total == distinct for _, total, distinct in seen)  # never a row twice
    assert all(total >= before for before, total, _ in seen)  # never a flushed row missing
    totals = [total for _, total, _ in seen]
    assert totals == sorted(totals)
    rltrace.shutdown()
    assert store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone() == (150,)


def _twenty_parts_then_a_merge(run_dir):
    """A writer that flushed 20 one-step parts, then one pass of its merger; the writer's run."""
    run = rltrace.init(run_dir, flush_interval=0.01)
    for step in range(20):
        with rltrace.phase("step", step=step):
            pass
        rltrace.flush()
    run.merger.tick()
    return run


def test_a_merge_that_fails_on_a_full_disk_loses_nothing(run_dir, monkeypatch):
    real = merge.merge
    full = [True]

    def no_space(*args, **kwargs):
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(merge, "merge", no_space)
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    run = _twenty_parts_then_a_merge(run_dir)
    assert run.merger.merges == 0 and len(_parts(run_dir)) == 20  # every part stays as written, readable
    assert store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone() == (20,)
    full[0] = False  # space again: the merge at exit goes through
    rltrace.shutdown()
    assert len(_parts(run_dir)) == 1
    assert store.open(run_dir).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (20, 20)


def test_a_merge_that_fails_after_its_summary_was_written_leaves_no_summary_behind(run_dir, monkeypatch):
    real = merge.write_part
    full = [True]

    def no_space_for_spans(folder, name, *args, **kwargs):
        if full[0] and Path(folder).name == "spans" and "-m" in name:  # the merged part, after its summary
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(folder, name, *args, **kwargs)

    monkeypatch.setattr(merge, "write_part", no_space_for_spans)
    monkeypatch.setattr(merge, "SUMMARISE_ROWS", 0)  # every merged part gets a summary
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    run = _twenty_parts_then_a_merge(run_dir)
    assert run.merger.merges == 0 and len(_parts(run_dir)) == 20
    assert not _parts(run_dir, "span_digests")  # the summary of the part that never came is gone
    full[0] = False
    rltrace.shutdown()
    (merged,) = _parts(run_dir)
    assert _parts(run_dir, "span_digests") == [merged]
    assert store.open(run_dir).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (20, 20)


KILLED = """
import sys, time, rltrace
rltrace.init(sys.argv[1], role="rollout", flush_interval=0.01)
for i in range(100):
    with rltrace.phase("step", step=i):
        pass
    rltrace.flush()
print("ready", flush=True)
time.sleep(60)
"""


def test_compact_merges_a_killed_writers_parts_and_leaves_a_live_writers_alone(run_dir):
    proc = subprocess.Popen([PYTHON, "-c", KILLED, str(run_dir)], cwd=REPO, env=python_env(RLTRACE_MERGE_PARTS="0"),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed = _parts(run_dir)
    assert len(killed) == 100
    live = rltrace.init(run_dir, role="trainer", flush_interval=0.01)  # this process: a writer still running
    for i in range(5):
        with rltrace.phase("train", step=i):
            pass
        rltrace.flush()
    mine = [n for n in _parts(run_dir) if n.startswith(live.process.process_id)]
    assert len(mine) == 5
    assert merge.writer_alive(run_dir, live.process.process_id)
    store.compact(run_dir, grace_s=0)
    after = _parts(run_dir)
    assert set(mine) <= set(after)  # the live writer's parts are its own to merge
    assert not set(killed) & set(after) and sum(n.startswith("c-") for n in after) == 1
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (105, 105)
    assert len(_parts(run_dir)) == 2


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_a_bad_merge_grace_fails_init_naming_the_variable(run_dir, monkeypatch, value):
    monkeypatch.setenv("RLTRACE_MERGE_GRACE", value)
    with pytest.raises(ValueError, match="RLTRACE_MERGE_GRACE"):
        rltrace.init(run_dir)


def test_merged_names_keep_the_process_and_flush_parts_are_told_apart():
    name = merge.merged_name("rollout3-host-12-ab12cd", 7)
    assert merge.process_of(name) == merge.process_of("rollout3-host-12-ab12cd-00000001.parquet") == "rollout3-host-12-ab12cd"
    assert merge.is_flush_part("rollout3-host-12-ab12cd-00000001.parquet") and not merge.is_flush_part(name)


def test_a_forked_writer_holds_its_lock_before_its_first_part_appears(run_dir, monkeypatch):
    """A forked child takes its own lock (its parent's is the parent's). Taken only after its first
    part, `rltrace compact` could merge that part as a dead writer's while the child merges it too."""
    import fcntl

    from rltrace.otel import exporter
    from rltrace.store import writer

    run = rltrace.init(run_dir, flush_interval=0.02)
    run.merger.after_fork()  # what a forked child's merger is: no lock yet
    lock_path = run_dir / merge.WRITERS / f"{run.process.process_id}.lock"
    held = []

    def checking(module):
        real = module.write_part

        def write_part(folder, name, *args, **kwargs):
            with open(lock_path, "a") as probe:
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append((name, False))
                    fcntl.flock(probe, fcntl.LOCK_UN)
                except BlockingIOError:
                    held.append((name, True))
            return real(folder, name, *args, **kwargs)
        monkeypatch.setattr(module, "write_part", write_part)

    checking(exporter)
    checking(writer)
    with rltrace.phase("step", step=0):
        rltrace.log_metrics(0, loss=1.0)
    rltrace.flush()
    rltrace.shutdown()
    assert held and all(ok for _, ok in held), held


def test_a_writer_lock_is_held_free_or_unknown_and_only_free_means_gone(run_dir, monkeypatch):
    """`health.gone` calls a process stopped only when a probe took its lock: a filesystem that
    cannot lock (ENOSYS) tells nothing, so a live writer there is never called killed."""
    import fcntl
    import os

    lock = run_dir / merge.WRITERS / "w1.lock"
    lock.parent.mkdir(parents=True)
    assert merge.lock_state(run_dir, "w0") == "unknown"  # no lock file
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert merge.lock_state(run_dir, "w1") == "held" and merge.writer_alive(run_dir, "w1")
    assert merge.lock_state(run_dir, "w1") == "free" and not merge.writer_alive(run_dir, "w1")

    def cannot(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(merge.fcntl, "flock", cannot)
    assert merge.lock_state(run_dir, "w1") == "unknown"
    import socket

    from rltrace.analysis import health
    from rltrace.testing import RunBuilder

    b = RunBuilder(run_dir)  # a run whose process w1 ran on this host
    b.process("w", 1, host=socket.gethostname())
    b.write()
    (w1,) = [p.process_id for p in b.processes]
    lock.rename(lock.with_name(f"{w1}.lock"))
    con = store.open(run_dir)
    assert health.gone(con, [w1]) == set()  # unknown: not gone
    monkeypatch.undo()
    assert health.gone(con, [w1]) == {w1}  # free: gone
    con.execute(f"CREATE OR REPLACE TEMP TABLE mine AS SELECT * REPLACE ({os.getpid()}::BIGINT AS pid) FROM processes")
    con.execute("CREATE OR REPLACE VIEW processes AS SELECT * FROM mine")
    assert health.gone(con, [w1]) == set()  # this process is never probed


def test_a_part_whose_delete_failed_stays_hidden_after_its_merged_part_is_merged_again(run_dir, monkeypatch, caplog):
    """A run dir where the writer's flush parts cannot be deleted for a while (`chattr +i`, a
    read-only moment): the merged part hiding them is merged again and deleted; the new part must
    hide them too (never a span twice), and they are deleted once that is possible again."""
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    monkeypatch.setattr(merge, "TIER", 2)
    real_unlink = Path.unlink
    refusing = [True]

    def unlink(self, *args, **kwargs):
        if refusing[0] and merge.is_flush_part(self.name):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(self))
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    run = rltrace.init(run_dir, flush_interval=0.01)
    for step in range(8):
        with rltrace.phase("step", step=step):
            pass
        rltrace.flush()
        run.merger.tick()
    run.merger.tick()
    names = _parts(run_dir)
    assert len([n for n in names if "-m" in n]) == 1 and len(names) == 9  # merged, merged again; 8 undeletable
    assert store.open(run_dir).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (8, 8)
    refusing[0] = False
    rltrace.shutdown()  # deletable again: what could not be deleted is deleted now
    assert len(_parts(run_dir)) == 1
    assert store.open(run_dir).execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (8, 8)


def test_a_run_dir_unwritable_for_a_while_costs_counted_rows_and_one_line_per_kind_of_error(run_dir, monkeypatch, caplog):
    """Every write into the run fails for a while (`chattr +i`): the rows of that while are dropped
    and counted, each kind of error is said once in one line (no traceback), and the spans
    written before and after are each stored once."""
    import logging
    import os

    real_replace = os.replace
    refusing = [False]

    def replace(src, dst, *args, **kwargs):
        if refusing[0] and str(run_dir) in str(dst):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    caplog.set_level(logging.WARNING, logger="rltrace")
    run = rltrace.init(run_dir, flush_interval=0.01)
    for step in range(30):
        refusing[0] = 10 <= step < 20
        with rltrace.phase("step", step=step):
            pass
        rltrace.log_metrics(step, loss=1.0)
        rltrace.flush()
        run.merger.tick()
    refusing[0] = False
    rltrace.shutdown()
    records = [r for r in caplog.records if r.name == "rltrace"]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records if r.exc_info][:3]
    assert len(records) <= 6, [r.getMessage() for r in records]
    con = store.open(run_dir)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone()
    assert total == distinct and 20 <= total <= 30
    (dropped,) = con.execute("SELECT sum(rows_dropped) FROM processes").fetchone()
    assert dropped >= 30 - total
    from rltrace.cli.info import collect

    errors = [r for r in collect(str(run_dir))["drop_reasons"] if r["table"] == "write errors"]
    assert errors and all(r["count"] >= 1 and "PermissionError" in r["reason"] for r in errors)  # counted, by kind
