"""Vectorised interval arithmetic on int64 nanoseconds, grouped by an integer key.

Why numpy and not SQL: unions, gaps and overlaps over millions of spans are sorts plus
cumulative maxima; DuckDB's window functions took seconds for the same work when this was measured.
Every function takes parallel arrays (`group`, `start`, `end`) and returns disjoint, sorted ones.
"""

from __future__ import annotations

import numpy as np

_I64 = np.int64
_LIMIT = 2**62


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, _I64), np.empty(0, _I64), np.empty(0, _I64)


def _band_keys(group: np.ndarray, *times: np.ndarray) -> tuple[np.ndarray, ...]:
    """Map (group, time) to one sortable int64 key: group g occupies its own band of width `span`.

    When groups times the time range would not fit in int64 (many groups over a long run), the
    times are replaced by their ranks among all times given: order and ties are kept, which is
    all the keys are used for (lengths are always taken from the times themselves).
    """
    if len(group) == 0:
        return tuple(np.asarray(t, _I64) for t in times)
    lo = min(int(t.min()) for t in times)
    width = max(int(t.max()) for t in times) - lo + 1
    codes = np.asarray(group, _I64)
    if int(codes.min()) < 0:
        raise ValueError("interval groups must be >= 0")
    if (int(codes.max()) + 1) * width >= _LIMIT:
        values = np.unique(np.concatenate([np.asarray(t, _I64) for t in times]))
        if (int(codes.max()) + 1) * (len(values) + 1) >= _LIMIT:
            raise ValueError("interval keys overflow: analyse fewer steps at once")
        return tuple(codes * (len(values) + 1) + np.searchsorted(values, np.asarray(t, _I64)) for t in times)
    return tuple(codes * width + (np.asarray(t, _I64) - lo) for t in times)


def union(group, start, end) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge overlapping or touching intervals within each group (groups are ints >= 0)."""
    group, start, end = np.asarray(group, _I64), np.asarray(start, _I64), np.asarray(end, _I64)
    if len(group) == 0:
        return _empty()
    if len(start) < 2 or bool(np.all(start[1:] >= start[:-1])):
        # already by start (spans are loaded so): a stable sort of the small group codes keeps
        # that order within each group, and numpy sorts 16-bit keys by radix, in linear time
        small = group.astype(np.uint16) if int(group.max()) < 2**16 else group
        order = np.argsort(small, kind="stable")
    else:
        order = np.argsort(_band_keys(group, start)[0], kind="stable")  # one int64 key beats a lexsort
    g, s, e = group[order], start[order], end[order]
    ks, ke = _band_keys(g, s, e)  # banded: one cumulative maximum never reaches into the next group
    reach = np.maximum.accumulate(ke)
    opens = np.ones(len(g), bool)
    opens[1:] = ks[1:] > reach[:-1]
    opens[1:] |= g[1:] != g[:-1]
    first = np.flatnonzero(opens)
    return g[first], s[first], np.maximum.reduceat(e, first)


def total(group, start, end, n_groups: int) -> np.ndarray:
    """Length (ns) of the union of each group's intervals, for groups 0..n_groups-1."""
    g, s, e = union(group, start, end)
    return np.bincount(g, weights=(e - s).astype(np.float64), minlength=n_groups).astype(_I64)


def complement(group, start, end, lo, hi, ordered: bool = True):
    """Per group, the parts of [lo[g], hi[g]) not covered by the group's intervals.

    `lo`/`hi` are arrays indexed by group code; groups with no interval are wholly uncovered.
    With `ordered=False` the pieces come in no particular order (saves a sort of all of them).
    """
    g, s, e = union(group, start, end)
    lo, hi = np.asarray(lo, _I64), np.asarray(hi, _I64)
    n = len(lo)
    # gaps before each merged interval, between them, and after the last one of its group
    first = np.ones(len(g), bool)
    first[1:] = g[1:] != g[:-1]
    last = np.ones(len(g), bool)
    last[:-1] = g[1:] != g[:-1]
    prev_end = np.empty(len(g), _I64)
    prev_end[1:] = e[:-1]
    prev_end[first] = lo[g[first]]
    gaps = [(g, prev_end, s), (g[last], e[last], hi[g[last]])]
    uncovered = np.ones(n, bool)
    uncovered[g] = False  # (a mask: setdiff1d hashes every group code, seconds at millions of spans)
    bare = np.flatnonzero(uncovered).astype(_I64)
    gaps.append((bare, lo[bare], hi[bare]))
    cg = np.concatenate([x[0] for x in gaps])
    cs = np.concatenate([x[1] for x in gaps])
    ce = np.concatenate([x[2] for x in gaps])
    cs = np.maximum(cs, lo[cg])
    ce = np.minimum(ce, hi[cg])
    keep = ce > cs
    if not ordered:
        return cg[keep], cs[keep], ce[keep]
    order = np.lexsort((cs[keep], cg[keep]))
    return cg[keep][order], cs[keep][order], ce[keep][order]


