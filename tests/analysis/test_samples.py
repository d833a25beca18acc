"""Long tail and stragglers, staleness, mismatch trends (with slime-style aliases)."""

import pytest

from rltrace import analysis, store
from rltrace.testing import RunBuilder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    b = RunBuilder(tmp_path_factory.mktemp("runs") / "run")
    tr = b.process("trainer")
    tr.span("rollout", 0, 20, step=1)
    # step 1: five samples from t=0; finishes 1,2,3,4 and the straggler (id 17) at 20
    rows = [
        {"sample_id": i, "group_id": i // 2, "response_len": 100, "gen_start": 0.0, "gen_end": float(i + 1),
         "weight_version": 3, "train_version": 4}
        for i in range(4)
    ]
    rows.append({"sample_id": 17, "group_id": 9, "response_len": 900, "gen_start": 0.0, "gen_end": 20.0,
                 "weight_version": 1, "train_version": 4})
    b.samples(1, rows)
    b.samples(2, [{"sample_id": i, "response_len": 50, "gen_start": 30.0, "gen_end": 31.0,
                   "weight_version": 4, "train_version": 4} for i in range(3)])
    b.metric(1, "train/train_rollout_logprob_abs_diff", 0.010)
    b.metric(2, "train_rollout_logprob_abs_diff", 0.016)
    b.metric(3, "rollout/train_rollout_logprob_abs_diff", 0.022)
    b.metric(3, "staleness_mean", 2.5)
    b.metric(3, "staleness_max", 4)
    b.write()
    return store.open(b.run_dir)


def test_long_tail_is_last_finish_minus_median_finish(run):
    lt = analysis.long_tail(run).set_index("step")
    assert lt.loc[1, "samples"] == 5
    assert lt.loc[1, "median_finish_s"] == pytest.approx(3.0, abs=1e-6)
    assert lt.loc[1, "tail_s"] == pytest.approx(17.0, abs=1e-6)
    assert lt.loc[1, "tail_share"] == pytest.approx(17.0 / 20.0, abs=1e-6)  # of the step's 20 s wall
    assert lt.loc[2, "tail_s"] == pytest.approx(0.0, abs=1e-6)
    assert lt.loc[2, "tail_share"] == pytest.approx(0.0, abs=1e-6)  # no spans: relative to generation


def test_stragglers_name_the_sample_and_its_ratio(run):
    s = analysis.stragglers(run)
    assert s["sample_id"].tolist() == ["17"]  # ids are text, whatever type they were logged with
    row = s.iloc[0]
    assert row["len_ratio"] == pytest.approx(9.0)
    assert row["time_ratio"] == pytest.approx(20.0 / 3.0, rel=1e-6)
    assert row["after_median_s"] == pytest.approx(17.0, abs=1e-6)
    assert analysis.stragglers(run, factor=10.0).empty


def test_staleness_from_samples_and_metrics(run):
    st = analysis.staleness(run).set_index("step")
    assert st.loc[1, "mean"] == pytest.approx((4 * 1 + 3) / 5)
    assert st.loc[1, "max"] == 3 and st.loc[1, "source"] == "samples"
    assert st.loc[2, "max"] == 0
    assert (st.loc[3, "mean"], st.loc[3, "max"], st.loc[3, "source"]) == (2.5, 4, "metrics")
    hist = analysis.staleness_histogram(run)
    assert hist[hist["step"] == 1][["age", "samples"]].values.tolist() == [[1, 4], [3, 1]]


def test_mismatch_accepts_prefixed_aliases_and_reports_the_trend(run):
    m = analysis.mismatch(run)
    assert m["metric"].unique().tolist() == ["train_rollout_logprob_abs_diff"]
    assert m["value"].tolist() == pytest.approx([0.010, 0.016, 0.022])
    trend = analysis.trends(m).iloc[0]
    assert trend["slope_per_step"] == pytest.approx(0.006)
    assert (trend["first"], trend["last"]) == pytest.approx((0.010, 0.022))


def test_a_step_range_selects_steps(run):
    assert analysis.mismatch(run, steps=(2, 3))["step"].tolist() == [2, 3]
    assert analysis.long_tail(run, steps=(2, None))["step"].tolist() == [2]
    with pytest.raises(analysis.StepRangeError, match="first step 5 is after the last step 2"):
        analysis.parse_steps("5:2")
    with pytest.raises(analysis.StepRangeError, match="use A:B"):
        analysis.parse_steps("a:b")
    assert analysis.parse_steps("3") == (3, 3) and analysis.parse_steps(":4") == (None, 4)
