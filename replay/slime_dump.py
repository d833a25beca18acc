"""slime's debug dumps, read: the dump files and one frozen-batch row per sample (the import itself:
slime.py; export: slime_export.py).

slime (THUDM/slime) writes, per rollout id, with `torch.save`:
  --save-debug-rollout-data  {"rollout_id": id, "samples": [Sample.to_dict(), ...]}
                             (each sample may carry a `trace` carrier: {"trace_id", "events": [...]})
  --save-debug-train-data    format_version 2: {"format_version": 2, "rollout_id", "samples": [one dict per
                             trained sample: sample_index, rollout_position, log_probs, advantages, ...],
                             "dp_shards", "raw_reward"}; older dumps: {"rollout_id", "rank", "rollout_data"}
Import makes one frozen batch per rollout id (step = rollout id), joins each train sample to its
rollout sample (train `sample_index` = rollout `index`; else `rollout_position`), and turns the
traces into spans and `samples` rows (`rltrace.replay.slime_trace`). A sample that cannot be read
raises `SampleError` with the reason, and costs only itself; a file that is not a slime dump
raises `SlimeDumpError` naming it.

Dumps are pickles: they are read with torch's restricted unpickler (`weights_only=True`: containers,
numbers, strings and tensors). A dump that needs more (custom classes, images) is refused unless
the user passes `--trust-pickle`, which runs the full unpickler: only for files you trust. A file
that torch.save did not write (a JSONL log, garbage) is named as not a slime dump, before any
unpickler sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rltrace import _paths
from rltrace.replay import codec
from rltrace.replay.batch import RESERVED
from rltrace.replay.errors import SlimeDumpError
from rltrace.replay.safe_torch import safe_torch
from rltrace.replay.slime_trace import STATUS_TO_FINISH
from rltrace.store.convert import fits_int64, show, text

#: slime Sample fields stored under rltrace's names (import renames them, export renames them back)
RENAMED = {"index": "sample_id", "group_index": "group_id", "response": "response_text", "status": "finish_reason"}
#: train-dump fields that repeat the rollout sample (checked against it, not stored twice)
_TRAIN_DUPLICATES = {"tokens", "response_lengths", "loss_masks", "rollout_log_probs", "total_lengths", "sample_index", "rollout_position"}
_TRAIN_RENAMED = {"log_probs": "train_log_probs", "advantages": "advantages"}


class SampleError(SlimeDumpError):
    """One sample of a dump that cannot be imported; the message is the reason (the importer counts
    it with the file and the sample's position), the rest of the dump is imported."""


_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"  # how torch.save files begin: a zip archive, or (legacy) a pickle


# --- reading -----------------------------------------------------------------------------------
def _not_a_dump(path: Path) -> str | None:
    """Why `path` is not a file torch.save writes (judged by its first bytes), or None."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head.startswith(_ZIP) or head.startswith(_PICKLE):
        return None
    stripped = head.lstrip()
    if not head:
        return "it is empty"
    if stripped[:1] in (b"{", b"["):
        return "it holds JSON text (a log?), not what torch.save writes"
    try:
        head.decode("utf-8")
        return "it holds text, not what torch.save writes"
    except UnicodeDecodeError:
        return "it does not start like a torch.save file (a zip archive or a pickle)"


def read_dump(path: Path, *, trust_pickle: bool = False) -> Any:
    """torch.load with the restricted unpickler; the full one only with `trust_pickle`, and only
    for a file that needs it (one whose pickle names a class the restricted unpickler refuses)."""
    why = _not_a_dump(path)
    if why is not None:
        raise SlimeDumpError(f"{path}: not a slime dump: {why}")
    torch = safe_torch()  # torch <= 2.5.1: weights_only=True can be bypassed
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ... : say which file and why
        message = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", message)
        if found is None:  # damaged, truncated, or not torch.save's: no unpickler would read it
            detail = next((line.strip() for line in message.splitlines() if "error:" in line.lower()), None)
            reason = detail or (message.strip().splitlines()[0] if message.strip() else type(exc).__name__)
            raise SlimeDumpError(f"{path}: not a readable torch.save file, truncated or damaged ({text(reason)[:200]})") from None
        if not trust_pickle:
            raise SlimeDumpError(
                f"{path}: holds objects the safe loader refuses (it needs {found.group(1)}); loading it would run "
                "the full pickle unpickler, which can execute code from the file: pass --trust-pickle only if you trust it"
            ) from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise SlimeDumpError(f"{path}: cannot be loaded even with --trust-pickle ({text(str(exc))[:200]})") from None


def dump_kind(data: Any, path: Path) -> str:
    """'rollout', 'train' or 'train_v1' (a clear error naming the missing field otherwise)."""
    if not isinstance(data, dict):
        raise SlimeDumpError(f"{path}: not a slime dump: expected a dict with 'rollout_id' and 'samples', got {type(data).__name__}")
    if "rollout_data" in data and "samples" not in data:
        return "train_v1"
    for key in ("rollout_id", "samples"):
        if key not in data:
            raise SlimeDumpError(f"{path}: field {key!r} is missing; not a slime debug dump")
    if not isinstance(data["samples"], list):
        raise SlimeDumpError(f"{path}: field 'samples' is {type(data['samples']).__name__}, expected a list")
    if "format_version" in data:
        if data["format_version"] != 2:
            raise SlimeDumpError(f"{path}: train dump format_version {show(data['format_version'])} is not supported (only 2)")
        return "train"
    return "rollout"


def rollout_id(data: dict, path: Path) -> int:
    """The dump's rollout id: an integer that fits int64 (it becomes the step)."""
    value = data.get("rollout_id")
    number = whole(value)
    if number is None:
        raise SlimeDumpError(f"{path}: field 'rollout_id' is {show(value)}, expected an integer")
    if not fits_int64(number):
        raise SlimeDumpError(f"{path}: field 'rollout_id' is {show(number)}, which does not fit int64")
    return number


def whole(value: Any) -> int | None:
    """An integer given as an int, a numpy integer or a 0-d integer tensor; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", None) == 0:
        try:
            got = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return got if isinstance(got, int) and not isinstance(got, bool) else None
    return None


def _ints(value: Any, field: str) -> np.ndarray:
    try:
        arr = np.asarray(value.tolist() if hasattr(value, "tolist") and not isinstance(value, np.ndarray) else value)
    except (TypeError, ValueError, RuntimeError):
        arr = None
    if arr is None or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu") or (arr.dtype.kind == "u" and arr.size and arr.max() > 2**63 - 1):
        raise SampleError(f"field {field!r}: expected a list of token ids (integers that fit int64)")
    return arr.astype(np.int64)


def _split_tokens(tokens: Any, response_length: Any, length_field: str = "response_length") -> tuple[Any, Any]:
    """slime keeps prompt + response in `tokens`; the last `response_length` are the response."""
    ids = _ints(tokens, "tokens")
    n = whole(response_length)
    if n is None or not 0 <= n <= len(ids):
        raise SampleError(f"field {length_field!r} is {show(response_length)}, expected 0..{len(ids)} (len(tokens))")
    cut = len(ids) - n
    return tokens[:cut], tokens[cut:]


def rollout_row(sample: Any, drop: frozenset[str]) -> dict[str, Any]:
    """One frozen-batch row from a `Sample.to_dict()` dict; remaining fields go to the `slime` JSON
    column. Text is made valid UTF-8 (a lone surrogate becomes its escape, as everywhere in the store)."""
    if not isinstance(sample, dict):
        raise SampleError(f"expected a dict (Sample.to_dict()), got {type(sample).__name__}")
    for key in ("tokens", "response_length", "status"):
        if key not in sample:
            raise SampleError(f"field {key!r} is missing")
    row: dict[str, Any] = {}
    row["prompt_tokens"], row["response_tokens"] = _split_tokens(sample["tokens"], sample["response_length"])
    status = sample["status"]
    if not isinstance(status, str):
        raise SampleError(f"field 'status' is {show(status)}, expected one of {sorted(STATUS_TO_FINISH)}")
    extra: dict[str, Any] = {}
    for key, value in sample.items():
        if key in ("tokens", "response_length") or key in drop:
            continue
        if key == "status":
            row["finish_reason"] = STATUS_TO_FINISH.get(status, status)
        elif key in RENAMED:
            row[RENAMED[key]] = value
        elif key == "reward":
            if isinstance(value, dict):
                row["reward_components"] = value
            elif value is not None:
                row["reward"] = value
        elif key == "weight_versions":
            extra[key] = value
            try:
                versions = [int(v) for v in value or ()]
                row["weight_versions"], row["weight_version"] = versions, (min(versions) if versions else None)
            except (TypeError, ValueError):
                pass
        elif key in ("loss_mask", "rollout_log_probs", "metadata"):
            row[key] = value
        elif codec.kind_of(value) in (*codec.ARRAY_KINDS, "list") and key not in RESERVED and key not in row:
            row[key] = value
        else:
            extra[key] = value
    if "prompt" in extra and isinstance(extra["prompt"], str):
        row["prompt_text"] = extra.pop("prompt")
    row["slime"] = extra
    return {key: text(value) if isinstance(value, str) else value for key, value in row.items()}


def unstorable_fields(row: dict) -> list[tuple[str, str]]:
    """Take out of `row["slime"]` the fields JSON cannot hold; (field, reason) for each."""
    out = []
    for key, value in list(row["slime"].items()):
        try:
            json.dumps(value, default=codec.json_default)
        except (TypeError, ValueError, OverflowError, RecursionError):
            del row["slime"][key]
            out.append((key, f"field {key!r} holds {type(value).__name__}, which cannot be stored; leave it out with --drop-field {key}"))
    return out


def _per_sample(value: Any, n: int) -> bool:
    if hasattr(value, "dim") and hasattr(value, "size"):
        return value.dim() >= 1 and value.size(0) == n
    return isinstance(value, (list, tuple)) and len(value) == n


def train_samples(data: dict, kind: str, path: Path) -> list:
    """The per-sample dicts of a train dump (format 2 as is; format 1 transposed like slime does).
    A sample that is not a dict stays in the list: the join counts it."""
    if kind == "train":
        return data["samples"]
    shard = data["rollout_data"]
    if not isinstance(shard, dict) or "response_lengths" not in shard:
        raise SlimeDumpError(f"{path}: field 'rollout_data.response_lengths' is missing")
    n = len(shard["response_lengths"])
    columns = {k: v for k, v in shard.items() if _per_sample(v, n)}
    samples = [{k: v[i] for k, v in columns.items()} for i in range(n)]
    for sample, position in zip(samples, shard.get("partition") or [None] * n):
        sample["rollout_position"] = position
        if "sample_indices" in sample:
            sample["sample_index"] = sample.pop("sample_indices")
    return samples


def join_train(rows: dict[int, dict], rollout: list | None, train: list, drop: frozenset[str]) -> list[tuple[int, str]]:
    """Add each train sample's fields to its rollout row (`rows`: rollout position -> row, the
    samples that were read): train `sample_index` = rollout `index`, else `rollout_position`.
    Without a rollout dump each train sample j makes its own row, at key `max(rows) + 1 + j`.
    Returns (train sample, reason) for each train sample that could not be joined (it costs only itself)."""
    refused = []
    if rollout is None:
        base = max(rows, default=-1) + 1
        for j, t in enumerate(train):
            try:
                rows[base + j] = _train_only_row(t, drop)
            except SampleError as exc:
                refused.append((j, str(exc)))
        return refused
    by_index = {_int_or_none(s.get("index")): i for i, s in enumerate(rollout) if isinstance(s, dict)}
    use_index = (len(by_index) == len(rollout) and None not in by_index
                 and all(isinstance(t, dict) and _int_or_none(t.get("sample_index")) in by_index for t in train))
    for j, t in enumerate(train):
        if not isinstance(t, dict):
            refused.append((j, f"expected a dict, got {type(t).__name__}"))
            continue
        position = _int_or_none(t.get("rollout_position"))
        if use_index:
            i = by_index[_int_or_none(t["sample_index"])]
        elif position is not None and 0 <= position < len(rollout):
            i = position
        else:
            refused.append((j, "cannot be matched to a rollout sample: field 'sample_index' does not match a rollout "
                               f"'index' and field 'rollout_position' is {show(t.get('rollout_position'))}"))
            continue
        if i not in rows:
            refused.append((j, f"its rollout sample {i} was not imported"))
            continue
        try:
            same = "tokens" not in t or np.array_equal(_ints(t["tokens"], "tokens"), _ints(rollout[i]["tokens"], "tokens"))
        except SampleError as exc:
            refused.append((j, str(exc)))
            continue
        if not same:
            refused.append((j, f"field 'tokens' differs from rollout sample {i}'s; the two dumps are not of the same rollout"))
            continue
        rows[i].update(_train_fields(t, drop))
    return refused


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def _train_fields(t: dict, drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {_TRAIN_RENAMED.get(k, f"train_{k}"): v for k, v in t.items() if k not in _TRAIN_DUPLICATES and k not in drop}


def _train_only_row(t: Any, drop: frozenset[str]) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise SampleError(f"expected a dict, got {type(t).__name__}")
    if "tokens" not in t or "response_lengths" not in t:
        raise SampleError("fields 'tokens' and 'response_lengths' are needed without a rollout dump")
    row: dict[str, Any] = {}
    row["prompt_tokens"], row["response_tokens"] = _split_tokens(t["tokens"], t["response_lengths"], "response_lengths")
    if "loss_masks" in t:
        row["loss_mask"] = t["loss_masks"]
    if "rollout_log_probs" in t:
        row["rollout_log_probs"] = t["rollout_log_probs"]
    if "sample_index" in t and t["sample_index"] is not None:
        row["sample_id"] = _int_or_none(t["sample_index"])
    row.update(_train_fields(t, drop))
    return row


def find_dumps(paths: Iterable[str | Path]) -> list[Path]:
    """The .pt files named, and those under the directories named (slime's dump_details layout)."""
    return _paths.expand(paths, lambda p: p.suffix == ".pt", SlimeDumpError, "no .pt files")
