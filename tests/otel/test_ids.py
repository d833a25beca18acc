"""Span and trace ids stay unique when every rank seeds `random` alike, and after fork."""

from __future__ import annotations

import subprocess

from rltrace import store

from ..conftest import PYTHON, REPO, python_env


def test_ids_unique_across_ranks_that_seed_random_identically(run_dir):
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.writer_process", str(run_dir), "--rank", str(r), "--steps", "50", "--seed", "1337"],
            cwd=REPO,
            env=python_env(),
        )
        for r in range(3)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    con = store.open(run_dir)
    total, spans, traces, roots = con.execute(
        "SELECT count(*), count(DISTINCT span_id), count(DISTINCT trace_id), count(*) FILTER (parent_span_id IS NULL) FROM spans"
    ).fetchone()
    assert total == spans == 3 * 50 * 3
    assert traces == roots == 3 * 50  # each step is its own trace, none shared by accident


FORK_SCRIPT = """
import os, random, sys
import rltrace
rltrace.init(sys.argv[1], role="trainer")
random.seed(7)
with rltrace.phase("step", step=0):
    pass
pid = os.fork()
if pid == 0:  # child: record, flush, leave without running the parent's atexit handlers
    code = 1
    try:
        random.seed(7)
        for i in range(20):
            with rltrace.phase("generate", step=i):
                pass
        rltrace.shutdown()
        code = 0
    finally:
        os._exit(code)
random.seed(7)
for i in range(20):
    with rltrace.phase("train", step=i):
        pass
_, status = os.waitpid(pid, 0)
rltrace.shutdown()
print(os.getpid(), pid, os.waitstatus_to_exitcode(status))
"""


def test_ids_unique_in_parent_and_child_after_fork(run_dir):
    # A fresh interpreter: the test process itself holds threads of other libraries (DuckDB,
    # torch) from earlier tests, and forking those is unsafe whatever rltrace does.
    out = subprocess.run([PYTHON, "-c", FORK_SCRIPT, str(run_dir)], env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    parent_pid, child_pid, child_exit = map(int, out.stdout.split())
    assert child_exit == 0
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT span_id), count(DISTINCT trace_id) FROM spans").fetchone() == (41, 41, 41)
    by_process = dict(con.execute("SELECT phase, count(DISTINCT process_id) FROM spans GROUP BY phase").fetchall())
    assert by_process == {"step": 1, "train": 1, "generate": 1}
    pids = dict(con.execute("SELECT phase, any_value(pid) FROM spans GROUP BY phase").fetchall())
    assert pids["generate"] == child_pid and pids["train"] == parent_pid
    assert con.execute("SELECT count(*) FROM processes").fetchone() == (2,)
