"""The seed's formulas on hand-built runs whose answers are known exactly."""

import numpy as np
import pytest

from rltrace import analysis, store
from rltrace.testing import RunBuilder


@pytest.fixture
def nested_run(tmp_path):
    """Two steps; rollout on two processes, reward nested and overlapping, train nested, two syncs."""
    b = RunBuilder(tmp_path / "run")
    tr, ra, rb = b.process("trainer"), b.process("rollout", 0), b.process("rollout", 1)
    # step 1: R = union([0,4] on ra, [1,5] on rb, reward [4.5,6] nested in rb's rollout) = [0,6] -> 6
    r = ra.span("rollout", 0, 4, step=1)
    ra.span("generate", 0, 3.5, step=1, parent=r, thread=2)
    r2 = rb.span("rollout", 1, 5, step=1)
    rb.span("reward", 4.5, 6, step=1, parent=r2)
    t = tr.span("train", 6, 9, step=1)  # T = [6,9] with nested forward/backward -> 3
    tr.span("forward", 6, 7, step=1, parent=t)
    tr.span("backward", 7, 9, step=1, parent=t)
    tr.span("weight_sync", 9, 9.25, step=1, bytes=100)  # W = [9,9.25] u [9.1,9.5] -> 0.5
    ra.span("weight_sync", 9.1, 9.5, step=1)
    # step 2: R = 2 (rollout [10,12]), T = 4.5, no weight sync -> W = 0
    ra.span("rollout", 10, 12, step=2)
    tr.span("train", 12, 16.5, step=2)
    b.write()
    return store.open(b.run_dir)


def test_per_step_formulas_to_1e_9(nested_run):
    cm = analysis.cost_model(nested_run).set_index("step")
    s1, s2 = cm.loc[1], cm.loc[2]
    assert s1["t_R"] == pytest.approx(6.0, abs=1e-9)
    assert s1["t_reward"] == pytest.approx(1.5, abs=1e-9)
    assert s1["t_rollout"] == pytest.approx(4.5, abs=1e-9)
    assert s1["t_T"] == pytest.approx(3.0, abs=1e-9)
    assert s1["t_W"] == pytest.approx(0.5, abs=1e-9)
    assert s1["wall_s"] == pytest.approx(9.5, abs=1e-9)
    assert (s2["t_R"], s2["t_T"]) == pytest.approx((2.0, 4.5), abs=1e-9)
    assert np.isnan(s2["t_W"])  # no sync at step 2: not recorded, not zero
    # the sync of step 1 serves steps 1 and 2: its 0.5 s is spread over both
    assert (s1["t_W_amortised"], s2["t_W_amortised"]) == pytest.approx((0.25, 0.25), abs=1e-9)
    assert s1["t_R_amortised"] == pytest.approx(6.0, abs=1e-9)
    assert s1["t_sync"] == pytest.approx(9.25, abs=1e-9)
    assert s1["async_bound"] == pytest.approx(6.25, abs=1e-9)
    assert s1["async_speedup_bound"] == pytest.approx(9.25 / 6.25, abs=1e-9)
    assert s2["async_bound"] == pytest.approx(4.75, abs=1e-9)


def test_summary_uses_medians_and_measures_the_period(nested_run):
    s = analysis.cost_summary(nested_run)
    assert s["steps"] == 2
    assert s["t_R"] == pytest.approx(4.0, abs=1e-9)  # median of 6 and 2
    assert s["t_T"] == pytest.approx(3.75, abs=1e-9)
    assert s["t_W"] == pytest.approx(0.25, abs=1e-9)
    assert s["t_sync"] == pytest.approx(8.0, abs=1e-9)
    assert s["async_bound"] == pytest.approx(4.25, abs=1e-9)
    assert s["async_speedup_bound"] == pytest.approx(8.0 / 4.25, abs=1e-9)
    assert s["period_s"] == pytest.approx(16.5 - 9.5, abs=1e-9)
    assert s["overlapping"] is False


