"""The phase taxonomy, stated once: which stage each standard phase belongs to, which cost term
each stage feeds, and which phases only group others.

Stages are what a person names ("waited for train", not "for backward"). Cost terms are those of
the async cost model: `t_R` is rollout plus reward, `t_T` training, `t_W` weight sync, so that one
synchronous step costs `t_sync = t_R + t_T + t_W` and an async one at best `max(t_R, t_T) + t_W`.
A *container* is a span that only groups others (`step`, or a user phase whose children belong
to two or more cost terms, such as an `iteration` around rollout and train): a process inside a
container but in no other span is idle. Everything else except `wait` is *busy*.

Colours live in the dashboard (`rltrace.ui.style`) but are keyed by these names. This module
imports nothing from rltrace; anything may import it.
"""

from __future__ import annotations

#: The four stages of an RL step, in the order of the loop.
STAGES = ("rollout", "reward", "train", "weight_sync")
#: Stage of each standard phase; other phases belong to no stage.
STAGE_OF = {
    "rollout": "rollout",
    "generate": "rollout",
    "reward": "reward",
    "train": "train",
    "forward": "train",
    "backward": "train",
    "optimizer": "train",
    "weight_sync": "weight_sync",
}
#: Cost term of each stage.
TERM_OF_STAGE = {"rollout": "R", "reward": "R", "train": "T", "weight_sync": "W"}
TERMS = ("R", "T", "W")
TERM_NAMES = {"R": "rollout+reward", "T": "train", "W": "weight_sync"}
#: Cost-model column of each stage (`rltrace.analysis.cost_model`).
COST_COLUMN = {"rollout": "t_rollout", "reward": "t_reward", "train": "t_T", "weight_sync": "t_W"}
#: Cost-model column of each term.
TERM_COLUMN = {"R": "t_R", "T": "t_T", "W": "t_W"}

WAIT = "wait"
ALWAYS_CONTAINER = frozenset({"step"})


def stage(phase: str | None) -> str | None:
    """rollout, reward, train, weight_sync, or None for a phase outside them."""
    return STAGE_OF.get(phase or "")


def term(phase: str | None) -> str | None:
    """R, T, W, or None for a phase outside the three cost terms."""
    s = STAGE_OF.get(phase or "")
    return None if s is None else TERM_OF_STAGE[s]


def phases_of(stage_name: str) -> tuple[str, ...]:
    """The standard phases of a stage."""
    return tuple(p for p, s in STAGE_OF.items() if s == stage_name)


def containers(parent_child_phases) -> set[str]:
    """Container phases, from (parent phase, child phase) pairs seen in the run.

    `step` always; a phase with no stage of its own whose direct children fall in two or more
    cost terms (R, T, W) as well.
    """
    child_terms: dict[str, set[str]] = {}
    for parent, child in parent_child_phases:
        if parent is None or parent in STAGE_OF:
            continue
        t = term(child)
        if t is not None:
            child_terms.setdefault(parent, set()).add(t)
    return set(ALWAYS_CONTAINER) | {p for p, terms in child_terms.items() if len(terms) >= 2}


def is_busy(phase: str, container_phases: set[str]) -> bool:
    return phase != WAIT and phase not in container_phases
