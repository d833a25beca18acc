"""The demo's parts on their own: tokenizer, reward, engine vs trainer log-probs, checkpoints, weight paths."""

from __future__ import annotations

import time

import pytest
import torch

from examples.tiny_grpo import (
    CheckpointError,
    Policy,
    PolicyConfig,
    Problem,
    RolloutEngine,
    SamplingParams,
    Tokenizer,
    TokenizerError,
    grpo,
    load_checkpoint,
    response_logprobs,
    reward,
)
from examples.tiny_grpo.policy import save_checkpoint, write_model_config
from examples.tiny_grpo.system import weight_sync
from examples.tiny_grpo.system.cli import Config, validate


@pytest.fixture(scope="module")
def tok():
    return Tokenizer()


@pytest.fixture(scope="module")
def policy(tok):
    torch.manual_seed(0)
    return Policy(PolicyConfig(vocab_size=tok.vocab_size, n_layer=2, n_embd=64)).eval()


def test_tokenizer_round_trips_text_and_keeps_special_tokens_whole(tok):
    text = tok.chat_prompt("reverse 3141")
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[0] == tok.bos_id and tok.vocab[ids[-1]] == "<|assistant|>"
    assert tok.decode(ids, skip_special=True) == "reverse 3141"
    assert len(tok.vocab_hash()) == 64 and Tokenizer(tok.vocab).vocab_hash() == tok.vocab_hash()


def test_tokenizer_errors_name_the_bad_character_and_id(tok):
    with pytest.raises(TokenizerError, match="'Q' at position 3"):
        tok.encode("abcQ")
    with pytest.raises(TokenizerError, match="token id 999"):
        tok.decode([999])
    with pytest.raises(TokenizerError, match="vocab_hash does not match"):
        Tokenizer.from_json({"vocab": tok.vocab, "vocab_hash": "0" * 64})


def test_bad_template_drops_the_generation_prompt(tok):
    assert tok.chat_prompt("reverse 12", add_generation_prompt=False) == "<|bos|><|user|>reverse 12"


def test_reward_gives_partial_credit_per_position():
    p = Problem("12345")
    assert reward(p, "54321") == 1.0
    assert reward(p, "54300") == pytest.approx(0.6)
    assert reward(p, "5432100000") == pytest.approx(0.5)  # too long costs credit
    assert reward(p, "<|assistant|>54321") == 0.0  # a leaked special token shifts every position
    assert reward(p, "") == 0.0


def test_engine_fp32_matches_trainer_logprobs_and_bf16_drifts(tok, policy):
    prompts = [tok.encode(tok.chat_prompt(f"reverse {d}")) for d in ("123", "98765", "4", "5555")]
    params = [SamplingParams(max_new_tokens=8)] * len(prompts)
    diffs = {}
    for precision in ("fp32", "bf16"):
        engine = RolloutEngine(policy.config, eos_id=tok.eos_id, pad_id=tok.pad_id, precision=precision, seed=1)
        engine.load_weights(weight_sync.named_weights(policy))
        outs = engine.generate(prompts, params)
        train = response_logprobs(policy, prompts, [o.tokens for o in outs], pad_id=tok.pad_id)
        diffs[precision] = max((t - torch.tensor(o.logprobs)).abs().max().item() for t, o in zip(train, outs))
        assert all(len(o.tokens) == len(o.logprobs) for o in outs)
    assert diffs["fp32"] < 1e-5  # same weights, different kernels: a tiny engine gap
    assert diffs["bf16"] > 10 * diffs["fp32"]


def test_engine_finish_reasons_and_ignore_eos(tok, policy):
    engine = RolloutEngine(policy.config, eos_id=tok.eos_id, pad_id=tok.pad_id, seed=0)
    engine.load_weights(weight_sync.named_weights(policy))
    with torch.no_grad():  # final hidden state = e_0 and a large eos logit: every normal sample stops at once
        engine.model.ln_f.weight.zero_()
        engine.model.ln_f.bias.zero_()
        engine.model.ln_f.bias[0] = 1.0
        engine.model.lm_head.weight[tok.eos_id, 0] = 100.0
    prompt = tok.encode(tok.chat_prompt("reverse 12"))
    outs = engine.generate([prompt, prompt], [SamplingParams(max_new_tokens=6), SamplingParams(6, ignore_eos=True)])
    assert outs[0].finish_reason == "stop" and outs[0].tokens[-1] == tok.eos_id
    assert outs[1].finish_reason == "length" and len(outs[1].tokens) == 6
    assert outs[1].gen_end >= outs[0].gen_end >= outs[0].gen_start


def test_engine_rejects_prompts_past_the_context(tok, policy):
    engine = RolloutEngine(policy.config, eos_id=tok.eos_id, pad_id=tok.pad_id)
    with pytest.raises(ValueError, match="exceeds block_size"):
        engine.generate([[1] * 100], [SamplingParams(max_new_tokens=64)])


def test_checkpoint_round_trip_and_clear_errors(tmp_path, tok, policy):
    write_model_config(tmp_path, policy.config, tok)
    save_checkpoint(policy, tmp_path / "policy_v000003.pt")
    loaded, loaded_tok = load_checkpoint(tmp_path / "policy_v000003.pt")
    assert loaded_tok.vocab_hash() == tok.vocab_hash()
    for (name, a), b in zip(policy.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "policy_v000099.pt")
    (tmp_path / "policy_v000004.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        load_checkpoint(tmp_path / "policy_v000004.pt")
    with pytest.raises(CheckpointError, match="model_config.json does not exist"):
        load_checkpoint(tmp_path / "elsewhere" / "policy_v000003.pt")


def test_group_advantages_and_mismatch_formulas():
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), group_size=2)
    assert adv[0] > 0 > adv[1] and adv[2] == adv[3] == 0
    logp = torch.tensor([[-1.0, -2.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    m = grpo.mismatch(logp, rollout, mask, tis_cap=1.5)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(0.25)
    assert m["tis_mean"] == pytest.approx((torch.tensor(0.5).exp().item() + 1) / 2)
    assert m["tis_clipfrac"] == pytest.approx(0.5)  # e^0.5 = 1.65 > 1.5
    assert m["mismatch_k3"] == pytest.approx((torch.tensor(0.5).exp().item() - 1.5) / 2)


def test_disk_weights_round_trip_and_throttle_paces(tmp_path, policy):
    named = weight_sync.named_weights(policy)
    size = weight_sync.write_disk(named, tmp_path, 7, weight_sync.Throttle(None))
    assert size >= weight_sync.nbytes(named)
    back = weight_sync.read_disk(tmp_path, 7)
    assert all(torch.equal(named[k], back[k]) for k in named)
    throttle, start = weight_sync.Throttle(4e6), time.monotonic()
    for _ in range(4):
        throttle.pace(250_000)  # 1 MB at 4 MB/s
    assert time.monotonic() - start >= 0.24


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"mode": "async"}, "--mode async needs --placement disaggregated"),
        ({"placement": "disaggregated", "sync_method": "copy"}, "does not fit"),
        ({"group_size": 1}, "--group-size must be >= 2"),
        ({"slow_reward": 1.5}, "--slow-reward"),
        ({"steps": 0}, "--steps must be >= 1"),
    ],
)
def test_config_errors_name_the_flag(changes, message):
    assert message in validate(Config(**changes))


def test_config_defaults_pick_the_sync_method():
    cfg = Config(placement="disaggregated")
    assert validate(cfg) is None and cfg.sync_method == "object_store"
