"""Compare two sets of per-sample results: recorded vs replayed, or one entry point vs another.

Two questions are kept apart on purpose: *repeatable* (the same entry twice gives the
same bits) says nothing about *aligned* (two implementations give the same numbers);
`repeatable(p) and repeatable(q)` does not imply `p == q`. `repeatability` tests the first,
`compare_columns` measures the second.

Log-prob columns (a name holding `log_prob`) are compared on response tokens where `loss_mask`
is set, up to the shorter of the two (a length mismatch makes the sample differ); other array
columns element by element; `k3` is `mean(exp(r) - 1 - r)` with `r = b - a` (for a = rollout
log-probs q, b = recomputed p: the k3 estimate of KL(q || p)), and mean |b - a| is the
`train_rollout_logprob_abs_diff` (mean |log p − log q| over response tokens). Alignment gate: mean |b - a| < 1e-6.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rltrace.replay.errors import ReplayError

ALIGNMENT_GATE = 1e-6
#: recorded column each replayed column is compared with by default (same name otherwise)
DEFAULT_PAIRS = {"log_probs": ("rollout_log_probs", "train_log_probs"), "reward": ("reward",)}


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def rows_of(column: Any, n: int) -> list[Any]:
    """One value per sample from a column in any layout (a [B, ...] tensor/array, or a list)."""
    if _is_tensor(column) or isinstance(column, np.ndarray):
        return [column[i] for i in range(n)]
    return list(column)


def as_float64(value: Any) -> np.ndarray | None:
    """A value's numbers as a flat float64 array (exact for every float dtype), None for None."""
    if value is None:
        return None
    if _is_tensor(value):
        import torch

        return value.detach().cpu().to(torch.float64).reshape(-1).numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        return None
    return arr.astype(np.float64).reshape(-1)


def bits(value: Any) -> bytes:
    """The exact identity of a value: dtype, shape and every bit (NaN equals itself, -0.0 != 0.0)."""
    if _is_tensor(value):
        import torch

        t = value.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return f"torch:{t.dtype}:{tuple(t.shape)}:".encode() + raw
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.ascontiguousarray(value)
        return f"numpy:{arr.dtype.str}:{arr.shape}:".encode() + arr.tobytes()
    if isinstance(value, float):
        return b"float:" + struct.pack("<d", value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, bool)) for v in value):
        return b"list:" + b",".join(bits(v) if isinstance(v, float) else repr(v).encode() for v in value)
    return b"json:" + json.dumps(value, sort_keys=True, default=str).encode()


@dataclass
class ColumnDiff:
    """How column `b` differs from column `a` (values as `b - a`)."""

    a: str
    b: str
    per_token: bool
    samples: int = 0  # samples where both have a value
    tokens: int = 0  # values compared (per-token columns: masked response tokens)
    bitwise_equal: bool = True  # every sample identical in dtype, shape and bits
    samples_different: int = 0
    length_mismatch: list[int] = field(default_factory=list)
    nan_mismatch: int = 0  # values where exactly one side is NaN
    mean_abs: float = 0.0
    max_abs: float = 0.0
    mean: float = 0.0  # signed mean of b - a
    k3: float | None = None  # per-token log-probs only
    top_samples: list[dict] = field(default_factory=list)
    top_tokens: list[dict] = field(default_factory=list)

    @property
    def aligned(self) -> bool:
        """Within the alignment gate (mean |b - a| < 1e-6, no NaN or length mismatches)."""
        return self.mean_abs < ALIGNMENT_GATE and not self.nan_mismatch and not self.length_mismatch

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["aligned"] = self.aligned
        return d


