"""Long tail and stragglers, staleness, mismatch trends (with slime-style aliases)."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from rltrace import analysis, store
from rltrace.analysis import summary
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


def _pandas_long_tail(con, table):
    """long_tail's per-step numbers as first written, on pandas' groupby: the reference."""
    s = table.drop_columns(["sample_id", "group_id"]).to_pandas()
    s["dur"] = s["gen_end"] - s["gen_start"]
    g = s.groupby("step")
    out = pd.DataFrame({"samples": g.size(), "first": g["gen_start"].min(), "median_end": g["gen_end"].median(),
                        "last_end": g["gen_end"].max(), "median_len": g["response_len"].median(),
                        "max_len": g["response_len"].max(), "median_gen_s": g["dur"].median(),
                        "max_gen_s": g["dur"].max()})
    out["gen_s"] = out["last_end"] - out["first"]
    out["median_finish_s"] = out["median_end"] - out["first"]
    out["last_finish_s"] = out["last_end"] - out["first"]
    out["tail_s"] = out["last_end"] - out["median_end"]
    checks = summary.checks(con).set_index("step")
    wall = ((checks["end_ns"] - checks["start_ns"]) / 1e9).reindex(out.index)
    out["tail_share"] = out["tail_s"] / wall.fillna(out["gen_s"]).where(lambda w: w > 0)
    cols = ["samples", "gen_s", "median_finish_s", "last_finish_s", "tail_s", "tail_share", "median_len",
            "max_len", "median_gen_s", "max_gen_s"]
    return out[cols].reset_index()


def _pandas_ratios(table):
    """stragglers' per-sample ratios as first written, on pandas' groupby transform: the reference."""
    s = table.drop_columns(["sample_id", "group_id"]).to_pandas()
    s["gen_s"] = s["gen_end"] - s["gen_start"]
    g = s.groupby("step")
    s["len_ratio"] = s["response_len"] / g["response_len"].transform("median").where(lambda m: m > 0)
    s["time_ratio"] = s["gen_s"] / g["gen_s"].transform("median").where(lambda m: m > 0)
    s["after_median_s"] = s["gen_end"] - g["gen_end"].transform("median")
    return s


def _random_samples(seed: int) -> pa.Table:
    """Samples in shuffled order: uneven steps, some without a step or a length, some NaN times."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    step = rng.integers(0, 6, n)
    length = rng.integers(0, 50, n) * (seed % 3 != 1)  # every length 0 in some runs: ratios undefined
    start = rng.uniform(0, 100, n).round(3)
    end = start + rng.exponential(5, n).round(3)
    gaps = seed % 2 == 0
    return pa.table({
        "step": pa.array(step, pa.int64(), mask=gaps & (rng.uniform(size=n) < 0.05)),
        "sample_id": pa.array([str(i) for i in range(n)]),
        "group_id": pa.array([str(i // 4) for i in range(n)]),
        "response_len": pa.array(length, pa.int64(), mask=gaps & (rng.uniform(size=n) < 0.1)),
        "gen_start": pa.array(np.where(gaps & (rng.uniform(size=n) < 0.03), np.nan, start)),
        "gen_end": pa.array(end),
    })


def _equal_pandas_groupby(con, table: pa.Table) -> int:
    """long_tail and stragglers of `table` equal the pandas references bit for bit; how many stragglers."""
    got = analysis.long_tail(con, table=table)
    pd.testing.assert_frame_equal(got, _pandas_long_tail(con, table), check_exact=True)
    s = _pandas_ratios(table)
    slow = (s["after_median_s"] > 0) & ((s["time_ratio"] >= 1.5) | (s["len_ratio"] >= 1.5))
    want = s[slow].sort_values(["step", "after_median_s"], ascending=[True, False]).groupby("step").head(3)
    got = analysis.stragglers(con, factor=1.5, per_step=3, table=table)
    assert len(got) == len(want)
    assert got["sample_id"].tolist() == [table["sample_id"][i].as_py() for i in want.index]
    for col in ("len_ratio", "time_ratio", "after_median_s"):
        expected = want[col].replace([np.inf], np.nan).astype(float).to_numpy()
        assert np.array_equal(got[col].to_numpy(float), expected, equal_nan=True), col
    return len(got)


@pytest.mark.parametrize("seed", range(16))
def test_long_tail_and_stragglers_equal_pandas_groupby(run, seed):
    assert _equal_pandas_groupby(run, _random_samples(seed)) > 0


def _samples_of(step, length, start, end) -> pa.Table:
    return pa.table({"step": pa.array(step, pa.int64()), "sample_id": [str(i) for i in range(len(end))],
                     "group_id": ["g"] * len(end), "response_len": pa.array(length, pa.int64()),
                     "gen_start": pa.array(start, pa.float64()), "gen_end": pa.array(end, pa.float64())})


@pytest.mark.parametrize("table", [
    _samples_of([None, None], [1, 2], [0.0, 1.0], [1.0, 2.0]),  # no sample has a step
    _samples_of([3], [5], [0.0], [1.0]),  # one sample
    _samples_of([1, 1, 2], [None, None, None], [0.0, 0.5, 1.0], [1.0, 2.0, 3.0]),  # no length known
    _samples_of([2, 1, 2, 1], [1, 9, 3, 2], [np.nan, 0.0, 1.0, 0.0], [np.nan, 5.0, 2.0, 1.0]),  # unsorted; NaN times
], ids=["no step", "one sample", "no length", "unsorted with NaN times"])
def test_long_tail_and_stragglers_equal_pandas_groupby_at_the_edges(run, table):
    _equal_pandas_groupby(run, table)
