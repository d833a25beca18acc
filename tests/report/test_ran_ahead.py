"""A step is a trainer step: work that ran ahead into a step the trainer never reached (an async
rollout worker generating for a step the trainer stopped before) is told apart, not averaged in, and the report and
`rltrace info` count the same steps."""

from __future__ import annotations

from rltrace import report, store
from rltrace.cli import info
from rltrace.testing import RunBuilder


def test_work_that_ran_ahead_is_told_apart_and_every_view_counts_trainer_steps(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(6):
        ro.span("rollout", step * 2.0, step * 2.0 + 1.0, step=step)
        tr.span("train", step * 2.0 + 1.0, step * 2.0 + 2.0, step=step)
    ro.span("rollout", 12.0, 15.0, step=6)  # the worker ran ahead; the trainer stopped after step 5
    b.write()
    r = report.plain(report.build(store.open(b.run_dir)))
    assert [s["step"] for s in r["steps"]] == list(range(6))
    assert r["t_R"] == 1.0  # the 3 s rollout of step 6 is not in the median
    assert r["ran_ahead"] == {"steps": [6], "spans": 1, "processes": ["rollout0"]}
    assert (r["step_range"]["run_first"], r["step_range"]["run_last"], r["step_range"]["run_steps"]) == (0, 5, 6)
    assert r["findings"][0] == ("Work ran ahead into step 6, which the trainer never reached (1 span on rollout0): "
                                "left out of every figure here, which counts 6 trainer steps.")
    s = info.collect(str(b.run_dir))["spans"]
    assert (s["first_step"], s["last_step"], s["steps"], s["ran_ahead"]) == (0, 5, 6, [6])


def test_a_step_the_trainer_reached_and_died_in_is_its_step(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(3):
        ro.span("rollout", step * 2.0, step * 2.0 + 1.0, step=step)
        tr.span("train", step * 2.0 + 1.0, step * 2.0 + 2.0, step=step)
    ro.span("rollout", 6.0, 7.0, step=3)
    tr.span("train", 7.0, None, step=3)  # killed mid-train: the trainer reached step 3
    b.write()
    r = report.plain(report.build(store.open(b.run_dir)))
    assert r["ran_ahead"] is None and [s["step"] for s in r["steps"]] == [0, 1, 2, 3]
