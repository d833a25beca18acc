"""How the dashboard writes numbers and colours phases: one place, so every page agrees."""

from __future__ import annotations

import math

import pandas as pd

from rltrace import _phases

#: Phases of one stage share a hue: rollout blues, reward green, train oranges, weight sync purple.
PHASE_COLORS = {
    "step": "#d4d4d8",
    "rollout": "#3b6fb6",
    "generate": "#7fb2e5",
    "reward": "#3f9e4d",
    "train": "#e0861a",
    "forward": "#f6b25c",
    "backward": "#c8620c",
    "optimizer": "#9a4a05",
    "weight_sync": "#8e5bb5",
    "eval": "#8c6d52",
    "wait": "#b8b8c0",
}
OTHER_COLORS = ["#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#9edae5", "#dbdb8d", "#f7b6d2", "#c49c94"]
STAGE_COLORS = {stage: PHASE_COLORS[stage] for stage in _phases.STAGES}  # a stage wears its main phase's colour
IDLE_COLOR = "#e4572e"  # waiting, open (hung) spans
RUN_COLORS = ["#3b6fb6", "#e0861a", "#3f9e4d", "#8e5bb5", "#e4572e", "#17becf", "#8c6d52", "#bcbd22"]


def phase_color(phase: str) -> str:
    """The colour of a phase; unknown phases get a stable colour from their name."""
    if phase in PHASE_COLORS:
        return PHASE_COLORS[phase]
    return OTHER_COLORS[sum(map(ord, str(phase))) % len(OTHER_COLORS)]


def missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def seconds(value, digits: int = 3) -> str:
    """3.52 s, 84.1 ms, 120 µs, 250 ns; '–' when unknown."""
    if missing(value):
        return "–"
    value = float(f"{float(value):.{digits}g}")  # round first: 0.0009996 s reads "1 ms", not "1e+03 µs"
    if abs(value) >= 1 or value == 0:
        return f"{value:.{digits}g} s"
    if abs(value) >= 1e-3:
        return f"{value * 1e3:.{digits}g} ms"
    if abs(value) >= 1e-6:
        return f"{value * 1e6:.{digits}g} µs"
    return f"{value * 1e9:.{digits}g} ns"


def number(value, digits: int = 3) -> str:
    return "–" if missing(value) else f"{float(value):.{digits}g}"


def share(value) -> str:
    """42%, 3.5%, 0.07%: small shares keep two significant digits instead of reading 0%."""
    if missing(value):
        return "–"
    value = float(value)
    return f"{value:.0%}" if abs(value) >= 0.1 or value == 0 else f"{value * 100:.2g}%"


def nbytes(value) -> str:
    if missing(value):
        return "–"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def who(role, rank) -> str:
    """`trainer0`, `rollout3`; '?' for a process nobody named."""
    if missing(role):
        return "?"
    return f"{role}{'' if missing(rank) else int(rank)}"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def run_label(name: str, path: str) -> str:
    return name if name == path.rstrip("/").rsplit("/", 1)[-1] else f"{name} ({path.rstrip('/').rsplit('/', 1)[-1]})"


def wait_text(row, names: dict[str, str]) -> str:
    """One `top_waits` row as a sentence: who waited, how long, for what, on which process.

    `names` maps process_id to a short name (see `process_names`).
    """
    who_ = who(row["role"], row["rank"])
    where = "idle" if row["in_phase"] == "idle" else "in a wait span" if row["in_phase"] == "wait" else f"waiting inside {row['in_phase']}"
    text = f"**{who_}** {where} **{seconds(row['seconds'])}** ({share(row['share'])} of step {row['step']})"
    if row["waited_for"] == "untraced":
        return text + " while no recorded phase ran anywhere"
    other = names.get(row["waited_for_process"])
    return text + f" for **{row['waited_for']}**" + (f" on {other}" if other else "")


def process_names(processes: pd.DataFrame) -> dict[str, str]:
    """process_id -> `trainer0` for a frame with process_id, role, rank."""
    return {p: who(r, k) for p, r, k in zip(processes["process_id"], processes["role"], processes["rank"])}