class Coverage:
    """Answers "how long is [a, b) covered by group g's union" for many queries at once."""

    def __init__(self, group, start, end):
        self.g, self.s, self.e = union(group, start, end)
        lengths = self.e - self.s
        self.before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(_I64) if len(lengths) else lengths
        # covered ns of the group's earlier intervals = before - before at the group's first interval
        first = np.ones(len(self.g), bool)
        first[1:] = self.g[1:] != self.g[:-1]
        self._group_start = self.before[first][np.cumsum(first) - 1] if len(self.g) else self.before

    def between(self, group, a, b) -> np.ndarray:
        """Covered ns of [a[i], b[i]) by group[i]'s union."""
        group, a, b = np.asarray(group, _I64), np.asarray(a, _I64), np.asarray(b, _I64)
        if len(self.g) == 0 or len(group) == 0:
            return np.zeros(len(group), _I64)
        keys = _band_keys(
            np.concatenate([self.g, group]),
            np.concatenate([self.s, a]),
            np.concatenate([self.e, b]),
        )
        n = len(self.g)
        ks, qa, qb = keys[0][:n], keys[0][n:], keys[1][n:]
        return self._upto(ks, qb, group, b) - self._upto(ks, qa, group, a)

    def _upto(self, ks, key, group, t) -> np.ndarray:
        """Covered ns of each query's group from its start up to time t (key: (group, t) as a key)."""
        i = np.searchsorted(ks, key, side="right") - 1
        safe = np.maximum(i, 0)
        mine = (i >= 0) & (self.g[safe] == group)
        inside = np.clip(t - self.s[safe], 0, self.e[safe] - self.s[safe])
        before = self.before[safe] - self._group_start[safe]
        return np.where(mine, before + inside, 0)


def ranges(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """lo[0] .. lo[0]+counts[0]-1, then lo[1] .. : consecutive index ranges, concatenated."""
    counts = np.asarray(counts, _I64)
    return np.repeat(np.asarray(lo, _I64) - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()), dtype=_I64)


def clip(group, start, end, win_group, win_start, win_end):
    """Intersections of intervals with windows of the same group.

    Intervals must be disjoint and sorted within each group (as `union`/`complement` return).
    Returns (window index, start, end) for every non-empty intersection.
    """
    return clip_within(group, start, end, win_group, win_start, win_end, None)[:3]


def clip_within(group, start, end, win_group, win_start, win_end, limit: int | None):
    """`clip`, leaving out the windows that cross the most intervals until at most `limit`
    intersections remain: windows that each span most of a run (the same step numbers recorded
    again much later) would cost time and memory quadratic in the run. Returns (window index,
    start, end, indices of the windows left out)."""
    group, start, end = np.asarray(group, _I64), np.asarray(start, _I64), np.asarray(end, _I64)
    win_group, win_start, win_end = (np.asarray(x, _I64) for x in (win_group, win_start, win_end))
    if len(group) == 0 or len(win_group) == 0:
        return np.empty(0, _I64), np.empty(0, _I64), np.empty(0, _I64), np.empty(0, _I64)
    keys = _band_keys(
        np.concatenate([group, win_group]),
        np.concatenate([start, win_start]),
        np.concatenate([end, win_end]),
    )
    n = len(group)
    ks, ke, ws, we = keys[0][:n], keys[1][:n], keys[0][n:], keys[1][n:]
    first = np.searchsorted(ke, ws, side="right")  # first interval ending after the window starts
    stop = np.searchsorted(ks, we, side="left")  # intervals starting before the window ends
    counts = np.maximum(stop - first, 0)
    left_out = np.empty(0, _I64)
    if limit is not None and int(counts.sum()) > limit:
        order = np.argsort(counts, kind="stable")  # narrowest first
        left_out = np.sort(order[np.cumsum(counts[order]) > limit])
        counts[left_out] = 0
    win = np.repeat(np.arange(len(win_group), dtype=_I64), counts)
    idx = ranges(first, counts)
    s = np.maximum(start[idx], win_start[win])
    e = np.minimum(end[idx], win_end[win])
    keep = e > s
    return win[keep], s[keep], e[keep], left_out
