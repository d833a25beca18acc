"""What the user has selected, kept in `st.session_state` so it survives page switches.

The entrypoint's sidebar owns the shared choices (run, comparison run, step range); pages read
them through the functions here. Keyed widgets use `persist_state="session"`, so a page shows
the same choices when the user comes back; `open_timeline` lets any page send the user to a
step (and span) of the Timeline.
"""

from __future__ import annotations

import streamlit as st

from rltrace.analysis._steps import Steps
from rltrace.ui.runs import RunRef

RUN = "run"  # path of the run every page shows
COMPARE = "compare_run"  # path of the run Compare and Reward overlay, or NO_RUN
STEPS = "steps"  # (first, last) step range, inclusive
VERSIONS = "run_versions"  # {path: fingerprint} pinned for this session
NO_RUN = ""
TIMELINE_STEP = "timeline_step"
TIMELINE_SPAN = "timeline_span"
NO_SPAN = ""  # the span picker's "nothing picked" (a None option would show as an empty box)
#: Page choices that name a step or span of one run: forgotten when the user picks another run.
PER_RUN = (TIMELINE_STEP, TIMELINE_SPAN, "compare_a", "compare_b", "compare_step", "samples_x", "samples_y", "samples_color")


def ref(path: str) -> RunRef:
    return RunRef(path, st.session_state[VERSIONS][path])


def runs() -> list[RunRef]:
    """Every run given to the dashboard, at the version this session shows."""
    return [ref(p) for p in st.session_state[VERSIONS]]


def selected() -> RunRef:
    return ref(st.session_state[RUN])


def comparison() -> RunRef | None:
    path = st.session_state.get(COMPARE) or NO_RUN
    return ref(path) if path != NO_RUN and path in st.session_state[VERSIONS] else None


def steps() -> Steps:
    """The sidebar's step range, or None (all steps) when the run has none yet."""
    value = st.session_state.get(STEPS)
    return None if value is None else (int(value[0]), int(value[1]))


def run_changed() -> None:
    """`on_change` of the run picker: steps and spans of the old run mean nothing in the new one."""
    for key in PER_RUN:
        st.session_state.pop(key, None)


def choose(key: str, options: list, default) -> None:
    """Before creating a page widget with `key`: make sure its value is one of `options`."""
    if st.session_state.get(key) not in options:
        st.session_state[key] = default


def open_timeline(step: int, span_id: str | None = None) -> None:
    """Show `step` (and select `span_id`) on the Timeline page."""
    st.session_state[TIMELINE_STEP] = int(step)
    st.session_state[TIMELINE_SPAN] = span_id or NO_SPAN
    st.switch_page(PAGES["timeline"])


#: Page files, relative to the entrypoint (st.switch_page takes these).
PAGES = {
    "overview": "views/overview.py",
    "timeline": "views/timeline.py",
    "waits": "views/waits.py",
    "reward": "views/reward.py",
    "metrics": "views/metrics.py",
    "batches": "views/batches.py",
    "profiles": "views/profiles.py",
    "compare": "views/compare.py",
    "engine": "views/engine.py",
    "whatif": "views/whatif.py",
}
