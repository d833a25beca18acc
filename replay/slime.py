"""slime's debug dumps into a run: `rltrace import slime PATH... --out RUN_DIR` (export: slime_export.py).

slime (THUDM/slime) writes, per rollout id, with `torch.save`:
  --save-debug-rollout-data  {"rollout_id": id, "samples": [Sample.to_dict(), ...]}
                             (each sample may carry a `trace` carrier: {"trace_id", "events": [...]})
  --save-debug-train-data    format_version 2: {"format_version": 2, "rollout_id", "samples": [one dict per
                             trained sample: sample_index, rollout_position, log_probs, advantages, ...],
                             "dp_shards", "raw_reward"}; older dumps: {"rollout_id", "rank", "rollout_data"}
Import makes one frozen batch per rollout id (step = rollout id), joins each train sample to its
rollout sample (train `sample_index` = rollout `index`; else `rollout_position`), and turns the
traces into spans and `samples` rows (`rltrace.replay.slime_trace`).

Dumps are pickles: they are read with torch's restricted unpickler (`weights_only=True`: containers,
numbers, strings and tensors). A dump that needs more (custom classes, images) is refused unless
the user passes `--trust-pickle`, which runs the full unpickler: only for files you trust.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rltrace import _paths
from rltrace.replay import codec
from rltrace.replay.batch import RESERVED, new_batch_id
from rltrace.replay.errors import SlimeDumpError
from rltrace.replay.safe_torch import safe_torch

STATUS_TO_FINISH = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "failed", "pending": "pending"}
FINISH_TO_STATUS = {v: k for k, v in STATUS_TO_FINISH.items()}
#: slime Sample fields stored under rltrace's names (import renames them, export renames them back)
RENAMED = {"index": "sample_id", "group_index": "group_id", "response": "response_text", "status": "finish_reason"}
#: train-dump fields that repeat the rollout sample (checked against it, not stored twice)
_TRAIN_DUPLICATES = {"tokens", "response_lengths", "loss_masks", "rollout_log_probs", "total_lengths", "sample_index", "rollout_position"}
_TRAIN_RENAMED = {"log_probs": "train_log_probs", "advantages": "advantages"}


# --- reading -----------------------------------------------------------------------------------
def read_dump(path: Path, *, trust_pickle: bool = False) -> Any:
    """torch.load with the restricted unpickler; the full one only with `trust_pickle`."""
    torch = safe_torch()  # torch <= 2.5.1: weights_only=True can be bypassed

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ... : say which file and why
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights only" not in str(exc).lower() and "weights_only" not in str(exc).lower():
            raise SlimeDumpError(f"{path}: not a readable torch.save file, truncated or damaged ({reason[:200]})") from None
        if not trust_pickle:
            found = re.search(r"GLOBAL ([\w.]+)", str(exc))
            what = f" (it needs {found.group(1)})" if found else ""
            raise SlimeDumpError(
                f"{path}: holds objects the safe loader refuses{what}; loading it would run the full pickle "
                "unpickler, which can execute code from the file: pass --trust-pickle only if you trust it"
            ) from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise SlimeDumpError(f"{path}: cannot be loaded even with --trust-pickle ({str(exc)[:200]})") from None


def dump_kind(data: Any, path: Path) -> str:
    """'rollout', 'train' or 'train_v1' (a clear error naming the missing field otherwise)."""
    if not isinstance(data, dict):
        raise SlimeDumpError(f"{path}: expected a dict with 'rollout_id' and 'samples' (a slime debug dump), got {type(data).__name__}")
    if "rollout_data" in data and "samples" not in data:
        return "train_v1"
    for key in ("rollout_id", "samples"):
        if key not in data:
            raise SlimeDumpError(f"{path}: field {key!r} is missing; not a slime debug dump")
    if not isinstance(data["samples"], list):
        raise SlimeDumpError(f"{path}: field 'samples' is {type(data['samples']).__name__}, expected a list")
    if "format_version" in data:
        if data["format_version"] != 2:
            raise SlimeDumpError(f"{path}: train dump format_version {data['format_version']!r} is not supported (only 2)")
        return "train"
    return "rollout"


def _rollout_id(data: dict, path: Path) -> int:
    value = data.get("rollout_id")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SlimeDumpError(f"{path}: field 'rollout_id' is {value!r}, expected an integer") from None


def _ints(value: Any, where: str) -> np.ndarray:
    arr = np.asarray(value.tolist() if hasattr(value, "tolist") and not isinstance(value, np.ndarray) else value)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise SlimeDumpError(f"{where}: expected a list of token ids")
    return arr.astype(np.int64)


def _split_tokens(tokens: Any, response_length: Any, where: str) -> tuple[Any, Any]:
    """slime keeps prompt + response in `tokens`; the last `response_length` are the response."""
    ids = _ints(tokens, f"{where}, field 'tokens'")
    if not isinstance(response_length, (int, np.integer)) or not 0 <= response_length <= len(ids):
        raise SlimeDumpError(f"{where}: field 'response_length' is {response_length!r}, expected 0..{len(ids)} (len(tokens))")
    cut = len(ids) - int(response_length)
    return tokens[:cut], tokens[cut:]


def rollout_row(sample: Any, where: str, drop: frozenset[str]) -> dict[str, Any]:
    """One frozen-batch row from a `Sample.to_dict()` dict; remaining fields go to the `slime` JSON column."""
    if not isinstance(sample, dict):
        raise SlimeDumpError(f"{where}: expected a dict (Sample.to_dict()), got {type(sample).__name__}")
    for key in ("tokens", "response_length", "status"):
        if key not in sample:
            raise SlimeDumpError(f"{where}: field {key!r} is missing")
    row: dict[str, Any] = {}
    row["prompt_tokens"], row["response_tokens"] = _split_tokens(sample["tokens"], sample["response_length"], where)
    status = sample["status"]
    if not isinstance(status, str):
        raise SlimeDumpError(f"{where}: field 'status' is {status!r}, expected one of {sorted(STATUS_TO_FINISH)}")
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
    return row


def _check_json(row: dict, where: str) -> None:
    for key, value in row["slime"].items():
        try:
            json.dumps(value, default=codec.json_default)
        except (TypeError, ValueError):
            raise SlimeDumpError(
                f"{where}: field {key!r} holds {type(value).__name__}, which cannot be stored; drop it with --drop-field {key}"
            ) from None


def _per_sample(value: Any, n: int) -> bool:
    if hasattr(value, "dim") and hasattr(value, "size"):
        return value.dim() >= 1 and value.size(0) == n
    return isinstance(value, (list, tuple)) and len(value) == n


def train_samples(data: dict, kind: str, path: Path) -> list[dict]:
    """The per-sample dicts of a train dump (format 2 as is; format 1 transposed like slime does)."""
    if kind == "train":
        samples = data["samples"]
    else:
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
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise SlimeDumpError(f"{path}, train sample {i}: expected a dict, got {type(sample).__name__}")
    return samples


def join_train(rows: list[dict], rollout: list[dict] | None, train: list[dict], path: Path, drop: frozenset[str]) -> list[dict]:
    """Add train fields to rollout rows: train `sample_index` = rollout `index`, else `rollout_position`."""
    if rollout is None:
        return rows + [_train_only_row(t, f"{path}, train sample {i}", drop) for i, t in enumerate(train)]
    by_index = {_int_or_none(s.get("index")): i for i, s in enumerate(rollout)}
    use_index = len(by_index) == len(rollout) and None not in by_index and all(_int_or_none(t.get("sample_index")) in by_index for t in train)
    for j, t in enumerate(train):
        where = f"{path}, train sample {j}"
        position = _int_or_none(t.get("rollout_position"))
        if use_index:
            i = by_index[_int_or_none(t["sample_index"])]
        elif position is not None and 0 <= position < len(rows):
            i = position
        else:
            raise SlimeDumpError(
                f"{where}: cannot be matched to a rollout sample: field 'sample_index' does not match a rollout "
                f"'index' and field 'rollout_position' is {t.get('rollout_position')!r}"
            )
        if "tokens" in t and not np.array_equal(_ints(t["tokens"], f"{where}, field 'tokens'"), _ints(rollout[i]["tokens"], where)):
            raise SlimeDumpError(f"{where}: field 'tokens' differs from rollout sample {i}'s; the two dumps are not of the same rollout")
        rows[i].update(_train_fields(t, drop))
    return rows


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _train_fields(t: dict, drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {_TRAIN_RENAMED.get(k, f"train_{k}"): v for k, v in t.items() if k not in _TRAIN_DUPLICATES and k not in drop}


def _train_only_row(t: dict, where: str, drop: frozenset[str]) -> dict[str, Any]:
    if "tokens" not in t or "response_lengths" not in t:
        raise SlimeDumpError(f"{where}: fields 'tokens' and 'response_lengths' are needed without a rollout dump")
    length = t["response_lengths"]
    length = int(length.item()) if hasattr(length, "item") else length
    row: dict[str, Any] = {}
    row["prompt_tokens"], row["response_tokens"] = _split_tokens(t["tokens"], length, where)
    if "loss_masks" in t:
        row["loss_mask"] = t["loss_masks"]
    if "rollout_log_probs" in t:
        row["rollout_log_probs"] = t["rollout_log_probs"]
    if "sample_index" in t and t["sample_index"] is not None:
        row["sample_id"] = _int_or_none(t["sample_index"])
    row.update(_train_fields(t, drop))
    return row


# --- import ------------------------------------------------------------------------------------
def find_dumps(paths: Iterable[str | Path]) -> list[Path]:
    """The .pt files named, and those under the directories named (slime's dump_details layout)."""
    return _paths.expand(paths, lambda p: p.suffix == ".pt", SlimeDumpError, "no .pt files")


def import_slime(
    paths: Iterable[str | Path],
    out: str | Path,
    *,
    trust_pickle: bool = False,
    drop: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Convert slime dumps into frozen batches (+ spans and samples from traces) in run dir `out`."""
    from rltrace.replay import slime_trace
    from rltrace.store import rows as store_rows
    from rltrace.replay.batch import batch_fields, build_table, write_batch
    from rltrace.store.layout import create_or_join
    from rltrace.store.writer import ProcessInfo

    drop = frozenset(drop)
    files = find_dumps(paths)
    rollouts: dict[int, tuple[Path, dict]] = {}
    trains: dict[int, list[tuple[Path, list[dict]]]] = {}
    skipped: list[str] = []
    for k, path in enumerate(files):
        if progress:
            progress("reading", k, len(files))
        if path.name.startswith("eval_"):
            skipped.append(f"{path}: evaluation dump, not a training batch")
            continue
        data = read_dump(path, trust_pickle=trust_pickle)
        kind = dump_kind(data, path)
        rid = _rollout_id(data, path)
        if kind == "rollout":
            if rid in rollouts:
                raise SlimeDumpError(f"{path}: rollout_id {rid} also comes from {rollouts[rid][0]}; import one of them")
            rollouts[rid] = (path, data)
        else:
            trains.setdefault(rid, []).append((path, train_samples(data, kind, path)))
    manifest = create_or_join(Path(out), run_name=None, config={"imported_from": "slime", "paths": [str(p) for p in files]})
    process = ProcessInfo(run_id=manifest["run_id"], role="slime-import", rank=None, service_name="rltrace-import")
    result = {"batches": [], "spans": 0, "samples": 0, "unmatched_ends": 0, "carried": 0, "skipped": skipped}
    steps = sorted(set(rollouts) | set(trains))
    starts = {rid: slime_trace.own_start(data["samples"], rid) for rid, (_, data) in rollouts.items()}
    ends = slime_trace.step_ends({rid: data["samples"] for rid, (_, data) in rollouts.items()}, starts)
    drops = store_rows.Drops()
    for k, rid in enumerate(steps):
        if progress:
            progress("converting", k, len(steps))
        sources = ([rollouts[rid][0]] if rid in rollouts else []) + [p for p, _ in trains.get(rid, [])]
        rollout = rollouts[rid][1]["samples"] if rid in rollouts else None
        rows = [rollout_row(s, f"{rollouts[rid][0]}, sample {i}", drop) for i, s in enumerate(rollout)] if rollout else []
        for i, row in enumerate(rows):
            _check_json(row, f"{rollouts[rid][0]}, sample {i}")
        for path, samples in trains.get(rid, []):
            rows = join_train(rows, rollout, samples, path, drop)
        meta = {"source": "slime", "files": [str(p) for p in sources]}
        if rollout:
            meta["slime_fields"] = list(dict.fromkeys(k for s in rollout if isinstance(s, dict) for k in s if k not in drop))
        batch_id = new_batch_id()
        try:
            table = build_table(rid, batch_id, "rows", rows, len(rows), fields=batch_fields(meta), trigger="import",
                                reason="slime " + ", ".join(f"{p.parent.name}/{p.name}" for p in sources), frozen_ns=time.time_ns(), process=process)
        except (TypeError, ValueError) as exc:
            raise SlimeDumpError(f"{sources[0]}: {exc}; drop the field with --drop-field NAME") from None
        write_batch(Path(out), table, rid, batch_id)
        if rollout:
            counts = slime_trace.write(Path(out), rid, rollout, process, starts, ends=ends)
            for key in ("spans", "samples", "unmatched_ends", "carried"):
                result[key] += counts[key]
            for record in counts["drops"].records():
                drops.add(record["table"], record["count"], record["reason"], record.get("column"))
        result["batches"].append({"step": rid, "batch_id": batch_id, "samples": len(rows), "files": [str(p) for p in sources]})
    slime_trace.write_process(Path(out), process, manifest["run_id"], rows=result["samples"], spans=result["spans"], drops=drops)
    return result


def import_command(args) -> int:
    """`rltrace import slime PATH... --out RUN_DIR`."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console()
    with Progress(console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage} slime dumps", total=total)
            bar.update(tasks[stage], completed=done + 1)

        result = import_slime(args.paths, args.out, trust_pickle=args.trust_pickle, drop=args.drop_field, progress=progress)
    for b in result["batches"]:
        console.print(f"step {b['step']}: {b['samples']} samples from {', '.join(b['files'])}")
    console.print(f"{len(result['batches'])} batches, {result['samples']} sample rows and {result['spans']} spans from traces -> {args.out}")
    if result["carried"]:
        console.print(f"{result['carried']} sample(s) of a partial rollout also ran in an earlier step: "
                      "a row there too (in_batch false), with the spans that ran then")
    if result["unmatched_ends"]:
        console.print(f"[yellow]{result['unmatched_ends']} span end(s) without a start[/] kept as zero-length spans marked slime.unmatched_end")
    for s in result["skipped"]:
        console.print(f"[yellow]skipped[/] {s}")
    return 0
