"""A character-level tokenizer with special tokens and a chat template, like a real LLM tokenizer in miniature.

Special tokens (`<|bos|>`, `<|user|>`, ...) are single ids; everything else is one id per
character. The chat template turns a user message into the prompt the policy was trained on:

    <|bos|><|user|>reverse 3141<|assistant|>        -> the model answers 1413<|eos|>

Template bugs are the first suspect when "text looks wrong"; `--bad-template` reproduces
the most common one (the generation prompt `<|assistant|>` is left out), see `chat_prompt`.
"""

from __future__ import annotations

import hashlib
import json

PAD, BOS, EOS, USER, ASSISTANT = "<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, USER, ASSISTANT)
CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz :"


class TokenizerError(ValueError):
    """Text holds a character the vocabulary does not have, or an id is out of range."""


class Tokenizer:
    """Encode/decode text; `vocab` is the id -> token list, `vocab_hash()` identifies it."""

    name_or_path = "tiny_grpo/char"  # the name frozen batches record (a Hugging Face tokenizer's attribute)

    def __init__(self, vocab: list[str] | None = None):
        self.vocab = list(vocab) if vocab is not None else [*SPECIAL_TOKENS, *CHARACTERS]
        self.ids = {token: i for i, token in enumerate(self.vocab)}
        if len(self.ids) != len(self.vocab):
            raise TokenizerError("vocabulary has duplicate tokens")
        missing = [t for t in SPECIAL_TOKENS if t not in self.ids]
        if missing:
            raise TokenizerError(f"vocabulary lacks special token(s) {missing}")
        self.pad_id, self.bos_id, self.eos_id = self.ids[PAD], self.ids[BOS], self.ids[EOS]
        self.special_ids = frozenset(self.ids[t] for t in SPECIAL_TOKENS)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def vocab_hash(self) -> str:
        """sha256 of the vocabulary: two tokenizers with the same hash encode identically."""
        return hashlib.sha256(json.dumps(self.vocab).encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special-token strings become their single id (as HF's default does)."""
        out, i = [], 0
        while i < len(text):
            if text[i] == "<":
                special = next((t for t in SPECIAL_TOKENS if text.startswith(t, i)), None)
                if special is not None:
                    out.append(self.ids[special])
                    i += len(special)
                    continue
            token_id = self.ids.get(text[i])
            if token_id is None:
                raise TokenizerError(f"character {text[i]!r} at position {i} of {text!r} is not in the vocabulary")
            out.append(token_id)
            i += 1
        return out

    def decode(self, ids, *, skip_special: bool = False) -> str:
        """Text of `ids`; special tokens are shown (so leaks are visible) unless `skip_special`."""
        pieces = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < len(self.vocab):
                raise TokenizerError(f"token id {token_id} is outside the vocabulary (size {len(self.vocab)})")
            if skip_special and token_id in self.special_ids:
                continue
            pieces.append(self.vocab[token_id])
        return "".join(pieces)

    def chat_prompt(self, user_text: str, *, add_generation_prompt: bool = True) -> str:
        """The chat template. Without the generation prompt the model is never told its turn began:
        that is the `--bad-template` bug, and the model's answer then starts with leaked tokens."""
        text = f"{BOS}{USER}{user_text}"
        return text + ASSISTANT if add_generation_prompt else text

    def to_json(self) -> dict:
        return {"vocab": self.vocab, "vocab_hash": self.vocab_hash()}

    @classmethod
    def from_json(cls, data: dict) -> Tokenizer:
        tok = cls(data["vocab"])
        if "vocab_hash" in data and data["vocab_hash"] != tok.vocab_hash():
            raise TokenizerError("tokenizer vocab_hash does not match its vocab: the file was edited or is corrupt")
        return tok
