"""A flood of spans or rows never grows memory without bound, and every drop is counted and stored."""

from __future__ import annotations

import json
import threading
import tracemalloc

import rltrace
from rltrace import store
from rltrace.cli import main as cli
from rltrace.otel import exporter
from rltrace.store import writer


def _blocking(real, gate: threading.Event):
    def write_part(*args, **kwargs):
        gate.wait(60)  # a disk that stalls: the exporter thread is stuck here
        return real(*args, **kwargs)

    return write_part


def test_span_flood_with_a_stalled_disk_is_bounded_and_counted(run_dir, monkeypatch, capsys):
    gate = threading.Event()
    monkeypatch.setattr(exporter, "write_part", _blocking(exporter.write_part, gate))
    run = rltrace.init(run_dir, max_queue=500, flush_interval=0.05)
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    for i in range(20_000):
        with rltrace.phase("generate", step=i, payload="x" * 200):
            pass
    growth = tracemalloc.get_traced_memory()[1] - baseline
    tracemalloc.stop()
    assert growth < 15e6, f"memory grew by {growth / 1e6:.1f} MB while the disk stalled"
    dropped = run.spans_dropped
    assert dropped > 15_000
    gate.set()
    rltrace.shutdown()
    con = store.open(run_dir)
    (written,) = con.execute("SELECT count(*) FROM spans WHERE NOT is_open").fetchone()
    assert written + dropped == 20_000
    assert con.execute("SELECT spans_dropped FROM processes").fetchone() == (dropped,)
    assert cli(["info", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spans_dropped"] == dropped


def test_row_flood_is_bounded_and_counted(run_dir, monkeypatch):
    gate = threading.Event()
    monkeypatch.setattr(writer, "write_part", _blocking(writer.write_part, gate))
    run = rltrace.init(run_dir, max_pending_rows=1_000, flush_interval=0.05)
    for step in range(100):
        rltrace.log_samples(step, [{"sample_id": i, "reward": 0.0} for i in range(100)])
    assert run.rows_dropped >= 100 * 100 - 1_000 - 100  # at most what fits, plus one batch in flight
    gate.set()
    rltrace.shutdown()
    con = store.open(run_dir)
    (kept,) = con.execute("SELECT count(*) FROM samples").fetchone()
    (dropped,) = con.execute("SELECT rows_dropped FROM processes").fetchone()
    assert kept + dropped == 10_000 and dropped == run.rows_dropped


def test_short_spans_leave_no_open_records_and_long_ones_do(run_dir):
    rltrace.init(run_dir, flush_interval=0.05)
    started = threading.Event()
    release = threading.Event()

    def hung_worker():
        with rltrace.phase("generate", step=3):
            started.set()
            release.wait(30)

    t = threading.Thread(target=hung_worker, name="rollout-worker")
    t.start()
    started.wait(10)
    for i in range(100):
        with rltrace.phase("reward", step=i):
            pass
    rltrace.flush()
    con = store.open(run_dir)
    rows = con.execute("SELECT phase, step, thread_name, end_ns FROM spans WHERE is_open").fetchall()
    assert rows == [("generate", 3, "rollout-worker", None)]
    release.set()
    t.join()
    rltrace.flush()
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM spans WHERE is_open").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (101,)