def test_async_run_reports_achieved_overlap(tmp_path):
    """Rollout of step s+1 runs during train of step s: period = max(t_R, t_T) + t_W."""
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(1, 6):
        o = 3.0 * step
        ro.span("rollout", o - 3, o, step=step)  # t_R = 3, overlapping the previous train
        tr.span("train", o, o + 2, step=step)  # t_T = 2
        tr.span("weight_sync", o + 2, o + 3, step=step, bytes=10)  # t_W = 1 -> period 3 = bound
    b.write()
    s = analysis.cost_summary(store.open(b.run_dir))
    assert s["overlapping"] is True
    assert s["period_s"] == pytest.approx(3.0, abs=1e-9)
    assert s["async_bound"] == pytest.approx(4.0, abs=1e-9)
    assert s["t_sync"] == pytest.approx(6.0, abs=1e-9)
    # measured: 30 s of stage time in 18 s (rollout [3, 15] ran beside train and sync)
    assert s["stage_s"] == pytest.approx(30.0, abs=1e-9)
    assert s["concurrent_s"] == pytest.approx(12.0, abs=1e-9)
    assert s["achieved_speedup"] == pytest.approx(30 / 18, abs=1e-9)
    # beyond the bound 6/4: rollout also overlapped the weight sync, which the bound keeps serial
    assert s["achieved_fraction"] == pytest.approx((1 - 18 / 30) / (1 - 4 / 6), abs=1e-9)


def test_weight_sync_fit_recovers_bandwidth_and_overhead(tmp_path):
    rng = np.random.default_rng(7)
    b_w, t_0 = 5e9, 0.2
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    t = 0.0
    for step, nbytes in enumerate(rng.uniform(1e8, 4e9, 40)):
        dur = nbytes / b_w + t_0 + rng.normal(0, 0.005)
        tr.span("weight_sync", t, t + dur, step=step, bytes=int(nbytes), method="nccl")
        t += dur + 1
    b.write()
    fit = analysis.weight_sync_fit(store.open(b.run_dir))
    assert fit["n"] == 40 and fit["sizes"] == 40 and fit["regime"] == "bandwidth"
    assert fit["B_W"] == pytest.approx(b_w, rel=0.02)
    assert fit["t_0"] == pytest.approx(t_0, abs=0.01)
    assert fit["r2"] > 0.99 and fit["rmse_s"] < 0.01
    assert fit["methods"] == ["nccl"]


def test_weight_sync_fit_with_one_payload_size_gives_effective_rate_only():
    fit = analysis.fit_bandwidth(np.array([1e9, 1e9, 1e9]), np.array([0.5, 0.5, 0.5]))
    assert fit["B_W"] is None and fit["t_0"] is None
    assert fit["effective_B_W"] == pytest.approx(2e9)
    assert analysis.fit_bandwidth(np.array([]), np.array([]))["n"] == 0


@pytest.mark.parametrize("tilt", [-1e-18, 0.0, 1e-18])
def test_sync_time_that_does_not_grow_with_payload_is_latency_bound_whatever_the_slope_sign(tilt):
    """Four sizes, 500 ms each: the fitted slope is zero in theory and ±rounding in practice."""
    sizes = np.array([1e8, 5e8, 1e9, 2e9] * 3)
    fit = analysis.fit_bandwidth(sizes, 0.5 + tilt * sizes)
    assert fit["regime"] == "latency" and fit["B_W"] is None
    assert fit["t_0"] == pytest.approx(0.5, abs=1e-9)
    assert (fit["sizes"], fit["min_bytes"], fit["max_bytes"]) == (4, 1e8, 2e9)


def test_sync_time_with_noise_but_no_payload_effect_is_latency_bound():
    rng = np.random.default_rng(3)
    sizes = rng.uniform(1e8, 4e9, 60)
    fit = analysis.fit_bandwidth(sizes, 0.3 + rng.normal(0, 0.02, 60))
    assert fit["regime"] == "latency" and fit["t_0"] == pytest.approx(0.3, abs=0.01)
