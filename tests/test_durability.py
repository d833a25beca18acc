"""What survives `kill -9` of a writing process, and 8 processes writing one run at once."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from rltrace import store

from .conftest import PYTHON, REPO, python_env


@pytest.mark.parametrize("flush", [None, "0.02"], ids=["default", "merging"])
def test_spans_survive_sigkill_and_open_phases_stay_visible(run_dir, flush):
    """With flushes every 20 ms the writer merges its parts all the while (every 32 flushes), so the
    kill also lands in or between merges."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "tests.writer_process", str(run_dir), "--forever", *(["--flush-interval", flush] if flush else [])],
        cwd=REPO,
        env=python_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    ended: dict[int, int] = {}
    start = None  # from the writer's first step: its start-up (seconds on a loaded machine) is not writing time
    try:
        for line in proc.stdout:
            _, step, end_ns = line.split()
            ended[int(step)] = int(end_ns)
            start = time.monotonic() if start is None else start
            if time.monotonic() - start > 5:
                break
        kill_ns = time.time_ns()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    must_have = {step for step, end_ns in ended.items() if end_ns < kill_ns - 2_000_000_000}
    assert len(must_have) > 50, "the writer should have ended many steps more than 2 s before the kill"

    snap = store.scan(run_dir)  # every part file is readable: this raises on a torn part
    con = store.connect(snap)
    stored = {s for (s,) in con.execute("SELECT step FROM spans WHERE phase = 'step' AND NOT is_open").fetchall()}
    assert must_have <= stored, f"lost {sorted(must_have - stored)[:10]}"
    assert con.execute("SELECT count(*) - count(DISTINCT span_id) FROM spans WHERE NOT is_open").fetchone() == (0,)
    if flush:
        assert any("-m" in p.name for p in (run_dir / "spans").iterdir())  # it had merged parts when killed
    open_rows = con.execute("SELECT phase, step, attr(attributes, 'rl.note'), end_ns FROM spans WHERE is_open").fetchall()
    assert ("train", -1, "never ends", None) in open_rows
    (ended_ns,) = con.execute("SELECT ended_ns FROM processes").fetchone()
    assert ended_ns is None  # no clean shutdown was recorded


def test_eight_processes_write_one_run_without_losing_a_row(run_dir):
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.writer_process", str(run_dir), "--rank", str(rank), "--steps", "200", "--samples", "5", "--flush-interval", "0.05"],
            cwd=REPO,
            env=python_env(),
        )
        for rank in range(8)
    ]
    compactions = 0
    while any(p.poll() is None for p in procs):  # compact again and again while they write
        if (run_dir / "run.json").exists():
            store.compact(run_dir, target_rows=5_000, grace_s=0.2)
            compactions += 1
        time.sleep(0.2)
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    store.compact(run_dir, target_rows=5_000, grace_s=0)
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (8 * 200 * 3, 8 * 200 * 3)
    assert con.execute("SELECT count(*) FROM spans WHERE is_open").fetchone() == (0,)
    assert con.execute("SELECT count(*), count(DISTINCT (rank, step)) FROM metrics").fetchone() == (1600, 1600)
    assert con.execute("SELECT count(*), count(DISTINCT (rank, sample_id)) FROM samples").fetchone() == (8000, 8000)
    assert con.execute("SELECT count(*), sum(spans_dropped), sum(rows_dropped) FROM processes").fetchone() == (8, 0, 0)
    assert compactions >= 1
    assert len(list((run_dir / "spans").glob("*.parquet"))) < 8 * 20  # merged, not thousands of parts
