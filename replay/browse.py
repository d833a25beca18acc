"""What is frozen in a run, and what each sample looks like: the data behind `replay list` and `show`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.replay.batch import FrozenBatch, batch_parts
from rltrace.replay.diff import rows_of
from rltrace.replay.errors import DamagedBatchError, ReplayError
from rltrace.replay.flags import TextRules, as_ints, batch_flags, reward_outliers, trained_part

_LIST_COLUMNS = ("step", "batch_id", "n_samples", "frozen_ns", "trigger", "reason", "train_version", "tokenizer_name", "checkpoint")


def list_batches(run_dir: str | Path, *, skip_corrupt: bool = True, rewards: bool = False) -> tuple[list[dict], list[str]]:
    """One dict per frozen batch (oldest step first, with its replay count), and unreadable parts
    (without `skip_corrupt`, the first unreadable one is a `CorruptPartError`). With `rewards`,
    each dict also holds `rewards`: the batch's reward column alone, one value a sample (None without one)."""
    parts, skipped = batch_parts(run_dir, skip_corrupt=skip_corrupt)
    replays_dir = Path(run_dir) / _names.REPLAYS.folder
    replay_ids: dict[str, set[str]] = {}
    for path in replays_dir.glob("*.parquet") if replays_dir.is_dir() else ():
        pieces = path.stem.split("-")
        if len(pieces) == 4:
            replay_ids.setdefault(pieces[1], set()).add(pieces[2])
    out = []
    for path in parts:
        try:
            with pq.ParquetFile(path) as part:  # one open a part: a run may hold thousands of batches
                names = part.schema_arrow.names
                wanted = [c for c in _LIST_COLUMNS if c in names] + (["reward"] if rewards and "reward" in names else [])
                table = part.read(columns=wanted)
        except (OSError, pa.ArrowException) as exc:
            if not skip_corrupt:
                raise DamagedBatchError(f"{path}: cannot be read ({exc})") from None
            skipped.append(f"{path}: {exc}")
            continue
        head = table.drop_columns(["reward"]) if "reward" in wanted else table
        row = head.slice(0, 1).to_pylist()[0] if table.num_rows else {}
        if rewards:
            row["rewards"] = _numbers(table.column("reward")) if "reward" in wanted else [None] * table.num_rows
        row.update(path=str(path), bytes=path.stat().st_size, replays=len(replay_ids.get(row.get("batch_id"), ())))
        out.append(row)
    out.sort(key=lambda r: (r.get("step") or 0, r.get("frozen_ns") or 0))
    return out, skipped


def _numbers(column: pa.ChunkedArray) -> list[float | None]:
    """A reward column as floats (None where missing or not a number: a reward stored as raw bits)."""
    if pa.types.is_floating(column.type) or pa.types.is_integer(column.type) or pa.types.is_boolean(column.type):
        return [None if v is None else float(v) for v in column.to_pylist()]
    return [None] * len(column)


def reward_ranking(batches: list[dict]) -> list[dict[str, Any]]:
    """Every sample of `batches` (`list_batches(..., rewards=True)`) as step, batch_id, sample_index,
    reward and its reward_outlier flag, in `by_reward_outlier`'s order: the first is the run's worst
    sample as `replay show --step all --sort reward_outlier` ranks it, found from the reward column alone."""
    views = []
    for batch in batches:
        values = batch["rewards"]
        flagged = reward_outliers(values)
        views += [{"step": batch.get("step"), "batch_id": batch.get("batch_id"), "sample_index": i, "reward": r,
                   "flags": {"reward_outlier": flagged[i]} if i in flagged else {}} for i, r in enumerate(values)]
    return by_reward_outlier(views)


def _decode(tokenizer: Any, ids: Any) -> str | None:
    """The text of `ids` with special tokens shown (Hugging Face's default), or None."""
    if tokenizer is None or ids is None:
        return None
    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return tokenizer.decode([int(v) for v in values])


def sample_views(batch: FrozenBatch, tokenizer: Any = None) -> list[dict[str, Any]]:
    """Per sample: ids, versions, lengths, reward, texts, flags.

    With `tokenizer`, texts are decoded from the stored tokens, special tokens visible: the stored
    text is the framework's own decode, which often strips them, hiding a template leak. The
    stored text is kept as `stored_response_text` where it differs (else None)."""
    n = len(batch)
    columns = {name: rows_of(batch[name], n) for name in batch.columns}
    rules = TextRules.from_meta(batch.extra)
    views = []
    for i in range(n):
        get = {name: column[i] for name, column in columns.items()}.get
        response, prompt = get("response_tokens"), get("prompt_tokens")
        stored_response, decoded_response = get("response_text"), _decode(tokenizer, response)
        response_text = stored_response if decoded_response is None else decoded_response
        prompt_text = _decode(tokenizer, prompt)
        if prompt_text is None:
            prompt_text = get("prompt_text")
        trained = trained_part(as_ints(response), get("loss_mask"))
        views.append(
            {
                "sample_index": i,
                "sample_id": get("sample_id"),
                "group_id": get("group_id"),
                "weight_version": get("weight_version"),
                "reward": None if get("reward") is None else float(get("reward")),
                "finish_reason": get("finish_reason"),
                "prompt_len": None if prompt is None else len(prompt),
                "response_len": None if response is None else len(response),
                "prompt_text": prompt_text,
                "response_text": response_text,
                "text_from": "tokens" if decoded_response is not None else "stored" if stored_response is not None else None,
                "stored_response_text": stored_response if stored_response != response_text else None,
                "response_tokens": response,
                "loss_mask": get("loss_mask"),
                "trained_text": None if trained is None else _decode(tokenizer, trained),
            }
        )
    for view, found in zip(views, batch_flags(views, rules)):
        view["flags"] = found
        view.pop("loss_mask")  # read by the flags; drawn from the batch's own column
    return views


def pick_sample(views: list[dict], index: int, where: str) -> dict:
    if not 0 <= index < len(views):
        raise ReplayError(f"{where}: --sample {index} is out of range; the batch has {len(views)} samples (0..{len(views) - 1})")
    return views[index]


def by_reward_outlier(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sample views, reward outliers first, the farthest from its batch's median reward first (NaN/inf:
    infinitely far; no reward: 0): the one order of `replay show --sort reward_outlier` and the
    dashboard's Batches page. A batch is the views of one (step, batch_id)."""
    rewards: dict[tuple, list[float]] = {}
    for v in views:
        if v.get("reward") is not None and math.isfinite(v["reward"]):
            rewards.setdefault((v.get("step"), v.get("batch_id")), []).append(v["reward"])
    medians = {key: statistics.median(values) for key, values in rewards.items()}

    def severity(v: dict[str, Any]) -> float:
        reward, median = v.get("reward"), medians.get((v.get("step"), v.get("batch_id")))
        if reward is None:
            return 0.0
        if not math.isfinite(reward):
            return math.inf
        return abs(reward - median) if median is not None else 0.0

    return sorted(views, key=lambda v: ("reward_outlier" not in (v.get("flags") or {}), -severity(v)))
