"""Per-group reductions without a Python loop per group (a step's samples, a step's requests).

Rows come sorted by group. Groups of one size are stacked into a 2-D block and reduced along its
rows, which is the arithmetic numpy applies to each group alone (the same pairwise sums): the
numbers equal those of a loop calling `np.mean`, `np.median`, `Series.sum`, ... on every group,
bit for bit, while the Python work grows with the number of distinct group sizes, not of groups.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

Reduce = Callable[[np.ndarray], np.ndarray]  # 2-D block, one group a row -> one value a row

#: slime's `compute_statistics` (mean, median, max, min) on blocks
STATS: dict[str, Reduce] = {
    "mean": lambda b: np.mean(b, axis=1),
    "median": lambda b: np.median(b, axis=1),
    "max": lambda b: np.max(b, axis=1),
    "min": lambda b: np.min(b, axis=1),
}


def codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted `keys`: each row's group number (0, 1, ...) and each group's key."""
    if not len(keys):
        return np.zeros(0, np.int64), keys[:0]
    new = np.ones(len(keys), bool)
    new[1:] = keys[1:] != keys[:-1]
    return np.cumsum(new) - 1, keys[new]


def reduce(values: np.ndarray, group: np.ndarray, n: int, how: dict[str, Reduce],
           keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each reduction of `how` per group (rows where `keep`, all rows without it); NaN for a group
    with no row. `group` holds each row's group number in 0..n-1, ascending."""
    if keep is not None:
        values, group = values[keep], group[keep]
    sizes = np.bincount(group, minlength=n)
    first = np.cumsum(sizes) - sizes
    out = {name: np.full(n, np.nan) for name in how}
    for k in np.unique(sizes[sizes > 0]):
        which = np.flatnonzero(sizes == k)
        block = values[first[which, None] + np.arange(k)]
        for name, fn in how.items():
            out[name][which] = fn(block)
    return out


def counts(group: np.ndarray, n: int, keep: np.ndarray | None = None) -> np.ndarray:
    """Rows per group (where `keep`)."""
    return np.bincount(group if keep is None else group[keep], minlength=n)


def any_per(group: np.ndarray, n: int, flags: np.ndarray) -> np.ndarray:
    """Whether any row of each group has the flag."""
    return counts(group, n, flags) > 0


def column(values: np.ndarray, present: np.ndarray) -> pd.Series | np.ndarray:
    """A column of per-group numbers, None where `present` is false, typed as pandas types a list of
    records holding them (a float column with NaN; only Nones: an object column)."""
    if present.all():
        return values
    if not present.any():
        return pd.Series([None] * len(values), dtype=object)
    return np.where(present, values, np.nan).astype(float)


def frame(columns: dict[str, tuple[np.ndarray | pd.Series, np.ndarray | None]]) -> pd.DataFrame:
    """The frame `pd.DataFrame(records)` would give for records holding each column's key only where
    its mask is true (None: every record): a column that no record holds is left out, and columns
    come in the order the records first hold them (the order of `columns` within a record)."""
    first = {name: 0 if mask is None else int(np.argmax(mask))
             for name, (_, mask) in columns.items() if mask is None or mask.any()}
    order = sorted(first, key=lambda name: first[name])  # stable: ties keep the order within a record
    out = {}
    for name in order:
        values, mask = columns[name]
        out[name] = values if mask is None or mask.all() else np.where(mask, values, np.nan).astype(float)
    return pd.DataFrame(out)
