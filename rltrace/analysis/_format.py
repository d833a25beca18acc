"""Numbers, names and stored text as a person reads them, on a terminal or a dashboard page.

The one place for human formatting: the CLI, `rltrace report` and the dashboard all call these,
so one value reads the same everywhere: `231 µs`, `12.4 ms`, `1.23 s`; sizes and rates in
1000-based units with SI symbols (`850 B`, `1.23 kB`, `2.36 GB/s`); shares as `42%` (small
ones keep two digits, `0.07%`); a process as `trainer0`. Three significant digits; the unit is
chosen after rounding, so 0.9996 s reads `1.00 s`, not `1e+03 ms`. `-` stands for a missing
value. JSON output keeps plain numbers in seconds and bytes; only text uses these.

Stored text (roles, phase names, reasons, paths) may hold anything a program wrote. Before it
reaches a terminal it goes through `term` (control characters shown as `\\x1b`, rich markup
escaped); before it reaches page markdown, through `md` (the same, then every markdown
punctuation character escaped, so no link, image, colour or icon directive survives).
"""

from __future__ import annotations

import math
import re

MISSING = "-"
_SMALL = ((1e-6, 1e9, "ns"), (1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (60.0, 1.0, "s"))
_SIZES = ((1e3, 1.0, "B"), (1e6, 1e-3, "kB"), (1e9, 1e-6, "MB"), (1e12, 1e-9, "GB"), (math.inf, 1e-12, "TB"))
#: Characters that change a terminal or hide in a page: C0/C1 controls (ESC, BEL, CR, newline...),
#: bidirectional overrides, private-use, lone surrogates, non-characters and the replacement char.
HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ue000-\uf8ff\ud800-\udfff\ufffd-\uffff]")
_MD_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character: CommonMark escapes them all
WORD_JOINER = "\u2060"
_LINKISH = re.compile(r"(?i)(?<=http)(?=s?:)|(?<=www)(?=\.)|(?=@)")  # where GFM's autolinks would begin


def missing(value) -> bool:
    """None, NaN, pandas' NA/NaT: nothing to show."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    try:
        return bool(value != value)  # numpy NaN, pandas NaT
    except TypeError:  # pandas NA refuses bool()
        return True
    except ValueError:  # an array: not a missing scalar
        return False


def _sig(x: float) -> str:
    """3 significant digits, trailing zeros kept (`1.00`, `12.4`, `231`)."""
    return f"{x:#.3g}".rstrip(".")


def seconds_text(seconds) -> str:
    """`231 µs`, `12.4 ms`, `1.23 s`, `4 min 05 s`, `2 h 03 min`; `-` for None/NaN."""
    if missing(seconds):
        return MISSING
    seconds = float(seconds)
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


def delta_seconds_text(seconds) -> str:
    """A difference of times in the units of `seconds_text`, signed: `+2.31 ms`, `-12.8 s`, `0 s`
    (deltas side by side read in one unit system, never `+0.00231 s` beside `+12.8 s`)."""
    if missing(seconds):
        return MISSING
    text = seconds_text(seconds)
    return text if text.startswith("-") or text == "0 s" else "+" + text


def size_text(n) -> str:
    """`850 B`, `1.23 kB`, `12.4 MB`, `2.36 GB` (1000-based, SI symbols); `-` for None/NaN."""
    if missing(n):
        return MISSING
    n = float(n)
    sign, r = ("-" if n < 0 else ""), float(f"{abs(n):.3g}")
    for below, scale, unit in _SIZES:
        if r < below:
            return f"{sign}{r:.0f} B" if unit == "B" else f"{sign}{_sig(r * scale)} {unit}"
    return MISSING


def rate_text(bytes_per_s) -> str:
    """`850 B/s`, `1.00 MB/s`, `2.36 GB/s`; `-` for None/NaN."""
    return MISSING if missing(bytes_per_s) else size_text(bytes_per_s) + "/s"


def number_text(value) -> str:
    """A plain value (a metric, a ratio) with 3 significant digits; `-` for None/NaN."""
    return MISSING if missing(value) else f"{float(value):.3g}"


def share_text(value) -> str:
    """`42%`, `3.5%`, `0.07%`: small shares keep two significant digits instead of reading `0%`."""
    if missing(value):
        return MISSING
    value = float(value)
    return f"{value:.0%}" if abs(value) >= 0.1 or value == 0 else f"{value * 100:.2g}%"


def process_name(role, rank) -> str:
    """`trainer0`, `rollout3`, `reward` (no rank); `?` for a process nobody named. Stored text: escape it to show it."""
    if missing(role):
        return "?"
    return f"{role}{'' if missing(rank) else int(rank)}"


def shown(text) -> str:
    """`text` with every HIDDEN character written as its escape (`\\x1b`, `\\n`, `\\u202e`)."""
    text = "" if text is None else str(text)
    return HIDDEN.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def term(text) -> str:
    """Stored text for a rich console: controls shown as escapes, `[...]` markup made literal."""
    from rich.markup import escape  # rich is a core dependency; only text for consoles needs it

    return escape(shown(text))


def md(text) -> str:
    """Stored text for page markdown (st.markdown, captions, titles, labels): shown literally.
    Escapes do not stop the page's markdown from making links of bare URLs and e-mail addresses
    (it finds them in the text after escapes are read), so a word joiner (U+2060, invisible) breaks
    each `http(s):`, `www.` and `@`."""
    return _MD_PUNCT.sub(r"\\\1", _LINKISH.sub(WORD_JOINER, shown(text)))


#: Where a mismatch value comes from (`rltrace.analysis.mismatch` sources), in words.
MISMATCH_SOURCES = {"metrics": "logged", "batches": "frozen batches", "samples": "per-sample mean"}


def mismatch_label(trend: dict) -> str:
    """What to add to a mismatch metric's name so the reader knows which computation it shows and
    whether the others agree: "", " (frozen batches)", " (logged; frozen batches agree)"."""
    sources = trend.get("sources") or [trend.get("source")]
    if sources == ["metrics"]:
        return ""
    parts = [MISMATCH_SOURCES.get(sources[0], sources[0])]
    for c in trend.get("computations") or []:
        verdict = {True: "agree", False: "differ", None: "on other steps"}[c.get("agree")]
        parts.append(f"{MISMATCH_SOURCES.get(c['source'], c['source'])} {verdict}")
    return f" ({'; '.join(parts)})"
