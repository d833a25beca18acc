"""A summary stored by `rltrace compact` never outlives the spans it summarised: spans without a
step (a reward server that never received the carrier) arriving after compaction recompute the
steps they overlap, and compacting again stores the fresh answer."""

import shutil

from rltrace import _names, analysis, store
from rltrace.cli import main
from rltrace.testing import RunBuilder


def _waits(run_dir):
    frame = analysis.waits(store.open(run_dir))
    return frame.sort_values(list(frame.columns[:4])).reset_index(drop=True)


def _fresh(run_dir, tmp_path):
    """The same run analysed with no stored summary at all."""
    copy = tmp_path / "fresh"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / _names.STEP_SUMMARY.folder, ignore_errors=True)
    return _waits(copy)


def test_late_stepless_reward_spans_recompute_the_stored_summary(tmp_path):
    b = RunBuilder(tmp_path / "run")
    trainer, reward = b.process("trainer"), b.process("reward")
    for step in range(4):
        o = 10.0 * step
        trainer.span("rollout", o, o + 0.25, step=step)
        trainer.span("wait", o + 0.25, o + 1.75, step=step)  # waits 1.5 s for the reward server
        trainer.span("train", o + 1.75, o + 2.0, step=step)
    run = b.write(parts_per_process=2)
    assert main(["compact", str(run), "--grace", "0"]) == 0
    stored_before = _waits(run)

    for step in range(4):  # the reward server flushes late, and its spans carry no step
        o = 10.0 * step
        reward.span("reward", o + 0.49, o + 1.75)
    b.write()
    fresh = _fresh(run, tmp_path)
    assert "reward" in set(fresh["waited_for"].dropna()), "the scenario: a fresh analysis blames the reward server"
    assert "reward" not in set(stored_before["waited_for"].dropna())  # what the stored summary said
    assert _waits(run).equals(fresh)  # late spans recompute the steps they overlap

    assert main(["compact", str(run), "--grace", "0"]) == 0  # compacting again stores the fresh answer
    con = store.open(run)
    stored = con.execute("SELECT DISTINCT other FROM step_summary WHERE kind = 'wait'").fetchall()
    assert ("reward",) in stored
    assert _waits(run).equals(_fresh(run, tmp_path))


def test_an_unchanged_run_reuses_every_stored_step(tmp_path, monkeypatch):
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    for step in range(3):
        trainer.span("train", 2.0 * step, 2.0 * step + 1, step=step)
    run = b.write(parts_per_process=2)
    assert main(["compact", str(run), "--grace", "0"]) == 0
    from rltrace.analysis import _compute, summary

    computed = []
    real = _compute.compute
    monkeypatch.setattr(_compute, "compute", lambda spans, checks, *rest: computed.append(len(checks)) or real(spans, checks, *rest))
    windows = []
    monkeypatch.setattr(summary, "windows", lambda con, steps: windows.append(1))
    summary.rows(store.open(run))
    assert computed == [] and windows == []  # same parts: no recomputation, not even the window check
