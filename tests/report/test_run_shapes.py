"""Known answers on the run shapes real trainers produce: nested stages (TRL generates inside its
training step), generation every k steps, no weight sync, near ties, framework metric names."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from rltrace import analysis, report, store
from rltrace.testing import RunBuilder


def _report(b: RunBuilder) -> dict:
    b.write()
    return report.build(store.open(b.run_dir), now_ns=0)


def _text(data: dict) -> str:
    return " ".join(data["findings"])


def test_nested_stages_count_for_the_innermost_stage(tmp_path):
    """8 sequential steps: train contains rollout (0.20 s) and reward (0.05 s), its own work 0.10 s."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(8):
        o = 0.35 * step
        t = tr.span("train", o, o + 0.35, step=step)
        tr.span("rollout", o, o + 0.20, step=step, parent=t)
        tr.span("reward", o + 0.20, o + 0.25, step=step, parent=t)
    data = _report(b)
    assert data["t_T"] == pytest.approx(0.10, abs=1e-9)
    assert data["t_R"] == pytest.approx(0.25, abs=1e-9)
    assert data["t_reward"] == pytest.approx(0.05, abs=1e-9)
    assert data["t_sync"] == pytest.approx(0.35, abs=1e-9)  # = the step's wall time, nothing counted twice
    assert data["bottleneck"]["stage"] == "rollout"
    assert data["async"]["overlapping"] is False
    assert data["async"]["achieved_speedup"] == 1.0
    assert data["async"]["concurrent_s"] == 0.0
    assert {(n["outer"], n["inner"]) for n in data["nested"]} == {("train", "rollout"), ("train", "reward")}
    text = _text(data)
    assert "reward and rollout run inside train on the same thread" in text
    assert "train counts its own 100 ms per step" in text
    assert "Stages overlap" not in text and "no measured overlap" in text
    # waits see the same rule: the trainer was never idle and waited for nobody
    assert not data["waits"]
    # and so does the critical path: the nested stages are links of their own, train's link is its own work
    assert data["critical_path"][0]["path"] == "rollout → reward → train"


def test_stages_deeper_than_one_level_and_back(tmp_path):
    """train > forward > rollout: rollout leaves both; rollout > forward: forward leaves rollout."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    t = tr.span("train", 0, 10, step=0)
    f = tr.span("forward", 0, 6, step=0, parent=t)
    r = tr.span("rollout", 1, 5, step=0, parent=f)
    tr.span("forward", 2, 3, step=0, parent=r)
    cm = analysis.cost_model(store.open(b.write())).iloc[0]
    assert cm["t_R"] == pytest.approx(3.0, abs=1e-9)  # [1,5] minus the inner forward [2,3]
    assert cm["t_T"] == pytest.approx(7.0, abs=1e-9)  # [0,10] minus [1,5], plus the inner forward
    assert cm["t_R"] + cm["t_T"] == pytest.approx(cm["wall_s"], abs=1e-9)


def test_concurrency_on_another_thread_is_overlap(tmp_path):
    """A rollout on an engine thread during train is real overlap, nested or not."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(4):
        o = 2.0 * step
        t = tr.span("train", o, o + 2, step=step)
        tr.span("rollout", o + 1, o + 2, step=step, parent=t, thread=2)
    data = _report(b)
    assert data["t_T"] == pytest.approx(2.0, abs=1e-9)  # another thread's rollout is not taken out of train
    assert data["async"]["overlapping"] is True
    assert data["async"]["achieved_speedup"] == pytest.approx(12 / 8, abs=1e-9)
    assert not data["nested"]


