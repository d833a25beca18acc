"""Debug replay on real demo runs: `--bad-template` is found with `replay show`, `replay run` and the
diff; the demo's entry points recompute rewards and log-probs; bf16 rollout shows as an engine gap."""

from __future__ import annotations

import json

import pytest

from rltrace.cli import main

ENTRY = "examples.tiny_grpo.replay"


@pytest.fixture
def bad_template_run(demo):
    return demo("bad_template")[0]  # conftest.RUNS: 2 steps, seed 1, every step frozen


@pytest.fixture
def bf16_run(demo):
    return demo("bf16")[0]  # conftest.RUNS: the same, with a bf16 rollout engine


def cli_json(capsys, *args) -> dict:
    assert main([str(a) for a in args] + ["--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_bad_template_is_flagged_by_show(capsys, bad_template_run):
    batches = cli_json(capsys, "replay", "list", bad_template_run)["batches"]
    assert [b["step"] for b in batches] == [0, 1]
    assert batches[0]["trigger"] == "anomaly" and "bad text" in batches[0]["reason"]  # frozen because it looked wrong
    shown = cli_json(capsys, "replay", "show", bad_template_run, "--step", 1)["samples"]
    assert len(shown) == 64 and all("prompt_template" in s["flags"] for s in shown)
    assert "<|assistant|>" in shown[0]["flags"]["prompt_template"]


@pytest.mark.slow
def test_bad_template_shows_in_the_rerun_of_the_template(capsys, bad_template_run, bf16_run):
    bad = cli_json(capsys, "replay", "run", bad_template_run, "--step", 1, "--entry", f"{ENTRY}:render_prompts")
    (d,) = bad["diffs"]
    assert d["a"] == d["b"] == "prompt_tokens" and not d["bitwise_equal"]
    assert d["samples_different"] == 64 and len(d["length_mismatch"]) == 64  # every stored prompt lacks a token
    good = cli_json(capsys, "replay", "run", bf16_run, "--step", 1, "--entry", f"{ENTRY}:render_prompts")
    assert good["diffs"][0]["bitwise_equal"]


@pytest.mark.slow
def test_rewards_recompute_exactly_and_logprobs_are_repeatable(capsys, bf16_run):
    rewards = cli_json(capsys, "replay", "run", bf16_run, "--step", 1, "--entry", f"{ENTRY}:reward")
    assert rewards["diffs"][0]["bitwise_equal"]
    logprobs = cli_json(capsys, "replay", "run", bf16_run, "--step", 1, "--entry", f"{ENTRY}:logprobs", "--repeat", 2)
    assert logprobs["repeatable"] == {"log_probs": True}
    (vs_rollout,) = [d for d in logprobs["diffs"] if d["a"] == "rollout_log_probs"]
    assert vs_rollout["mean_abs"] > 1e-4 and not vs_rollout["aligned"]  # the bf16 rollout engine vs the fp32 trainer
    compared = cli_json(capsys, "replay", "compare", bf16_run, "--step", 1, "--entry", f"{ENTRY}:logprobs",
                        "--entry", f"{ENTRY}:logprobs_bf16")
    assert compared["a"]["repeatable"] == {"log_probs": True} and compared["b"]["repeatable"] == {"log_probs": True}
    assert not compared["diffs"][0]["bitwise_equal"]  # repeatable is not aligned


@pytest.mark.slow
def test_a_bf16_rollout_decomposes_into_engine_gap_only(capsys, bf16_run):
    result = cli_json(capsys, "replay", "decompose", bf16_run, "--step", 1, "--entry", f"{ENTRY}:logprobs_at")
    assert result["versions"] == [1]  # colocated sync: every sample generated with the weights it trains
    assert result["mean_abs_staleness"] == 0.0 and result["mean_abs_engine"] > 1e-4 and result["share_engine"] == 1.0
