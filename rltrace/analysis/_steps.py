"""The `steps=` argument every analysis takes: None (all) or an inclusive (first, last) range."""

from __future__ import annotations

from typing import Optional, Tuple

from rltrace._config import RltraceError

Steps = Optional[Tuple[Optional[int], Optional[int]]]


class StepRangeError(RltraceError, ValueError):
    """A step range that cannot be read, e.g. `--steps 5:x`."""


def parse_steps(text: str | None) -> Steps:
    """`"A:B"`, `"A:"`, `":B"` or `"A"` (one step) -> an inclusive (first, last) range."""
    if text is None or text.strip() in ("", ":"):
        return None
    first, sep, last = text.partition(":")
    try:
        a = int(first) if first.strip() else None
        b = (int(last) if last.strip() else None) if sep else a
    except ValueError:
        raise StepRangeError(f"invalid step range {text!r}: use A:B, A:, :B or a single step number") from None
    if a is not None and b is not None and a > b:
        raise StepRangeError(f"invalid step range {text!r}: the first step {a} is after the last step {b}")
    return (a, b)


def step_filter(steps: Steps, column: str = "step") -> tuple[str, list]:
    """A SQL condition (with parameters) selecting the steps of a range."""
    if steps is None:
        return "true", []
    if not (isinstance(steps, tuple) and len(steps) == 2):
        raise StepRangeError(f"invalid argument steps={steps!r}: expected None or a (first, last) tuple")
    parts, params = [], []
    if steps[0] is not None:
        parts.append(f"{column} >= ?")
        params.append(int(steps[0]))
    if steps[1] is not None:
        parts.append(f"{column} <= ?")
        params.append(int(steps[1]))
    return (" AND ".join(parts) or "true"), params
