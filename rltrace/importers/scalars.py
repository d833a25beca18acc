"""The long table every metric-log reader returns: (step, name, value, logged time), plus what it left out.

Held as numpy columns with names as codes into a short list of distinct names: a long run logs
millions of values under a few hundred names, and nothing here may cost Python work per value on
the common path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rltrace._config import RltraceError
from rltrace.store.imports import Refused

#: What a reader leaves out, as drop-count tables (`rltrace info`): a whole line / record, or one value.
RECORDS, VALUES = "metric log records", "metric log values"
MAX_TIME_S = 9.2e9  # a logged time (Unix seconds) past this does not fit int64 nanoseconds (year 2262)


class MetricsImportError(RltraceError):
    """A metrics log that cannot be read (the message names the file)."""


def _none(dtype) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class Scalars:
    """Columns of the long table, plus what was left out and why. `code` indexes `names`."""

    step: np.ndarray = field(default_factory=lambda: _none(np.int64))
    code: np.ndarray = field(default_factory=lambda: _none(np.int32))
    names: list = field(default_factory=list)  # distinct names, in order of first appearance
    value: np.ndarray = field(default_factory=lambda: _none(np.float64))
    time_s: np.ndarray = field(default_factory=lambda: _none(np.float64))  # Unix seconds when logged; NaN: not known
    refused: Refused = field(default_factory=Refused)  # what was left out: file, position, reason

    @classmethod
    def from_lists(cls, steps: list, names: list, values: list, times: list, refused: Refused | None = None) -> "Scalars":
        """From one Python list per column (`times`: None where not known): the record-by-record readers."""
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int32, len(names))
        return cls(np.asarray(steps, np.int64).reshape(-1), codes, list(index), np.asarray(values, np.float64).reshape(-1),
                   np.array([np.nan if t is None else t for t in times], np.float64).reshape(-1), refused or Refused())

    @classmethod
    def concat(cls, parts: list["Scalars"]) -> "Scalars":
        """One table from several (files), names merged in order of first appearance."""
        index: dict[str, int] = {}
        codes = []
        for p in parts:
            lut = np.array([index.setdefault(n, len(index)) for n in p.names] or [0], np.int32)
            codes.append(lut[p.code])
        refused = Refused()
        for p in parts:
            refused.update(p.refused)
        if not parts:
            return cls()
        return cls(np.concatenate([p.step for p in parts]), np.concatenate(codes), list(index),
                   np.concatenate([p.value for p in parts]), np.concatenate([p.time_s for p in parts]), refused)

    def take(self, keep: np.ndarray) -> "Scalars":
        """The rows where `keep` holds (names and what was left out stay)."""
        return Scalars(self.step[keep], self.code[keep], self.names, self.value[keep], self.time_s[keep], self.refused)

    def skipped(self) -> Counter:
        """reason -> how many things were left out for it (over every file)."""
        out: Counter = Counter()
        for r in self.refused.records():
            out[r["reason"]] += r["count"]
        return out

    def __len__(self) -> int:
        return len(self.value)


def bad_times(times: np.ndarray) -> np.ndarray:
    """Which logged times (Unix seconds, NaN: none logged) are not times rltrace can store."""
    return ~np.isnan(times) & ~(np.abs(times) <= MAX_TIME_S)


def time_reason(value: float) -> str:
    return f"logged time {value!r} is not a time in seconds since 1970 (the values are kept without it)"
