"""The per-step rollout numbers (`analysis.rollout`, `engine`, `engine_summary`) on a many-step run
with every awkward shape a step can have, checked value for value and type for type against the
first implementation (a pandas loop per step, tests/analysis/oracle_rollout.py), plus known answers."""

import math

import numpy as np
import pandas as pd
import pytest

from rltrace import analysis, store
from rltrace.store import rows as store_rows
from rltrace.testing import RunBuilder
from tests.analysis import oracle_rollout

STEPS = 40


def _sample_rows(rng, step: int) -> list[dict]:
    """One step's samples; the shape of the step (group sizes, which columns are null) varies by step."""
    shape = step % 8
    if step == 0:  # nothing optional: the first row of the table lacks most columns
        return [{"sample_id": i, "response_len": None} for i in range(3)]
    groups = int(rng.integers(2, 7))
    size = 1 if shape == 5 else int(rng.choice([2, 4, 8]))
    sizes = [size] * groups if shape != 3 else [int(rng.integers(1, 5)) for _ in range(groups)]  # 3: uneven groups
    rows, sid = [], 0
    for g, n in enumerate(sizes):
        same = rng.random() < 0.4  # a group whose rewards are all equal (zero std)
        base = float(rng.choice([0.0, 1.0, 0.15, 0.25, 0.5, 1.0 / 3]))
        for _ in range(n):
            reward = base if same else float(rng.choice([0.0, 1.0, rng.random()]))
            row = {
                "sample_id": f"s{step}-{sid}",
                "group_id": None if shape == 6 else f"g{g:02d}",
                "response_len": int(rng.integers(1, 500)),
                "finish_reason": str(rng.choice(["stop", "length", "abort"])) if shape != 2 else None,
                "reward": None if (shape == 4 and rng.random() < 0.5) or shape == 7 else reward,
                "effective_response_len": None if rng.random() < 0.3 else int(rng.integers(1, 400)),
                "cached_tokens": int(rng.integers(0, 50)) if shape != 1 else None,
                "total_prompt_tokens": (0 if shape == 2 else int(rng.integers(50, 100))) if shape != 1 else None,
                "non_generation_time": None if shape == 1 else (0.0 if shape == 2 else float(rng.random() * 3)),
                "repetition": None if shape == 1 else bool(rng.random() < 0.2),
                "spec_accept_rate": 0.0 if shape in (1, 2) else float(rng.random()),
                "spec_accept_length": 0.0 if shape in (1, 2) else float(rng.random() * 4),
            }
            if step % 5 == 0 and sid == 0:
                row["in_batch"] = False  # the earlier part of a carried-over sample: left out
            rows.append(row)
            sid += 1
    return rows


def _request(proc, step: int, start: float, attrs: dict) -> None:
    """A request span carrying SGLang's meta (plain attribute names, as SGLang writes them)."""
    proc.spans.append(store_rows.span_row(
        trace_id=f"{step:032x}", span_id=f"r{step:05d}{len(proc.spans):010d}", parent_span_id=None, name="generate",
        phase="generate", step=step, weight_version=None, start_ns=proc.run.t0_ns + round(start * 1e9),
        end_ns=proc.run.t0_ns + round((start + 0.5) * 1e9), status="UNSET", thread_id=1, thread_name="MainThread",
        attributes=attrs))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    rng = np.random.default_rng(7)
    b = RunBuilder(tmp_path_factory.mktemp("runs") / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(STEPS):
        tr.span("train", step * 10.0, step * 10.0 + 5, step=step)
        b.samples(step, _sample_rows(rng, step))
        if step % 4 == 3:
            continue  # no request spans this step
        for i in range(int(rng.integers(1, 9))):
            attrs = {"e2e_latency": float(rng.random() * 9), "queue_time": float(rng.random())}
            if step % 4 != 1 or i % 2:
                attrs |= {"decode_throughput": float(rng.random() * 900), "cached_tokens": int(rng.integers(0, 60)),
                          "prompt_tokens": int(rng.integers(60, 120))}
            if step % 7 == 2:
                attrs["e2e_latency"] = "n/a"  # unreadable: not a number, left out
            if step % 6 == 5 and "prompt_tokens" in attrs:
                attrs |= {"cached_tokens": 0, "prompt_tokens": 0}  # no prompt tokens: no hit rate
            _request(ro, step, step * 10.0 + i * 0.1, attrs)
    b.write()
    return store.open(b.run_dir)


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for col in got.columns:  # dict cells: assert_frame_equal compares them, but name any difference plainly
        if got[col].dtype == object:
            assert got[col].tolist() == want[col].tolist(), col


@pytest.mark.parametrize("steps", [None, (3, 17), (0, 0), (STEPS + 5, None)])
def test_rollout_equals_the_per_step_loop(run, steps):
    _same(analysis.rollout(run, steps), oracle_rollout.rollout(run, steps))


@pytest.mark.parametrize("steps", [None, (3, 17), (STEPS + 5, None)])
def test_engine_tables_equal_the_per_step_loop(run, steps):
    _same(analysis.engine(run, steps), oracle_rollout.engine(run, steps))
    _same(analysis.engine_summary(run, steps), oracle_rollout.engine_summary(run, steps))
    table = analysis.rollout(run, steps)
    _same(analysis.engine_summary(run, steps, rollout_table=table), oracle_rollout.engine_summary(run, steps))


def test_rollout_known_answers(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer")
    # step 1: groups a (1, 1, 1, 1: all pass, zero std) and b (0, 1, 0, 0); step 2: one reward missing
    b.samples(1, [{"sample_id": i, "group_id": g, "reward": r, "response_len": n, "finish_reason": f}
                  for i, (g, r, n, f) in enumerate([("a", 1.0, 10, "stop"), ("a", 1.0, 20, "length"), ("a", 1.0, 30, "stop"),
                                                     ("a", 1.0, 40, "stop"), ("b", 0.0, 50, "stop"), ("b", 1.0, 60, "stop"),
                                                     ("b", 0.0, 70, "length"), ("b", 0.0, 80, "stop")])])
    b.samples(2, [{"sample_id": 0, "group_id": "a", "reward": 0.5, "response_len": 5},
                  {"sample_id": 1, "group_id": "a", "reward": None, "response_len": 7}])
    b.write()
    t = analysis.rollout(store.open(b.run_dir)).set_index("step")
    one, two = t.loc[1], t.loc[2]
    assert (one["samples"], one["reward_mean"], one["truncated_ratio"]) == (8, 5 / 8, 2 / 8)
    assert (one["response_len_mean"], one["response_len_median"], one["response_len_max"], one["response_len_min"]) == (
        45.0, 45.0, 80.0, 10.0)
    assert one["zero_std"] == {"count_1.0": 1} and one["zero_std_groups"] == 1
    # pass@1: mean of 4/4 and 1/4; pass@2: 1 and 1 - C(3,2)/C(4,2) = 1/2; pass@4: 1 and 1
    assert one["pass_at_k"] == pytest.approx({"1": 0.625, "2": 0.75, "4": 1.0})
    assert two["reward_mean"] == 0.5 and two["zero_std"] == {} and two["pass_at_k"] == {}
    assert math.isnan(two["zero_std_groups"]) if isinstance(two["zero_std_groups"], float) else two["zero_std_groups"] is None
