"""Which tokenizer a batch was frozen with: a name and a hash of its vocabulary.

Token ids mean nothing without their vocabulary, so every batch records both, and loading or
rerunning it with a tokenizer whose vocabulary hashes differently is an error, not a silent
misreading. Works with Hugging Face tokenizers (`get_vocab()`), any object with `get_vocab()` or
a `vocab` (a `{token: id}` dict or an id -> token list), and a plain `{token: id}` dict.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from rltrace.replay.errors import ReplayError, TokenizerMismatchError

_cache: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _vocab(tokenizer: Any) -> Mapping[str, int]:
    if isinstance(tokenizer, Mapping):
        return tokenizer
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if callable(get_vocab) else getattr(tokenizer, "vocab", None)
    if isinstance(vocab, (list, tuple)):  # id -> token list
        vocab = {token: i for i, token in enumerate(vocab)}
    if not isinstance(vocab, Mapping):
        raise ReplayError(
            f"cannot read the vocabulary of tokenizer {type(tokenizer).__name__}: it needs get_vocab() or a "
            "vocab dict; or pass batch_meta={'tokenizer_name': ..., 'tokenizer_hash': ...} yourself"
        )
    return vocab


def vocab_hash(vocab: Mapping[str, int]) -> str:
    """sha256 of the vocabulary as sorted (token, id) pairs: independent of dict order."""
    items = sorted((str(token), int(index)) for token, index in vocab.items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def tokenizer_name(tokenizer: Any, size: int, digest: str) -> str:
    """Its `name_or_path` (Hugging Face) or `name` when it has one; else a name from its vocabulary,
    `vocab-<size>-<hash prefix>` (a class name such as `TokenizersBackend` says nothing)."""
    for attr in ("name_or_path", "name"):
        name = getattr(tokenizer, attr, None)
        if isinstance(name, str) and name.strip():
            return name.strip()
    return f"vocab-{size}-{digest[:12]}"


def tokenizer_identity(tokenizer: Any) -> tuple[str, str]:
    """(name, vocabulary hash) of a tokenizer; computed once per tokenizer object."""
    try:
        with _lock:
            cached = _cache.get(tokenizer)
        if cached is not None:
            return cached
    except TypeError:  # not weak-referenceable (e.g. a dict): compute each time
        pass
    vocab = _vocab(tokenizer)
    digest = vocab_hash(vocab)
    identity = (tokenizer_name(tokenizer, len(vocab), digest), digest)
    try:
        with _lock:
            _cache[tokenizer] = identity
    except TypeError:
        pass
    return identity


def check_tokenizer(tokenizer: Any, stored_name: str | None, stored_hash: str | None, where: str) -> None:
    """Raise `TokenizerMismatchError` if `tokenizer` is not the one recorded in `where`."""
    if tokenizer is None or stored_hash is None:
        return
    name, digest = tokenizer_identity(tokenizer)
    if digest != stored_hash:
        raise TokenizerMismatchError(
            f"{where}: field tokenizer_hash is {stored_hash[:16]}… ({stored_name}), but the tokenizer given "
            f"({name}) hashes to {digest[:16]}…: its vocabulary differs, so token ids would be misread; "
            "use the tokenizer the run was frozen with"
        )
