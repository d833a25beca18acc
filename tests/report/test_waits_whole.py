"""Waits are told whole (every wait of the steps, not the longest few of each step) and named
after the processes waited on by their share: the sentences, the Timeline's "Waiting" and the
chart of who waits for what add the same waits."""

from __future__ import annotations

from collections import defaultdict

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from rltrace import report, store
from rltrace._config import paths_value
from rltrace.analysis import _format as fmt
from rltrace.testing import RunBuilder
from tests.ui.conftest import APP, RUN_TIMEOUT_S, no_exceptions
from tests.ui.conftest import components_scanned_once  # noqa: F401  (autouse: one component scan a session)

STEPS = 25


def two_rollout_workers(path):
    """Each 3 s step: two rollout workers (whichever is slower is awaited: rollout1 on 13 steps,
    rollout0 on 12), then reward, train and weight sync; every process waits several times a step."""
    b = RunBuilder(path)
    tr, rw, r0, r1 = b.process("trainer"), b.process("reward"), b.process("rollout", 0), b.process("rollout", 1)
    t = 0.0
    for step in range(STEPS):
        one_slower = step % 2 == 0
        r0.span("rollout", t, t + (1.0 if one_slower else 1.2), step=step)
        r1.span("rollout", t, t + (1.2 if one_slower else 1.0), step=step)
        rw.span("reward", t + 1.2, t + 1.7, step=step)
        tr.span("train", t + 1.7, t + 2.7, step=step)
        tr.span("weight_sync", t + 2.7, t + 3.0, step=step)
        t += 3.0
    b.write()
    return path


@pytest.fixture(scope="module")
def waited(tmp_path_factory):
    run_dir = two_rollout_workers(tmp_path_factory.mktemp("waits") / "run")
    return run_dir, report.plain(report.build(store.open(run_dir)))


def test_sentences_add_every_wait_and_name_the_awaited_processes_by_share(waited):
    _, r = waited
    every = defaultdict(float)
    for w in r["waits_by_step"]:
        every[(fmt.process_name(w["role"], w["rank"]), w["waited_for_group"])] += w["seconds"]
    longest = defaultdict(float)  # the longest three of each step: what the sentences used to add
    for w in r["waits"]:
        longest[(fmt.process_name(w["role"], w["rank"]), w["waited_for"])] += w["seconds"]
    assert every[("trainer0", "reward")] == pytest.approx(0.5 * STEPS) and longest[("trainer0", "reward")] == 0
    for t in r["waits_total"]:
        assert t["seconds"] == pytest.approx(every[(fmt.process_name(t["role"], t["rank"]), t["waited_for"])])
    trainer = next(t for t in r["waits_total"] if t["role"] == "trainer" and t["waited_for"] == "rollout")
    assert [(o["name"], round(o["share"], 2)) for o in trainer["on"]] == [("rollout1", 0.52), ("rollout0", 0.48)]
    assert ("trainer0 waited 30.0 s (40% of step time) for rollout on rollout1 (52%) and rollout0 (48%)."
            in r["findings"])
    assert "reward0 waited 25.0 s (33% of step time) for train on trainer0." in r["findings"]


def test_each_steps_longest_waits_name_the_process_waited_on_longest(waited):
    _, r = waited
    for w in r["waits"]:
        if w["role"] == "trainer" and w["waited_for"] == "rollout":
            assert w["waited_for_name"] == ("rollout1" if w["step"] % 2 == 0 else "rollout0"), w["step"]


def test_the_timelines_waiting_adds_every_wait_of_the_step(waited, monkeypatch):
    run_dir, r = waited
    st.cache_data.clear()
    monkeypatch.setenv("RLTRACE_UI_RUNS", paths_value([str(run_dir)]))
    at = AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)
    at.switch_page("views/timeline.py").run()
    no_exceptions(at)
    step = at.selectbox(key="timeline_step").value
    whole = sum(w["seconds"] for w in r["waits_by_step"] if w["step"] == step)
    longest = sum(w["seconds"] for w in r["waits"] if w["step"] == step)
    assert whole > longest
    assert {m.label: m.value for m in at.metric}["Waiting"] == fmt.seconds_text(whole)
