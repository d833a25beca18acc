"""Mismatch from batches that hold both engines' log-probs: a slime rollout dump joined to its train
dump, and a batch frozen by rltrace. Values are checked against slime's own formulas, written out
here in torch the way slime's loss code computes them (slime/backends/megatron_utils/loss.py)."""

from __future__ import annotations

import pytest
import torch

import rltrace
import rltrace.replay as replay
from rltrace import analysis, store
from rltrace.cli import main as cli
from rltrace.replay.slime import import_slime
from rltrace.report.build import build
from tests.replay.slime_dumps import rollout_dump, train_dump

N, T = 6, 8


def _slime_reference(rollout: list[torch.Tensor], train: list[torch.Tensor], masks: list[torch.Tensor]) -> dict:
    """slime: sum_of_sample_mean(x) / samples, with x per token; TIS clipped to [0, 2]."""
    def sample_mean(x):
        return sum((xi * m).sum() / torch.clamp_min(m.sum(), 1) for xi, m in zip(x, masks)) / len(x)

    r = [p - q for p, q in zip(train, rollout)]
    tis = [torch.exp(x) for x in r]
    return {
        "train_rollout_logprob_abs_diff": float(sample_mean([x.abs() for x in r])),
        "mismatch_k3": float(sample_mean([torch.exp(x) - 1 - x for x in r])),
        "tis_mean": float(sample_mean(tis)),
        "tis_clipfrac": float(sample_mean([(torch.clamp(t, 0, 2.0) != t).float() for t in tis])),
    }


@pytest.fixture
def slime_run(tmp_path):
    """A rollout dump and its train dump whose log-probs differ per sample, tool tokens masked out."""
    root = tmp_path / "dump"
    rollout = rollout_dump(root / "rollout_data" / "3.pt", 3, n=N, response_length=T)
    g = torch.Generator().manual_seed(0)
    masks = []
    for i, s in enumerate(rollout):
        s["rollout_log_probs"] = (-torch.rand(T, generator=g) * 3).tolist()
        s["loss_mask"] = [1] * T if i % 2 else [1] * (T - 3) + [0] * 3  # env/tool tokens carry no loss
        masks.append(torch.tensor(s["loss_mask"], dtype=torch.float32))
    torch.save({"rollout_id": 3, "samples": rollout}, root / "rollout_data" / "3.pt")
    train = train_dump(root / "train_data" / "3.pt", 3, rollout)
    for i, t in enumerate(train):
        t["log_probs"] = t["rollout_log_probs"] + torch.randn(T, generator=g) * 0.5 * (i + 1)
    torch.save({"format_version": 2, "rollout_id": 3, "rank": 0, "samples": train}, root / "train_data" / "3.pt")
    import_slime([root], tmp_path / "run")
    expected = _slime_reference([torch.tensor(s["rollout_log_probs"]) for s in rollout],
                                [t["log_probs"].float() for t in train], masks)
    return tmp_path / "run", expected


def test_slime_dumps_give_slimes_numbers(slime_run):
    run_dir, expected = slime_run
    con = store.open(run_dir)
    per_sample = analysis.batch_mismatch(con)
    assert len(per_sample) == N and set(per_sample["step"]) == {3}
    assert per_sample["tokens"].tolist() == [T - 3 if i % 2 == 0 else T for i in range(N)]
    values = analysis.mismatch(con)
    got = values[values["source"] == "batches"].set_index("metric")["value"]
    for metric, value in expected.items():
        assert got[metric] == pytest.approx(value, rel=1e-5, abs=1e-7), metric
    assert 0 < expected["tis_clipfrac"] < 1  # the data exercise the clip


def test_report_names_the_source(slime_run, capsys):
    run_dir, expected = slime_run
    r = build(store.open(run_dir))
    rows = [p for p in r["mismatch"]["per_step"] if p["source"] == "batches"]
    assert {p["metric"] for p in rows} == set(expected) and {p["step"] for p in rows} == {3}
    assert any("(frozen batches)" in f and "train_rollout_logprob_abs_diff" in f for f in r["findings"])
    assert cli(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "(frozen batches)" in out  # the mismatch rows name their source


def test_frozen_batch_with_both_log_probs(run_dir):
    rltrace.init(run_dir)
    q = -torch.rand(4, 5, dtype=torch.float32)
    p = q + 0.25  # one fixed shift: |Δ| = 0.25 everywhere, e^Δ = 1.284 < 2
    replay.freeze(0, {"rollout_log_probs": q, "train_log_probs": p, "loss_mask": torch.ones(4, 5, dtype=torch.int32)})
    replay.freeze(1, [{"rollout_log_probs": q[i].to(torch.bfloat16), "train_log_probs": (q[i] + 1.0).to(torch.bfloat16)}
                      for i in range(4)])  # no loss mask: every token; e^1 > 2: all clipped
    replay.flush()
    rltrace.shutdown()
    per_step = analysis.mismatch(store.open(run_dir)).pivot_table(index="step", columns="metric", values="value")
    assert per_step.loc[0, "train_rollout_logprob_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    assert per_step.loc[0, "tis_clipfrac"] == 0
    assert per_step.loc[0, "mismatch_k3"] == pytest.approx(float(torch.exp(torch.tensor(0.25)) - 1.25), abs=1e-6)
    assert per_step.loc[1, "train_rollout_logprob_abs_diff"] == pytest.approx(1.0, abs=0.02)  # bf16 rounding
    assert per_step.loc[1, "tis_clipfrac"] == 1


def test_batches_without_both_columns_give_nothing(run_dir):
    rltrace.init(run_dir)
    replay.freeze(0, {"rollout_log_probs": -torch.rand(2, 3)})
    replay.flush()
    rltrace.shutdown()
    assert analysis.batch_mismatch(store.open(run_dir)).empty
