"""Settings are checked to finite ranges, whether they come from the environment or from `init`."""

import pytest

import rltrace
from rltrace._config import RltraceConfigError, resolve


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e400", "7200"])
def test_impossible_flush_intervals_from_the_environment_are_refused(monkeypatch, run_dir, value):
    monkeypatch.setenv("RLTRACE_FLUSH_INTERVAL", value)
    with pytest.raises(RltraceConfigError, match="RLTRACE_FLUSH_INTERVAL"):
        rltrace.init(run_dir)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_pending_rows": 0}, "max_pending_rows"),
        ({"max_queue": -5}, "max_queue"),
        ({"max_queue": 1.5}, "max_queue"),
        ({"max_queue": True}, "max_queue"),
        ({"flush_interval": float("inf")}, "flush_interval"),
        ({"flush_interval": float("nan")}, "flush_interval"),
        ({"rank": -1}, "rank"),
    ],
)
def test_init_keywords_get_the_checks_of_their_environment_variables(run_dir, kwargs, name):
    with pytest.raises(RltraceConfigError, match=name):
        rltrace.init(run_dir, **kwargs)
    assert rltrace.current_run() is None


def test_valid_keywords_still_work_and_record(run_dir):
    import numpy as np

    run = rltrace.init(run_dir, flush_interval=0.5, max_queue=100, max_pending_rows=np.int64(10), rank=np.int64(2))
    assert run.rank == 2
    rltrace.log_metrics(1, loss=1.0)
    rltrace.shutdown()
    from rltrace import store

    assert store.open(run_dir).execute("SELECT count(*) FROM metrics").fetchall() == [(1,)]
    assert resolve("replay_budget_mb", 10) == 10.0
    with pytest.raises(RltraceConfigError, match="replay_budget_mb"):
        resolve("replay_budget_mb", float("inf"))
