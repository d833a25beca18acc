"""Signs of bad text in a sample: what to look at first when "the text looks wrong".

Each check returns a short reason or nothing; `sample_flags` runs them all on one sample,
`reward_outliers` looks across a batch. The checks read `response_tokens` (any array or list),
`response_text` and `prompt_text` when present, `finish_reason`, and the batch's `max_response_len`,
`special_token_ids`, `eos_token_ids`, `special_tokens` and `generation_prompt` (from `batch_meta`).

    repetition      the response ends in a loop (a pattern of <= 128 tokens or chars repeated >= 4
                    times), or fewer than 25% of its 4-grams are distinct
    invalid_text    U+FFFD replacement characters (invalid UTF-8 decoded) or non-printable characters
    truncated       finish_reason says length; without a finish_reason, the response reached max_response_len
    template_leak   chat-template markers or special tokens inside the response (one at the very end,
                    the end-of-sequence token, is allowed); tokens under loss mask 0 (tool turns) are not
                    the model's writing and are never flagged
    prompt_template the prompt does not end with the template's generation prompt (batch_meta
                    `generation_prompt`, e.g. "<|im_start|>assistant\n"): add_generation_prompt was off
    empty           no response tokens, or a response of only whitespace
    reward_outlier  reward is NaN/inf, or more than 3.5 robust standard deviations from the batch median
                    (and more than ~1 reward unit: 3.5 x 0.3 x max(1, |median|), so a tiny spread flags nothing)
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FLAGS = ("repetition", "invalid_text", "truncated", "template_leak", "prompt_template", "empty", "reward_outlier")
#: Flags that mean the text itself is bad (the anomaly trigger of `FreezePolicy(bad_text=True)`).
BAD_TEXT = ("repetition", "invalid_text", "template_leak", "prompt_template", "empty")

_TRUNCATED_REASONS = frozenset(("length", "truncated", "max_tokens", "max_length"))
_MARKERS = (
    r"<\|[A-Za-z0-9_]{1,32}\|>",  # <|im_start|>, <|eot_id|>, <|endoftext|>, ...
    r"\[/?INST\]",
    r"<</?SYS>>",
    r"<(?:start|end)_of_turn>",
    r"</?s>",
    r"<(?:bos|eos|pad|unk)>",
)
_NON_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ue000-\uf8ff\ud800-\udfff\ufffe\uffff]+")
_TAIL = 2048  # only the end of a long response is searched for loops


@dataclass
class TextRules:
    """What counts as bad for one batch; `TextRules.from_meta(batch.extra)` reads it from batch_meta."""

    max_response_len: int | None = None
    special_token_ids: frozenset[int] = frozenset()
    eos_token_ids: frozenset[int] = frozenset()
    generation_prompt: str | None = None
    markers: re.Pattern = field(default_factory=lambda: re.compile("|".join(_MARKERS)))

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> TextRules:
        meta = meta or {}
        special = [str(t) for t in meta.get("special_tokens") or () if str(t).strip()]
        eos = meta.get("eos_token_ids", meta.get("eos_token_id"))
        eos = [eos] if isinstance(eos, int) else list(eos or ())
        limit = meta.get("max_response_len")
        return cls(
            max_response_len=int(limit) if limit is not None else None,
            special_token_ids=frozenset(int(i) for i in meta.get("special_token_ids") or ()),
            eos_token_ids=frozenset(int(i) for i in eos),
            generation_prompt=meta.get("generation_prompt") or None,
            markers=re.compile("|".join((*_MARKERS, *(re.escape(t) for t in special)))),
        )


def as_ints(value: Any) -> np.ndarray | None:
    """Token ids as a 1-D int64 numpy array (None if absent or on an accelerator: no device syncs)."""
    if value is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return None
        value = value.detach().reshape(-1).numpy()
    arr = np.asarray(value)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    return arr.reshape(-1).astype(np.int64, copy=False) if arr.dtype.kind in "biu" else None


def loop_at_end(seq: np.ndarray, max_period: int = 128, min_repeats: int = 4, min_span: int = 16) -> tuple[int, int] | None:
    """(period, repeats) of the shortest pattern repeated at the end of `seq`, or None."""
    tail = seq[-_TAIL:]
    for period in range(1, min(max_period, len(tail) // min_repeats) + 1):
        same = tail[period:] == tail[:-period]
        breaks = np.flatnonzero(~same)
        run = len(same) - (int(breaks[-1]) + 1 if breaks.size else 0)
        span = run + period
        if span >= max(min_repeats * period, min_span):
            return period, span // period
    return None


def low_diversity(seq: np.ndarray, n: int = 4, min_len: int = 64, threshold: float = 0.25) -> float | None:
    """Share of distinct n-grams when below `threshold` (a response that keeps repeating itself)."""
    if len(seq) < min_len:
        return None
    s = seq.astype(np.uint64)
    grams = s[: len(s) - n + 1].copy()
    for k in range(1, n):
        grams = grams * np.uint64(1_000_003) + s[k : len(s) - n + 1 + k]
    share = len(np.unique(grams)) / len(grams)
    return share if share < threshold else None


def _repetition(tokens: np.ndarray | None, text: str | None) -> str | None:
    for seq, unit in ((tokens, "token"), (_codepoints(text), "char")):
        if seq is None or len(seq) == 0:
            continue
        loop = loop_at_end(seq)
        if loop:
            return f"ends with a {loop[0]}-{unit} pattern repeated {loop[1]}x"
        share = low_diversity(seq)
        if share is not None:
            return f"only {share:.0%} of its {unit} 4-grams are distinct"
    return None


def _codepoints(text: str | None) -> np.ndarray | None:
    if not text:
        return None
    return np.frombuffer(text[-_TAIL:].encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _invalid_text(text: str | None) -> str | None:
    if not text:
        return None
    reasons = []
    bad = text.count("\ufffd")
    if bad:
        reasons.append(f"{bad} U+FFFD replacement char(s) (invalid UTF-8)")
    runs = _NON_PRINTABLE.findall(text)
    if runs:
        longest = max(runs, key=len)
        reasons.append(f"{len(runs)} non-printable run(s), longest {len(longest)} ({longest[:8]!r})")
    return "; ".join(reasons) or None


def _truncated(tokens: np.ndarray | None, finish_reason: Any, rules: TextRules) -> str | None:
    if isinstance(finish_reason, str):  # the engine knows best: an EOS on the last allowed token is no cut
        return f"finish_reason={finish_reason}" if finish_reason.lower() in _TRUNCATED_REASONS else None
    if tokens is not None and rules.max_response_len and len(tokens) >= rules.max_response_len:
        return f"reached max_response_len={rules.max_response_len}"
    return None


def _is_special(tokens: np.ndarray, ids: frozenset[int]) -> np.ndarray:
    if len(ids) > 32:
        return np.isin(tokens, np.fromiter(ids, np.int64))
    mask = np.zeros(len(tokens), dtype=bool)
    for token_id in ids:  # a few comparisons beat np.isin's sort for the usual handful of special tokens
        mask |= tokens == token_id
    return mask


def _template_leak(tokens: np.ndarray | None, text: str | None, rules: TextRules) -> str | None:
    if tokens is not None and len(tokens) and rules.special_token_ids:
        special = _is_special(tokens, rules.special_token_ids)
        last_ok = special[-1] and (not rules.eos_token_ids or int(tokens[-1]) in rules.eos_token_ids)
        where = np.flatnonzero(special[:-1] if last_ok else special)
        if where.size:
            return f"special token id {int(tokens[where[0]])} at response position {int(where[0])} ({where.size} in all)"
    if text:
        found = [m for m in rules.markers.finditer(text)]
        if found and found[-1].end() == len(text.rstrip()):
            found = found[:-1]  # the end-of-sequence marker
        if found:
            return f"template marker {found[0].group()!r} at char {found[0].start()} ({len(found)} in all)"
    return None


def _prompt_template(prompt: str | None, rules: TextRules) -> str | None:
    if not prompt or not rules.generation_prompt or prompt.rstrip().endswith(rules.generation_prompt.rstrip()):
        return None
    return f"prompt does not end with the generation prompt {rules.generation_prompt!r} (add_generation_prompt off?)"


def _empty(tokens: np.ndarray | None, text: str | None) -> str | None:
    if tokens is not None and len(tokens) == 0:
        return "no response tokens"
    if text is not None and not text.strip():
        return "response text is empty" if not text else "response text is only whitespace"
    return None


def trained_part(tokens: np.ndarray | None, mask: Any) -> np.ndarray | None:
    """The response tokens under loss mask 1, or None when the mask has no zeros (or does not fit)."""
    m = as_ints(mask)
    if tokens is None or m is None or len(m) != len(tokens) or m.all():
        return None
    return tokens[m != 0]


def sample_flags(sample: Mapping[str, Any], rules: TextRules | None = None, *, only: Sequence[str] = FLAGS) -> dict[str, str]:
    """Flags of one sample (a dict with response_tokens / response_text / prompt_text / finish_reason): {flag: reason}.

    With a `loss_mask` holding zeros (tool or environment turns, an off-policy prefix), the text
    checks look only at what the model wrote and is trained on: the tokens under mask 1, and
    `trained_text` (their decoded text) when given. Without that text, the response text, which
    includes the tool turns' template markers, is not searched for markers.
    """
    rules = rules or TextRules()
    tokens = as_ints(sample.get("response_tokens"))
    text = sample.get("response_text")
    text = text if isinstance(text, str) else None
    trained = trained_part(tokens, sample.get("loss_mask"))
    if trained is not None:
        trained_text = sample.get("trained_text")
        scan_tokens, scan_text = trained, trained_text if isinstance(trained_text, str) else None
    else:
        scan_tokens, scan_text = tokens, text
    checks = {
        "repetition": lambda: _repetition(scan_tokens, scan_text),
        "invalid_text": lambda: _invalid_text(scan_text),
        "truncated": lambda: _truncated(tokens, sample.get("finish_reason"), rules),
        "template_leak": lambda: _template_leak(scan_tokens, scan_text, rules),
        "prompt_template": lambda: _prompt_template(sample.get("prompt_text"), rules),
        "empty": lambda: _empty(tokens, text),
    }
    out = {}
    for name in only:
        check = checks.get(name)
        reason = check() if check is not None else None
        if reason:
            out[name] = reason
    return out


SCALE_FLOOR = 0.3  # the smallest spread a reward outlier is judged by, in units of max(1, |batch median|)


def reward_outliers(rewards: Sequence[Any], z: float = 3.5) -> dict[int, str]:
    """{sample index: reason} for rewards that are NaN/inf or far from the batch median (robust z-score)."""
    values = np.array([np.nan if r is None else float(r) for r in rewards], dtype=np.float64)
    present = np.array([r is not None for r in rewards], dtype=bool)
    out = {int(i): f"reward is {values[i]}" for i in np.flatnonzero(~np.isfinite(values) & present)}
    finite = values[np.isfinite(values)]
    if finite.size < 4:
        return out
    median = float(np.median(finite))
    spread = 1.4826 * float(np.median(np.abs(finite - median)))
    center, scale, what = (median, spread, "robust z") if spread > 0 else (float(finite.mean()), float(finite.std()), "z")
    if scale <= 0 or not math.isfinite(scale):
        return out
    # a tiny spread (most rewards equal: a 0/1 reward that mostly fails) makes any other value look
    # extreme; a reward is an outlier only beyond z x SCALE_FLOOR of the reward's own size
    scale = max(scale, SCALE_FLOOR * max(1.0, abs(median)))
    for i in np.flatnonzero(np.isfinite(values)):
        score = (values[i] - center) / scale
        if abs(score) > z:
            out[int(i)] = f"reward {values[i]:.4g} is {score:+.1f} {what} from the batch ({center:.4g})"
    return out


def batch_flags(samples: Sequence[Mapping[str, Any]], rules: TextRules | None = None) -> list[dict[str, str]]:
    """Flags of every sample, reward outliers included."""
    out = [sample_flags(s, rules) for s in samples]
    if samples and any("reward" in s for s in samples):
        for i, reason in reward_outliers([s.get("reward") for s in samples]).items():
            out[i]["reward_outlier"] = reason
    return out
