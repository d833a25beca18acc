"""Which phase counts as what: the seed's cost categories, containers and waits.

`t_R` is rollout plus reward, `t_T` training, `t_W` weight sync (BRIEF). A *container* is a span
that only groups others (`step`, or a user phase whose children belong to two or more
categories, such as an `iteration` around rollout and train): a process inside a container but
in no other span is idle. Everything else except `wait` is *busy*: the process is doing work.
"""

from __future__ import annotations

STAGE_OF = {
    "rollout": "R",
    "generate": "R",
    "reward": "R",
    "train": "T",
    "forward": "T",
    "backward": "T",
    "optimizer": "T",
    "weight_sync": "W",
}
STAGES = ("R", "T", "W")
STAGE_NAMES = {"R": "rollout+reward", "T": "train", "W": "weight_sync"}

WAIT = "wait"
ALWAYS_CONTAINER = frozenset({"step"})


def stage(phase: str | None) -> str | None:
    """R, T, W, or None for a phase outside the seed's three categories."""
    return STAGE_OF.get(phase or "")


def containers(parent_child_phases) -> set[str]:
    """Container phases, from (parent phase, child phase) pairs seen in the run.

    `step` always; a phase with no category of its own whose direct children fall in two or
    more categories (R, T, W) as well.
    """
    child_stages: dict[str, set[str]] = {}
    for parent, child in parent_child_phases:
        if parent is None or parent in STAGE_OF:
            continue
        s = stage(child)
        if s is not None:
            child_stages.setdefault(parent, set()).add(s)
    return set(ALWAYS_CONTAINER) | {p for p, stages in child_stages.items() if len(stages) >= 2}


def is_busy(phase: str, container_phases: set[str]) -> bool:
    return phase != WAIT and phase not in container_phases
