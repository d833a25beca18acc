"""Numbers as a person reads them in a sentence or a table: `231 µs`, `12.4 ms`, `1.23 s`, `2.36 GB/s`.

Three significant digits; the unit is chosen after rounding, so 0.9996 s reads `1.00 s`, not
`1e+03 ms`. JSON output keeps plain numbers in seconds and bytes; only text uses these.
"""

from __future__ import annotations

import math

_SMALL = ((1e-6, 1e9, "ns"), (1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (60.0, 1.0, "s"))
_RATE = ((1e3, 1.0, "B/s"), (1e6, 1e-3, "kB/s"), (1e9, 1e-6, "MB/s"), (1e12, 1e-9, "GB/s"))


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _sig(x: float) -> str:
    """3 significant digits, trailing zeros kept (`1.00`, `12.4`, `231`)."""
    return f"{x:#.3g}".rstrip(".")


def seconds_text(seconds) -> str:
    """`231 µs`, `12.4 ms`, `1.23 s`, `4 min 05 s`, `2 h 03 min`; `-` for None/NaN."""
    if _missing(seconds):
        return "-"
    sign, s = ("-" if seconds < 0 else ""), float(f"{abs(seconds):.3g}")
    if s == 0:
        return "0 s"
    for below, scale, unit in _SMALL:
        if s < below:
            return f"{sign}{_sig(s * scale)} {unit}"
    total = round(abs(seconds))
    if total < 3600:
        return f"{sign}{total // 60} min {total % 60:02d} s"
    return f"{sign}{total // 3600} h {total % 3600 // 60:02d} min"


def size_text(nbytes) -> str:
    """`850 B`, `1.00 kB`, `2.36 GB` (powers of 1000, like `rate_text`); `-` for None/NaN."""
    if _missing(nbytes):
        return "-"
    return rate_text(nbytes)[: -len("/s")]


def rate_text(bytes_per_s) -> str:
    """`850 B/s`, `1.00 MB/s`, `2.36 GB/s`; `-` for None/NaN."""
    if _missing(bytes_per_s):
        return "-"
    r = float(f"{bytes_per_s:.3g}")
    for below, scale, unit in _RATE:
        if r < below:
            return f"{_sig(r * scale)} {unit}"
    return f"{_sig(r * 1e-12)} TB/s"


def number_text(value) -> str:
    """A plain value (a metric, a ratio) with 3 significant digits; `-` for None/NaN."""
    return "-" if _missing(value) else f"{value:.3g}"
