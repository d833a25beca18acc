"""Robust line fits: a few stalls or outliers move neither the slope nor the intercept."""

from __future__ import annotations

import numpy as np

MAX_POINTS = 2000  # more points than this: Theil–Sen on this many evenly spaced ones (pairs grow as n²)


def theil_sen(x, y) -> tuple[float, float]:
    """(slope, intercept): the median of the pairwise slopes, and the median of y - slope·x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) > MAX_POINTS:
        pick = np.linspace(0, len(x) - 1, MAX_POINTS).round().astype(np.int64)
        xs, ys = x[pick], y[pick]
    else:
        xs, ys = x, y
    i, j = np.triu_indices(len(xs), k=1)
    dx = xs[j] - xs[i]
    ok = dx != 0
    slope = float(np.median((ys[j] - ys[i])[ok] / dx[ok])) if ok.any() else 0.0
    return slope, float(np.median(y - slope * x)) if len(y) else 0.0
