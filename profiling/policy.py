"""When to profile: a `ProfilePolicy`, given to `rltrace.init(profile=...)` or read from `RLTRACE_*`.

Each field resolves like every rltrace setting: the value given > its environment variable >
its default (`rltrace._config.PARAMS` declares them). A dict with the same keys works too:

    rltrace.init("runs/exp1", profile={"slow": 3, "hang_timeout": 300, "torch": ["train:5-7"]})
"""

from __future__ import annotations

import operator
import os
import shutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from rltrace._config import PARAMS, RltraceConfigError, _parse_thresholds, _parse_windows, resolve

PYSPY_FLAGS = ("subprocesses", "native", "idle")


@dataclass(frozen=True)
class TorchWindow:
    """Trace each run of `phase` at steps `first..last` (inclusive) with torch.profiler."""

    phase: str
    first: int
    last: int | None = None

    def covers(self, phase: str, step: int | None) -> bool:
        last = self.first if self.last is None else self.last
        return phase == self.phase and step is not None and self.first <= step <= last

    def __str__(self) -> str:
        return f"{self.phase}:{self.first}" + ("" if self.last in (None, self.first) else f"-{self.last}")


@dataclass(frozen=True)
class ProfilePolicy:
    """What to profile. Fields left None fall back to the environment variable, then the default.

    Attributes:
        slow: profile (py-spy record) a phase running longer than `slow` x its rolling median
            (RLTRACE_PROFILE_SLOW), once it has `min_samples` finished runs.
        after: profile a phase running longer than this many seconds; a number for every phase
            or {"reward": 2, "train": 30} (RLTRACE_PROFILE_AFTER).
        hang_timeout: dump the stacks of the process and its children when a phase stays open
            this many seconds (RLTRACE_HANG_TIMEOUT).
        torch: torch.profiler windows, e.g. ["train:5-7"] or [TorchWindow("train", 5, 7)]
            (RLTRACE_TORCH_PROFILE).
        phases: only these phases trigger the slow/after rules (RLTRACE_PROFILE_PHASES).
        min_samples, min_seconds: a phase is slow only after `min_samples` runs and `min_seconds`.
        max_seconds: cap on one py-spy recording; max_profiles: cap on profiles per process.
        pyspy: the py-spy executable; rate: samples per second; pyspy_flags: any of
            subprocesses, native (idle threads are always sampled in recordings).
        torch_rank0_only: torch windows on rank 0 only; record_shapes, with_stack: passed to
            torch.profiler (off: they make traces much larger).
    """

    slow: float | None = None
    after: float | Mapping[str, float] | None = None
    hang_timeout: float | None = None
    torch: tuple[TorchWindow | str, ...] | list | str | None = None
    phases: tuple[str, ...] | list | str | None = None
    min_samples: int | None = None
    min_seconds: float | None = None
    max_seconds: float | None = None
    max_profiles: int | None = None
    pyspy: str | None = None
    rate: int | None = None
    pyspy_flags: tuple[str, ...] | list | str | None = None
    torch_rank0_only: bool | None = None
    record_shapes: bool = False
    with_stack: bool = False

    @property
    def armed(self) -> bool:
        """Whether anything can trigger (a resolved policy with no rule needs no watchdog)."""
        return bool(self.slow or self.after or self.hang_timeout or self.torch)

    def thresholds(self) -> Mapping[str, float]:
        return self.after or {}


#: ProfilePolicy field -> the setting in rltrace._config.PARAMS it falls back to.
_PARAM_OF = {
    "slow": "profile_slow",
    "after": "profile_after",
    "hang_timeout": "hang_timeout",
    "torch": "torch_profile",
    "phases": "profile_phases",
    "min_samples": "profile_min_samples",
    "min_seconds": "profile_min_seconds",
    "max_seconds": "profile_max_seconds",
    "max_profiles": "profile_max_count",
    "pyspy": "pyspy",
    "rate": "pyspy_rate",
    "pyspy_flags": "pyspy_flags",
    "torch_rank0_only": "torch_rank0_only",
}


def resolve_policy(profile: ProfilePolicy | Mapping[str, Any] | bool | None) -> ProfilePolicy:
    """A policy with every field resolved and checked; raises `RltraceConfigError` naming the field."""
    if profile is None or profile is True:
        given: Mapping[str, Any] = {}
    elif isinstance(profile, ProfilePolicy):
        given = {f.name: getattr(profile, f.name) for f in fields(ProfilePolicy)}
    elif isinstance(profile, Mapping):
        unknown = sorted(set(profile) - {f.name for f in fields(ProfilePolicy)})
        if unknown:
            valid = ", ".join(f.name for f in fields(ProfilePolicy))
            raise RltraceConfigError(f"profile={{...}} has unknown key(s) {unknown}; valid keys: {valid}")
        given = profile
    else:
        raise RltraceConfigError(
            f"profile must be a rltrace.profiling.ProfilePolicy, a dict or False, got {type(profile).__name__}"
        )
    values: dict[str, Any] = {}
    for f in fields(ProfilePolicy):
        value = given.get(f.name)
        if f.name in _PARAM_OF:
            try:
                values[f.name] = _check(f.name, resolve(_PARAM_OF[f.name], value))
            except (TypeError, ValueError) as exc:
                if isinstance(exc, RltraceConfigError):
                    raise
                raise RltraceConfigError(f"profile {f.name}={value!r} is invalid: {exc} ({_doc(f.name)})") from None
        else:
            values[f.name] = bool(value) if value is not None else f.default
    return ProfilePolicy(**values)


def _doc(name: str) -> str:
    return PARAMS[_PARAM_OF[name]].doc


def _positive(value: Any) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("must be > 0")
    return number


def _positive_int(value: Any) -> int:
    number = operator.index(value)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


def _names_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    return tuple(str(v).strip() for v in value if str(v).strip())


def _check(name: str, value: Any) -> Any:
    """Normalise one resolved value (strings from dicts are parsed like environment variables)."""
    if value is None:
        return None
    if name in ("slow", "hang_timeout", "min_seconds", "max_seconds"):
        return _positive(value)
    if name in ("min_samples", "max_profiles", "rate"):
        return _positive_int(value)
    if name == "after":
        if isinstance(value, str):
            return _parse_thresholds(value)
        if isinstance(value, Mapping):
            return {str(k): _positive(v) for k, v in value.items()}
        return {"*": _positive(value)}
    if name == "torch":
        items = [value] if isinstance(value, (str, TorchWindow)) else list(value)
        windows = []
        for item in items:
            if isinstance(item, TorchWindow):
                windows.append(item)
            elif isinstance(item, tuple):
                windows.append(TorchWindow(*item))
            else:
                windows.extend(TorchWindow(*w) for w in _parse_windows(str(item)))
        return tuple(windows)
    if name == "phases":
        return _names_of(value) or None
    if name == "pyspy_flags":
        flags = _names_of(value)
        bad = [f for f in flags if f not in PYSPY_FLAGS]
        if bad:
            raise ValueError(f"unknown py-spy flag(s) {bad}; choose from {', '.join(PYSPY_FLAGS)}")
        return flags
    if name == "torch_rank0_only":
        return bool(value)
    return value


def pyspy_executable(setting: str | None) -> str:
    """The py-spy to run: the setting, else `py-spy` on PATH, else the one beside this python."""
    if setting:
        return setting
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else "py-spy"
