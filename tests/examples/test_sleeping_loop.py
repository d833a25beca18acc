"""The what-if prediction against a real run of the GPU-shaped loop, small enough for a test."""

import pytest

from examples.sleeping_loop import Shape, run
from rltrace import store
from rltrace.analysis import whatif

SMALL = dict(steps=14, batch=8, tok_s=1e-4, reward_s=0.003, train_s=0.03, sync_s=0.008)
# Two short runs on a machine other tests share: their periods differ by load, not by the model, so
# these tests allow 25 %; the 10 % goal is checked by benchmarks/bench_whatif.py on long runs.
REL = 0.25


def test_one_step_off_predicted_from_the_synchronous_run(tmp_path):
    """Recorded synchronous; predicted one-step-off; then run one-step-off (other random lengths)."""
    sync = run(str(tmp_path / "sync"), Shape(**SMALL))
    cal = whatif.calibrate(store.open(tmp_path / "sync"))
    assert cal.works.shape == (14, 8) and cal.staleness == 0 and cal.workers == 1
    replay = whatif.predict(cal, whatif.Scenario(), replicates=50)
    assert replay["predicted_step_s"] == pytest.approx(sync["period_s"], rel=REL)
    predicted = whatif.predict(cal, whatif.Scenario(staleness=1), replicates=50)
    real = run(str(tmp_path / "async"), Shape(**SMALL, staleness=1, seed=1))
    assert predicted["predicted_step_s"] == pytest.approx(real["period_s"], rel=REL)
    assert predicted["predicted_step_s"] < 0.75 * replay["predicted_step_s"]
    assert predicted["staleness_max"] == real["staleness_max"] == 1


def test_engines_with_a_cap_are_recognised_and_more_engines_predicted(tmp_path):
    """Recorded on one engine that runs at most 2 of its 8 requests at once (the rest queue): the cap
    is read from the run, and 2 engines predicted from it come within REL of 2 engines run."""
    run(str(tmp_path / "one"), Shape(**SMALL, cap=2))
    cal = whatif.calibrate(store.open(tmp_path / "one"))
    assert cal.cap == 2 and cal.workers == 1
    predicted = whatif.predict(cal, whatif.Scenario(rollout_workers=2), replicates=50)
    real = run(str(tmp_path / "two"), Shape(**SMALL, cap=2, rollout_workers=2, seed=1))
    assert predicted["predicted_step_s"] == pytest.approx(real["period_s"], rel=REL)
