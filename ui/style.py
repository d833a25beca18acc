"""How the dashboard colours phases and names runs: one place, so every page agrees.

Numbers, process names and stored text are written by `rltrace.analysis._format`, the same
functions the CLI and `rltrace report` use."""

from __future__ import annotations

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


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def run_label(name: str, path: str) -> str:
    return name if name == path.rstrip("/").rsplit("/", 1)[-1] else f"{name} ({path.rstrip('/').rsplit('/', 1)[-1]})"
