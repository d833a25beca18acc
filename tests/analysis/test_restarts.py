"""A resumed run: a process stops and a later one of the same role redoes the steps after its
checkpoint. Neither is waiting while the other runs, and the report says those steps hold two
attempts. A run written again and again into one directory (the same step numbers recorded
again much later) must still give a report, in bounded time and memory."""

from __future__ import annotations

import json

from rltrace import report, store
from rltrace.analysis import _intervals as iv
from rltrace.testing import RunBuilder


def _resumed(run_dir):
    """trainer A: steps 0-9 (1 s each: rollout 0.4 s, train 0.6 s), stops at 10 s; trainer B
    starts at 40 s (a restart 30 s later) and redoes steps 5-14 from the checkpoint of step 5."""
    run = RunBuilder(run_dir)
    a = run.process("trainer", ended=10.01)
    b = run.process("trainer", started=38.0, ended=50.01)
    for proc, first, t0 in ((a, 0, 0.0), (b, 5, 40.0)):
        for i in range(10):
            t = t0 + i
            proc.span("rollout", t, t + 0.4, step=first + i)
            proc.span("train", t + 0.4, t + 1.0, step=first + i)
    return run.write()


def test_a_resumed_run_has_no_wait_across_the_restart_and_names_the_steps_recorded_twice(tmp_path):
    r = report.build(store.open(_resumed(tmp_path / "run")))
    # every process was busy the whole time it was alive: no second of the 30 s restart is a wait
    assert sum(w["seconds"] for w in r["waits"]) < 0.1, r["waits"]
    twice = [s for s in r["findings"] if "recorded twice" in s]
    assert len(twice) == 1 and twice[0].startswith("Steps 5–9 were recorded twice: trainer0 (node0:1000)"), twice
    assert r["restarts"] == [{"name": "trainer0", "before": "node0:1000", "after": "node0:1001",
                              "first_step": 5, "last_step": 9}]
    json.dumps(r["restarts"])


def test_workers_of_one_role_alive_together_are_not_restarts(tmp_path):
    run = RunBuilder(tmp_path / "run")
    w0, w1 = run.process("rollout", rank=None), run.process("rollout", rank=None)  # same name, both alive
    for i in range(4):
        w0.span("rollout", i, i + 0.5, step=i)
        w1.span("rollout", i + 0.5, i + 1.0, step=i)
    r = report.build(store.open(run.write()))
    assert r["restarts"] == [] and not [s for s in r["findings"] if "recorded twice" in s]


def test_windows_crossing_most_of_the_intervals_are_left_out_past_the_limit():
    # one group, 1,000 unit gaps; 10 narrow windows (1 gap each) and 1 window over all of them
    start = [2 * i for i in range(1000)]
    end = [2 * i + 1 for i in range(1000)]
    wins = [(2 * i, 2 * i + 1) for i in range(10)] + [(0, 2000)]
    ws, we = zip(*wins)
    win, a, b, left_out = iv.clip_within([0] * 1000, start, end, [0] * 11, ws, we, limit=100)
    assert list(left_out) == [10]  # the widest goes; the narrow ones are exact
    assert list(win) == list(range(10)) and list(a) == [2 * i for i in range(10)]
    win, a, b, left_out = iv.clip_within([0] * 1000, start, end, [0] * 11, ws, we, limit=None)
    assert len(left_out) == 0 and len(win) == 1010


def test_a_script_run_three_times_into_one_directory_still_reports(tmp_path, caplog, monkeypatch):
    """Three runs of 1,000 steps each into one directory: every step's window spans the three
    runs, so its waits would cross up to 2,000 other steps' gaps (2M pieces). They are left out, said.
    (The reference implementation, which every other test checks against, is quadratic here.)"""
    from rltrace.analysis import _compute

    monkeypatch.setattr(_compute, "compute", _compute.compute.__wrapped__)
    run = RunBuilder(tmp_path / "run")
    n = 1000
    for k in range(3):
        p = run.process("bench", started=k * 100.0, ended=k * 100.0 + n * 0.02 + 0.1)
        for i in range(n):
            t = k * 100.0 + i * 0.02
            p.span("reward", t, t + 0.01, step=i)
    with caplog.at_level("WARNING", logger="rltrace"):
        r = report.build(store.open(run.write()))
    assert r["steps"] and len([s for s in r["findings"] if "recorded twice" in s]) == 2
    assert any("were not computed" in m for m in caplog.messages), caplog.messages


def test_late_starters_sharing_a_name_are_told_apart(tmp_path):
    """Two rankless `bench` processes joining step 0 late: the start-up sentence names each by host:pid."""
    run = RunBuilder(tmp_path / "run")
    tr = run.process("trainer")
    benches = [run.process("bench", None, started=0.1), run.process("bench", None, started=0.2)]
    for step in range(3):
        tr.span("rollout", step * 5.0, step * 5.0 + 4.0, step=step)
        tr.span("train", step * 5.0 + 4.0, step * 5.0 + 5.0, step=step)
    for proc, late in zip(benches, (1.5, 2.5)):
        for step in range(3):
            proc.span("generate", step * 5.0 + (late if step == 0 else 0.5), step * 5.0 + 3.9, step=step)
    r = report.build(store.open(run.write()))
    names = [s["name"] for s in r["startups"]]
    assert names == [f"bench (node0:{benches[1].pid})", f"bench (node0:{benches[0].pid})"], names
    [said] = [f for f in r["findings"] if f.startswith("Start-up:")]
    assert "bench and bench" not in said and f"bench (node0:{benches[0].pid})" in said