def compare_columns(
    a_name: str,
    a: Any,
    b_name: str,
    b: Any,
    n: int,
    *,
    mask: Any = None,
    tokens: Any = None,
    logprob: bool = False,
    top: int = 5,
) -> ColumnDiff:
    """Compare two columns of `n` samples (see the module docstring)."""
    a_rows, b_rows = rows_of(a, n), rows_of(b, n)
    mask_rows = rows_of(mask, n) if mask is not None else [None] * n
    token_rows = rows_of(tokens, n) if tokens is not None else [None] * n
    first = next((v for v in b_rows if v is not None), None)
    per_token = first is not None and np.size(as_float64(first)) != 1 or logprob
    out = ColumnDiff(a_name, b_name, per_token)
    abs_sum = signed_sum = k3_sum = 0.0
    per_sample, worst_tokens = [], []
    for i in range(n):
        va, vb = a_rows[i], b_rows[i]
        if va is None or vb is None:
            continue
        out.samples += 1
        if bits(va) != bits(vb):
            out.bitwise_equal = False
        fa, fb = as_float64(va), as_float64(vb)
        if fa is None or fb is None:
            continue
        length_differs = per_token and len(fa) != len(fb)
        if per_token:
            m = min(len(fa), len(fb))
            if length_differs:
                out.length_mismatch.append(i)
            keep = np.ones(m, dtype=bool)
            mk = as_float64(mask_rows[i])
            if mk is not None:
                keep[: min(m, len(mk))] &= mk[:m] != 0
            idx = np.flatnonzero(keep)
            fa, fb = fa[idx], fb[idx]
        else:
            idx = np.zeros(1, dtype=np.int64)
        one_nan = np.isnan(fa) != np.isnan(fb)
        out.nan_mismatch += int(one_nan.sum())
        d = fb - fa
        d[np.isnan(fa) & np.isnan(fb)] = 0.0
        d[one_nan] = 0.0
        ad = np.abs(d)
        out.tokens += len(d)
        abs_sum += float(ad.sum())
        signed_sum += float(d.sum())
        if logprob and len(d):
            k3_sum += float(np.sum(np.expm1(d) - d))
        if length_differs or (ad.size and (ad.max() > 0 or one_nan.any())):
            out.samples_different += 1
        if ad.size:
            out.max_abs = max(out.max_abs, float(ad.max()))
            per_sample.append((float(ad.max()), float(ad.mean()), i, float(fa[0]) if not per_token else None, float(fb[0]) if not per_token else None))
            if per_token and ad.max() > 0:
                j = int(np.argmax(ad))
                tok = as_float64(token_rows[i])
                pos = int(idx[j])
                worst_tokens.append(
                    {
                        "sample_index": i,
                        "position": pos,
                        "token_id": int(tok[pos]) if tok is not None and pos < len(tok) else None,
                        "a": float(fa[j]),
                        "b": float(fb[j]),
                        "abs_diff": float(ad[j]),
                    }
                )
    if out.tokens:
        out.mean_abs = abs_sum / out.tokens
        out.mean = signed_sum / out.tokens
        out.k3 = k3_sum / out.tokens if logprob else None
    per_sample.sort(reverse=True)
    out.top_samples = [
        {"sample_index": i, "max_abs": mx, "mean_abs": mean, **({"a": fa, "b": fb} if fa is not None else {})}
        for mx, mean, i, fa, fb in per_sample[:top]
        if mx > 0
    ]
    out.top_tokens = sorted(worst_tokens, key=lambda t: -t["abs_diff"])[:top]
    return out


def pairs_for(recorded: Sequence[str], replayed: Sequence[str], explicit: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(recorded column, replayed column) pairs to compare: explicit ones, else the defaults."""
    if explicit:
        return [(rec, rep) for rep, rec in explicit.items()]
    out = []
    for rep in replayed:
        candidates = DEFAULT_PAIRS.get(rep, (rep,))
        out.extend((rec, rep) for rec in candidates if rec in recorded)
    return out


def _require(columns: Sequence[str], name: str, where: str) -> None:
    if name not in columns:
        raise ReplayError(f"{where} has no column {name!r} (its columns: {', '.join(columns) or 'none'})")


def _compare(batch, a_name: str, a: Any, b_name: str, b: Any, top: int) -> ColumnDiff:
    logprob = "log_prob" in a_name or "log_prob" in b_name  # aligned with response tokens: masked, token ids shown
    mask, tokens = (batch.get("loss_mask"), batch.get("response_tokens")) if logprob else (None, None)
    return compare_columns(a_name, a, b_name, b, len(batch), mask=mask, tokens=tokens, logprob=logprob, top=top)


def diff_against_record(batch, replay, *, pairs: Mapping[str, str] | None = None, top: int = 5) -> list[ColumnDiff]:
    """Recorded (a) vs replayed (b), for every matching pair of columns. An explicit pair
    ({replayed: recorded}) naming a column that is not there is a `ReplayError` listing the columns."""
    for rep, rec in (pairs or {}).items():
        _require(replay.columns, rep, f"replay {replay.replay_id} ({replay.label})")
        _require(batch.columns, rec, f"the frozen batch {batch.path.name}")
    return [_compare(batch, rec, batch[rec], rep, replay[rep], top) for rec, rep in pairs_for(batch.columns, replay.columns, pairs)]


def diff_recorded(batch, pairs: Sequence[tuple[str, str]], *, top: int = 5) -> list[ColumnDiff]:
    """Two recorded columns of one batch, (a, b) per pair: e.g. `rollout_log_probs` (log q) against
    `train_log_probs` (log p), the mismatch the trainer saw, with no replay needed."""
    for a, b in pairs:
        _require(batch.columns, a, f"the frozen batch {batch.path.name}")
        _require(batch.columns, b, f"the frozen batch {batch.path.name}")
    return [_compare(batch, a, batch[a], b, batch[b], top) for a, b in pairs]


def diff_replays(a, b, batch=None, *, top: int = 5) -> list[ColumnDiff]:
    """Two replays of the same batch (a vs b), column by column: alignment, or repeatability."""
    n = len(a)
    out = []
    for c in (c for c in a.columns if c in b.columns):
        logprob = "log_prob" in c
        mask, tokens = (batch.get("loss_mask"), batch.get("response_tokens")) if logprob and batch is not None else (None, None)
        out.append(compare_columns(c, a[c], c, b[c], n, mask=mask, tokens=tokens, logprob=logprob, top=top))
    return out


def repeatability(repeats: Sequence[Any]) -> dict[str, bool] | None:
    """Per column: were all repeats bitwise identical? None with fewer than two repeats."""
    if len(repeats) < 2:
        return None
    first = repeats[0]
    n = len(first)
    out = {}
    for column in first.columns:
        ref = [bits(v) for v in rows_of(first[column], n)]
        out[column] = all(
            column in other.columns and [bits(v) for v in rows_of(other[column], n)] == ref for other in repeats[1:]
        )
    return out
