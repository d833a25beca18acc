"""JSON that every reader accepts, for everything rltrace writes as JSON for others to read.

Python's `json` writes NaN and infinities as bare `NaN`/`Infinity`, which is not JSON: browsers,
Perfetto and `jq` refuse the whole file. Here they become `null`; with `keep_text=True` the
original survives beside it as a string (`"loss": null, "loss.text": "NaN"`), so a trace still
shows that a value was NaN rather than missing.
"""

from __future__ import annotations

import json
import math
from typing import Any

TEXT_SUFFIX = ".text"  # key of the original spelling of a non-finite number (with keep_text)


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _spelling(value: float) -> str:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def strict(value: Any, *, keep_text: bool = False) -> Any:
    """A copy of `value` (dicts, lists, tuples, scalars) with every NaN/inf float replaced by None."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out[k] = strict(v, keep_text=keep_text)
            if keep_text and not _finite(v):
                out[f"{k}{TEXT_SUFFIX}"] = _spelling(v)
        return out
    if isinstance(value, (list, tuple)):
        return [strict(v, keep_text=keep_text) for v in value]
    return value if _finite(value) else None


def dumps(value: Any, *, keep_text: bool = False, **kwargs) -> str:
    """`json.dumps` that never writes NaN/Infinity (see `strict`); other objects via `default` as usual."""
    try:  # most values hold no NaN: written as they are, without first copying them whole
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    return json.dumps(strict(value, keep_text=keep_text), allow_nan=False, **kwargs)