def test_generation_every_k_steps_is_amortised(tmp_path):
    """Rollout (0.2 s) on every second step, train (0.1 s) every step, strictly sequential."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    t = 0.0
    for step in range(8):
        if step % 2 == 0:
            tr.span("rollout", t, t + 0.2, step=step)
            t += 0.2
        tr.span("train", t, t + 0.1, step=step)
        t += 0.1
    data = _report(b)
    assert data["t_R"] == pytest.approx(0.1, abs=1e-9)  # 0.2 s serves two steps
    assert data["t_T"] == pytest.approx(0.1, abs=1e-9)
    assert data["amortised"] == {"t_R": 2}  # no reward span: t_reward is not recorded, not 0 amortised
    assert data["t_reward"] is None and data["figures"]["t_reward"]["kind"] == "not recorded"
    assert data["async"]["achieved_speedup"] == 1.0
    assert data["async"]["overlapping"] is False
    steps = {s["step"]: s for s in data["steps"]}
    assert steps[0]["t_R"] == pytest.approx(0.2) and steps[0]["t_R_amortised"] == pytest.approx(0.1)
    assert steps[1]["t_R"] is None and steps[1]["t_R_amortised"] == pytest.approx(0.1)
    assert "rollout and reward runs every 2 steps" in _text(data)
    out = io.StringIO()
    report.render(data, Console(file=out, width=100, color_system=None), full=True)
    assert "200 ms (100 ms)" in out.getvalue()  # the step table shows both


def test_no_weight_sync_is_not_recorded_rather_than_zero(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(4):
        tr.span("rollout", step, step + 0.6, step=step)
        tr.span("train", step + 0.6, step + 1, step=step)
    data = _report(b)
    assert data["t_W"] is None and json.loads(json.dumps(report.plain(data)))["t_W"] is None
    assert data["recorded"] == ["t_R", "t_T"]
    assert data["async_bound"] == pytest.approx(0.6, abs=1e-9)
    text = _text(data)
    assert "t_W = not recorded" in text
    assert "t_W not recorded, left out" in text
    assert "payload" not in text and "bytes" not in text
    out = io.StringIO()
    report.render(data, Console(file=out, width=100, color_system=None))
    assert "not recorded" in out.getvalue()


def test_near_tie_names_both_stages(tmp_path):
    """Rollout and train medians 10 % apart with spreads that overlap: within noise."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    rollout = [0.38, 0.05, 0.80, 0.30, 0.45, 0.25, 0.50, 0.33]
    train = [0.30, 0.31, 0.29, 0.32, 0.30, 0.28, 0.33, 0.31]
    t = 0.0
    for step, (r, x) in enumerate(zip(rollout, train)):
        tr.span("rollout", t, t + r, step=step)
        tr.span("train", t + r, t + r + x, step=step)
        t += r + x
    data = _report(b)
    bn = data["bottleneck"]
    assert bn["stage"] == "rollout" and bn["runner_up"] == "train" and bn["within_noise"] is True
    assert bn["iqr_s"][0] < bn["runner_up_iqr_s"][1]
    assert "rollout and train are within noise of each other" in _text(data)


def test_clear_bottleneck_is_not_called_a_tie(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(6):
        tr.span("rollout", 2 * step, 2 * step + 1.5, step=step)
        tr.span("train", 2 * step + 1.5, 2 * step + 2, step=step)
    data = _report(b)
    assert data["bottleneck"]["within_noise"] is False
    assert "within noise" not in _text(data)


@pytest.mark.parametrize("name", ["reward", "critic/rewards/mean", "rollout/raw_reward", "train/reward_mean"])
def test_reward_under_framework_names(tmp_path, name):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step, value in enumerate([0.1, 0.5, 0.4]):
        tr.span("train", step, step + 1, step=step)
        b.metric(step, name, value, process=tr)
    data = _report(b)
    assert (data["reward"]["first"], data["reward"]["last"]) == (0.1, 0.4)
    assert (data["reward"]["best"], data["reward"]["best_step"]) == (0.5, 1)
    assert data["reward"]["logged_as"] == [name]
    assert "Reward went from 0.1 at step 0 to 0.4 at step 2; best 0.5 at step 1" in _text(data)


def test_the_canonical_name_wins_over_an_alias(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    tr.span("train", 0, 1, step=0)
    b.metric(0, "reward", 9.0, process=tr)
    b.metric(0, "reward_mean", 0.5, process=tr)
    b.write()
    r = analysis.step_metrics(store.open(b.run_dir), ["reward_mean"])
    assert r["value"].tolist() == [0.5]
