"""Diff statistics on hand-made columns, and the mismatch decomposition on a real tiny model."""

from pathlib import Path

import numpy as np
import pytest
import torch

import rltrace
from rltrace.replay.decompose import decompose
from rltrace.replay.diff import bits, compare_columns, repeatability
from rltrace.replay.errors import ReplayError
from rltrace.replay.rerun import run_entry
from tests.replay.tiny import make_run

ENTRIES = str(Path(__file__).parent / "entries.py")


def test_per_token_statistics_follow_the_formulas():
    a = [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-0.5, -0.5])]
    b = [torch.tensor([-1.0, -2.5, -3.0]), torch.tensor([-0.25, -0.5])]
    mask = [torch.tensor([1, 1, 0]), torch.tensor([1, 1])]
    d = compare_columns("q", a, "p", b, 2, mask=mask, logprob=True)
    diffs = np.array([0.0, -0.5, 0.25, 0.0])  # masked position 2 of sample 0 left out
    assert d.tokens == 4 and d.samples == 2 and d.samples_different == 2
    assert d.mean_abs == pytest.approx(np.abs(diffs).mean()) and d.max_abs == 0.5
    assert d.mean == pytest.approx(diffs.mean())
    assert d.k3 == pytest.approx(np.mean(np.expm1(diffs) - diffs))
    assert d.top_tokens[0] == {"sample_index": 0, "position": 1, "token_id": None, "a": -2.0, "b": -2.5, "abs_diff": 0.5}
    assert not d.bitwise_equal and not d.aligned


def test_lengths_nans_and_dtypes():
    a = [np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0])]
    b = [np.array([1.0, np.nan]), np.array([1.0, np.nan])]
    d = compare_columns("a", a, "b", b, 2)
    assert d.length_mismatch == [0] and d.nan_mismatch == 1 and not d.aligned
    assert d.samples_different == 2  # sample 0 by length (its common prefix agrees), sample 1 by the NaN
    same_values = compare_columns("a", [torch.tensor([1.0])], "b", [torch.tensor([1.0], dtype=torch.float64)], 1, logprob=True)
    assert same_values.mean_abs == 0 and same_values.aligned and not same_values.bitwise_equal  # aligned, not bitwise


def test_scalar_columns_report_the_samples_that_differ():
    d = compare_columns("reward", [1.0, 0.5, None, 0.0], "reward", [1.0, 0.75, 0.3, 0.0], 4)
    assert not d.per_token and d.samples == 3 and d.samples_different == 1
    assert d.top_samples == [{"sample_index": 1, "max_abs": 0.25, "mean_abs": 0.25, "a": 0.5, "b": 0.75}]


def test_bits_tell_apart_what_equality_does_not():
    assert bits(torch.tensor([0.0])) != bits(torch.tensor([-0.0]))
    assert bits(float("nan")) == bits(float("nan"))
    assert bits(torch.tensor([1.0])) != bits(torch.tensor([1.0], dtype=torch.float64))
    assert bits(torch.tensor(1.0, dtype=torch.bfloat16)) == bits(torch.tensor(1.0, dtype=torch.bfloat16))


def test_repeatability_needs_two_runs():
    assert repeatability([object()]) is None


def _stored_logprobs(run_dir, version):
    return run_entry(run_dir, 3, f"{ENTRIES}:logprobs_at", kwargs={"weight_version": version}).repeats[0]["log_probs"]


def test_fresh_samples_and_an_aligned_engine_have_no_mismatch(tmp_path):
    run_dir, _, _ = make_run(tmp_path, v_t=2, versions=(2,), rollout_dtype=torch.float32)
    batch = rltrace.replay.load(run_dir, 3)
    r = decompose(batch, lambda v: _stored_logprobs(run_dir, v))
    assert r.tokens > 0 and r.mean_abs_total == 0.0 and r.mean_abs_staleness == 0.0 and r.mean_abs_engine == 0.0


def test_stale_samples_from_a_bf16_engine_split_into_both_terms(tmp_path):
    run_dir, _, samples = make_run(tmp_path, v_t=2, versions=(0, 1, 2), rollout_dtype=torch.bfloat16)
    batch = rltrace.replay.load(run_dir, 3)
    cache = {v: _stored_logprobs(run_dir, v) for v in (0, 1, 2)}
    r = decompose(batch, cache.__getitem__)
    assert r.mean_abs_staleness > 0 and r.mean_abs_engine > 0
    assert r.share_staleness + r.share_engine == pytest.approx(1.0)
    assert r.mean_staleness + r.mean_engine == pytest.approx(
        np.mean(np.concatenate([(cache[2][i] - s["rollout_log_probs"]).numpy() for i, s in enumerate(samples)]))
    )
    fresh = next(a for a in r.by_age if a["age"] == 0)
    assert fresh["mean_abs_staleness"] == 0.0 and fresh["mean_abs_engine"] > 0  # d = 0: only the engine gap
    assert {a["age"] for a in r.by_age} == {0, 1, 2}


def test_decompose_needs_the_versions(tmp_path):
    rltrace.init(tmp_path / "run")
    rltrace.replay.freeze(1, [{"rollout_log_probs": torch.zeros(2)}])
    rltrace.replay.flush()
    with pytest.raises(ReplayError, match="field train_version is empty"):
        decompose(rltrace.replay.load(tmp_path / "run", 1), lambda v: None)
