"""Export a frozen batch as a slime rollout dump (`rltrace export RUN_DIR --format slime`).

The file is what slime's `--save-debug-rollout-data` writes, `{"rollout_id": step, "samples":
[Sample.to_dict(), ...]}`, so `--load-debug-rollout-data` replays it, and it holds only what
`torch.load(weights_only=True)` reads (containers, numbers, strings, tensors). A batch imported
from slime gets its original fields back (`batch_meta.slime_fields` and the `slime` column); a
batch frozen by rltrace maps its columns: prompt_tokens + response_tokens -> tokens,
finish_reason -> status, sample_id -> index, group_id -> group_index, response_text -> response,
reward_components or reward -> reward, weight_version(s) -> weight_versions (as strings).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rltrace.replay.batch import FrozenBatch, batch_parts, load
from rltrace.replay.errors import DamagedBatchError, SlimeDumpError
from rltrace.replay.slime_trace import FINISH_TO_STATUS


def _plain(value: Any) -> Any:
    """Something torch.load(weights_only=True) reads back: tensors stay, numpy becomes lists."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def _join_tokens(prompt: Any, response: Any) -> Any:
    if hasattr(prompt, "new_empty") and hasattr(response, "new_empty"):
        import torch

        return torch.cat([prompt.reshape(-1), response.reshape(-1)])
    return list(_plain(prompt) if prompt is not None else []) + list(_plain(response) if response is not None else [])


def slime_sample(row: dict[str, Any], fields: list[str] | None, index: int) -> dict[str, Any]:
    """A `Sample.to_dict()`-shaped dict from one frozen row (imported rows get their fields back exactly)."""
    extra = row.get("slime") or {}
    values = {
        "tokens": _join_tokens(row.get("prompt_tokens"), row.get("response_tokens")),
        "response_length": len(row.get("response_tokens") if row.get("response_tokens") is not None else []),
        "status": FINISH_TO_STATUS.get(row.get("finish_reason"), row.get("finish_reason") or "completed"),
        "reward": row.get("reward_components") if row.get("reward_components") is not None else row.get("reward"),
        "prompt": extra.get("prompt", row.get("prompt_text") or ""),
        "index": row.get("sample_id", index) if row.get("sample_id") is not None else index,
        "group_index": row.get("group_id"),
        "response": row.get("response_text") or "",
        "loss_mask": row.get("loss_mask"),
        "rollout_log_probs": row.get("rollout_log_probs"),
        "metadata": row.get("metadata") or {},
        "weight_versions": extra.get("weight_versions", [str(v) for v in row.get("weight_versions") or ()]
                                     or ([str(row["weight_version"])] if row.get("weight_version") is not None else [])),
    }
    if fields is None:
        return {k: _plain(v) for k, v in values.items()}
    out = {}
    for key in fields:
        if key in values:
            out[key] = values[key]
        elif key in extra:
            out[key] = extra[key]
        else:
            out[key] = row.get(key)
    for key, value in extra.items():
        out.setdefault(key, value)
    return {k: _plain(v) for k, v in out.items()}


def export_batch(batch: FrozenBatch, out: Path) -> Path:
    """Write `batch` as `{"rollout_id": step, "samples": [...]}` with torch.save (atomically)."""
    import torch

    fields = (batch.extra or {}).get("slime_fields")
    samples = [slime_sample(batch.sample(i), fields, i) for i in range(len(batch))]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        torch.save({"rollout_id": batch.step, "samples": samples}, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def export_slime(run_dir: str | Path, out: str, *, step: int | None = None, skip_corrupt: bool = False,
                 skipped: list[str] | None = None) -> list[Path]:
    """Export one batch (`step`), or every batch when `out` holds `{rollout_id}` (slime's path template).
    A damaged batch file stops the export naming it; with `skip_corrupt` it is left out and its
    "path: why" appended to `skipped`."""
    if step is not None:
        return [export_batch(load(run_dir, step), Path(out.format(rollout_id=step)))]
    skipped = [] if skipped is None else skipped
    parts, unreadable = batch_parts(run_dir, skip_corrupt=skip_corrupt)
    skipped.extend(unreadable)
    steps = sorted({int(p.name.split("-", 1)[0]) for p in parts if p.name.split("-", 1)[0].isdigit()})
    if not steps:
        raise SlimeDumpError(f"{run_dir}: no frozen batches to export")
    if len(steps) > 1 and "{rollout_id}" not in out:
        raise SlimeDumpError(f"{run_dir} has {len(steps)} frozen steps: pass --step N, or an --out with {{rollout_id}} in it")
    written = []
    for s in steps:
        try:
            batch = load(run_dir, s)
        except DamagedBatchError as exc:
            if not skip_corrupt:
                raise
            skipped.append(str(exc))
            continue
        written.append(export_batch(batch, Path(out.format(rollout_id=s))))
    return written


def export_command(args) -> int:
    """`rltrace export RUN_DIR --format slime [--step N] --out FILE`."""
    from rich.console import Console

    from rltrace.analysis._format import term

    if not args.out:
        raise SlimeDumpError("--format slime needs --out FILE (it may hold {rollout_id}, as slime's path templates do)")
    skipped: list[str] = []
    for path in export_slime(args.run_dir, args.out, step=args.step, skip_corrupt=args.skip_corrupt, skipped=skipped):
        Console().print(f"wrote {path}")
    for why in skipped:
        Console(stderr=True).print(f"rltrace: skipping {term(why)}")
    return 0
