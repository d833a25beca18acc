"""A run shaped like real ones: hundreds of fast steps with a few slow stalls among them.

A stall's step totals pass 2**31 ns while almost every other value is small; frames that reach
DuckDB must be typed (never object columns of Python ints and None, whose type DuckDB guesses
from a sample). Every command and every dashboard page works on such a run and names the slow
steps; random step-time distributions go through the summaries (and the reference
implementation, by the autouse fixture) without a failure.
"""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rltrace import report, store
from rltrace.analysis import summary
from rltrace.cli import main
from rltrace.testing import RunBuilder

FAST_S = 0.004
SLOW_S = 2.3  # a step total above 2**31 ns
STEPS = 420
SLOW_STEPS = (315, 357, 413)  # among the steps DuckDB's type sample of a 420-step summary misses


def stalled_run(path, slow=SLOW_STEPS, steps=STEPS, train_s=None):
    """`steps` steps of rollout, reward, train and weight_sync on one trainer; train takes SLOW_S
    at the steps in `slow` (or `train_s(step)` seconds), FAST_S elsewhere."""
    b = RunBuilder(path)
    tr = b.process("trainer")
    t = 0.0
    for step in range(steps):
        d = train_s(step) if train_s else (SLOW_S if step in slow else FAST_S)
        tr.span("step", t, t + 0.006 + d, step=step)
        tr.span("rollout", t, t + 0.003, step=step)
        tr.span("reward", t + 0.003, t + 0.004, step=step)
        tr.span("train", t + 0.004, t + 0.004 + d, step=step)
        tr.span("weight_sync", t + 0.004 + d, t + 0.005 + d, step=step, bytes=1e6)
        b.metric(step, "reward_mean", step / steps)
        t += 0.006 + d
    b.write()
    return b.run_dir


@pytest.fixture(scope="module")
def stalls(tmp_path_factory):
    return stalled_run(tmp_path_factory.mktemp("stalls") / "stalls")


def _json(capsys, *argv) -> dict:
    assert main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_and_json_name_the_slow_steps(stalls, capsys):
    assert main(["report", str(stalls)]) == 0
    text = capsys.readouterr().out
    assert "Outlier: train took 2.30" in text
    data = _json(capsys, str(stalls))
    outlier = next(o for o in data["outliers"] if o["stage"] == "train")
    assert outlier["step"] in SLOW_STEPS and outlier["steps_over"] == len(SLOW_STEPS)
    slow = {s["step"] for s in data["steps"] if s["wall_s"] > 1}
    assert slow == set(SLOW_STEPS)


def test_compare_and_compact_work_on_it(stalls, tmp_path, capsys):
    other = shutil.copytree(stalls, tmp_path / "other")
    data = _json(capsys, str(stalls), "--compare", str(other))
    assert {r["what"] for r in data["compare"]["rows"]} >= {"t_T", "t_sync"}
    assert main(["compact", str(other)]) == 0
    capsys.readouterr()
    after = _json(capsys, str(other))
    assert {s["step"] for s in after["steps"] if s["wall_s"] > 1} == set(SLOW_STEPS)


def test_the_slow_steps_are_typed_as_64_bit_in_the_summaries(stalls):
    frame = summary.rows(store.open(stalls), None, kinds=("step",))
    assert frame.loc[frame["step"].isin(SLOW_STEPS), "total_ns"].min() > 2**31


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.floats(0.0005, 0.01), st.floats(2.2, 6.0), st.just(0.0)), min_size=30, max_size=120))
def test_random_step_time_distributions_go_through_the_summaries(tmp_path, times):
    run = tmp_path / "random"
    shutil.rmtree(run, ignore_errors=True)
    stalled_run(run, steps=len(times), train_s=lambda step: times[step])
    data = report.build(store.open(run))
    assert len(data["steps"]) == len(times)
    for s, d in zip(data["steps"], times):
        assert (s["t_T"] or 0.0) == pytest.approx(d, abs=2e-9)  # a zero-length train span holds no time
