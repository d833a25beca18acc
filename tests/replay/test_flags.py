"""Each bad-text flag fires on the thing it names and stays quiet on ordinary text."""

import numpy as np
import torch

from rltrace.replay.flags import TextRules, batch_flags, reward_outliers, sample_flags
from tests.replay.tiny import CharTokenizer

TOK = CharTokenizer()
RULES = TextRules.from_meta({"special_token_ids": TOK.all_special_ids, "eos_token_ids": [TOK.eos_token_id], "max_response_len": 40})


def flags_of(text=None, tokens=None, finish=None):
    sample = {"response_text": text, "finish_reason": finish}
    if tokens is not None:
        sample["response_tokens"] = torch.tensor(tokens)
    elif text is not None:
        sample["response_tokens"] = torch.tensor(TOK.encode(text))
    return sample_flags(sample, RULES)


def test_ordinary_text_has_no_flags():
    assert flags_of("the answer is four.<|im_end|>") == {}


def test_repetition_loop_at_the_end():
    found = flags_of("so the answer is" + " four" * 8)
    assert "5-token pattern repeated" in found["repetition"]


def test_repetition_low_diversity_over_the_whole_response():
    tokens = list(np.random.default_rng(0).integers(5, 7, 200))
    assert "4-grams are distinct" in flags_of(tokens=tokens)["repetition"]


def test_invalid_utf8_and_non_printable_runs():
    found = flags_of("caf\ufffd ok \x00\x01\x02 end", tokens=[5, 6])
    assert "1 U+FFFD" in found["invalid_text"] and "non-printable run" in found["invalid_text"]
    assert "invalid_text" not in flags_of("tabs\tand\nnewlines are fine", tokens=[5, 6])


def test_truncation_by_finish_reason_or_length_cap():
    assert flags_of("abc", finish="length")["truncated"] == "finish_reason=length"
    assert "max_response_len=40" in flags_of(tokens=list(range(5, 45)))["truncated"]
    assert "truncated" not in flags_of("abc", finish="stop")
    assert "truncated" not in flags_of(tokens=list(range(5, 45)), finish="stop")  # EOS on the last allowed token


def test_template_and_special_tokens_leaking_into_the_response():
    found = flags_of("hello<|im_start|>assistant\nhello<|im_end|>")
    assert "special token id" in found["template_leak"]
    text_only = sample_flags({"response_text": "[INST] do it [/INST] ok"}, RULES)
    assert "'[INST]'" in text_only["template_leak"]
    assert "template_leak" not in flags_of("fine<|im_end|>")  # the end-of-sequence token at the end is allowed


def test_a_prompt_without_the_generation_prompt():
    rules = TextRules.from_meta({"generation_prompt": "<|im_start|>assistant\n"})
    good = {"prompt_text": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "response_text": "hello"}
    bad = {"prompt_text": "<|im_start|>user\nhi<|im_end|>\n", "response_text": "hello"}
    assert sample_flags(good, rules) == {}
    assert "does not end with the generation prompt" in sample_flags(bad, rules)["prompt_template"]
    assert sample_flags(bad) == {}  # without the batch's generation_prompt there is nothing to compare


def test_empty_response():
    assert flags_of(tokens=[])["empty"] == "no response tokens"
    assert flags_of("   ", tokens=[5, 5, 5])["empty"] == "response text is only whitespace"


def test_reward_outliers_robust_and_non_finite():
    rewards = [0.5, 0.52, 0.48, 0.51, 0.49, 5.0, float("nan"), None]
    out = reward_outliers(rewards)
    assert set(out) == {5, 6}
    assert "robust z" in out[5] and "nan" in out[6]
    # a 0/1 reward that mostly fails: its successes (0.8, 1.0) are not outliers, a reward of 50 is
    assert reward_outliers([0.0] * 30 + [1.0]) == {} and reward_outliers([0.0] * 54 + [0.8] * 10) == {}
    assert set(reward_outliers([0.0] * 30 + [50.0])) == {30}
    assert reward_outliers([0.5, 0.51, 0.49, 0.5, 0.6]) == {}  # 0.6 is far in spreads of 0.01, not in rewards
    assert reward_outliers([0.0, 1.0] * 10) == {}


def test_batch_flags_adds_reward_outliers_to_sample_flags():
    samples = [{"response_text": "fine", "reward": r} for r in [0.5, 0.5, 0.6, 0.4, 0.5, -9.0]]
    out = batch_flags(samples)
    assert [bool(f) for f in out] == [False] * 5 + [True]
    assert "reward_outlier" in out[5]
