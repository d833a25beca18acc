"""Every page opened first on a fresh dashboard (a bookmark, a link), and after every other page.

A page must not depend on what another page left in the caches or on the run's connection: each
test starts from empty Streamlit caches (as a fresh `rltrace ui` does) on the demo run, an
imported slime rollout and a long run with a few stalls among fast steps.
"""

from __future__ import annotations

import itertools

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from rltrace._config import paths_value
from rltrace.analysis import _format as fmt
from tests.report.test_stalls import stalled_run

from .conftest import APP, RUN_TIMEOUT_S, no_exceptions
from .test_pages import PAGES
from .test_sample_lanes import written_dir  # noqa: F401  (fixture: an imported slime rollout dump)


def fresh(monkeypatch, run_dir) -> AppTest:
    """An AppTest of a dashboard that has served nothing yet: no cached figure, no open connection."""
    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.setenv("RLTRACE_UI_RUNS", paths_value([str(run_dir)]))
    return AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)


def visit(at: AppTest, name: str) -> None:
    at.switch_page(f"views/{name}.py").run()
    no_exceptions(at)
    assert at.title, f"{name} has no title"


@pytest.fixture(scope="module")
def stalls(tmp_path_factory):
    return stalled_run(tmp_path_factory.mktemp("stalls_ui") / "stalls")


@pytest.mark.parametrize("name", PAGES)
@pytest.mark.parametrize("which", ["colocated_run", "written_dir", "stalls"])  # the demo, an imported slime dump
def test_each_page_opens_first_on_a_fresh_dashboard(which, name, request, monkeypatch):
    at = fresh(monkeypatch, request.getfixturevalue(which))
    visit(at, name)


def _every_pair() -> list[str]:
    """A walk over the pages in which every page follows every other page once (an Euler circuit
    of the complete directed graph on the pages)."""
    left = {a: [b for b in PAGES if b != a] for a in PAGES}
    walk, stack = [], [PAGES[0]]
    while stack:  # Hierholzer's algorithm
        here = stack[-1]
        if left[here]:
            stack.append(left[here].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def test_the_walk_covers_every_ordered_pair():
    walk = _every_pair()
    assert set(itertools.pairwise(walk)) == {(a, b) for a in PAGES for b in PAGES if a != b}


def test_every_page_after_every_other_page(colocated_run, monkeypatch):
    at = fresh(monkeypatch, colocated_run)
    at.run()
    no_exceptions(at)
    for name in _every_pair():
        visit(at, name)


def test_the_reward_page_says_where_mismatch_was_not_recorded(tmp_path, monkeypatch):
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(3):
        tr.span("rollout", step, step + 0.5, step=step,
                mismatch_missing="model.generate is wrapped by a plain function; the log-prob processor cannot be attached")
        tr.span("train", step + 0.5, step + 1, step=step)
    b.write()
    at = fresh(monkeypatch, b.run_dir)
    visit(at, "reward")
    assert [w.value for w in at.warning] == [fmt.md(
        "Mismatch not recorded on trainer0 (3 steps, 0–2): model.generate is wrapped by a plain function; the "
        "log-prob processor cannot be attached.")]
