"""Callback-style phases: `start_phase(...)` now, `handle.end()` from a later call."""

from __future__ import annotations

import json
import threading
import warnings

import pytest

import rltrace

from .test_api import spans


def by_name(run_dir) -> dict[str, dict]:
    return {s["name"]: s for s in spans(run_dir)}


def test_handles_nest_inherit_and_mix_with_phase_blocks(run_dir):
    rltrace.init(run_dir, role="trainer", rank=1)
    step = rltrace.start_phase("step", step=4, weight_version=2, batch=8)
    opt = rltrace.start_phase("optimizer")
    with rltrace.phase("backward"):
        pass
    opt.set(lr=0.1)
    opt.end()
    with rltrace.phase("eval"):  # after opt ended: a child of step again, not of optimizer
        pass
    step.end()
    with rltrace.phase("after"):
        pass
    rltrace.shutdown()
    s = by_name(run_dir)
    assert (s["step"]["step"], s["step"]["weight_version"], s["step"]["parent_span_id"]) == (4, 2, None)
    assert json.loads(s["step"]["attributes"])["rl.batch"] == 8
    assert (s["optimizer"]["parent_span_id"], s["optimizer"]["step"], s["optimizer"]["weight_version"]) == (
        s["step"]["span_id"], 4, 2)
    assert json.loads(s["optimizer"]["attributes"])["rl.lr"] == 0.1
    assert s["backward"]["parent_span_id"] == s["optimizer"]["span_id"] and s["backward"]["step"] == 4
    assert s["eval"]["parent_span_id"] == s["step"]["span_id"]
    assert s["after"]["parent_span_id"] is None and s["after"]["step"] is None
    assert all(x["status"] == "UNSET" and not x["is_open"] for x in s.values())
    assert s["step"]["start_ns"] <= s["optimizer"]["start_ns"] <= s["optimizer"]["end_ns"] <= s["step"]["end_ns"]


def test_an_open_handle_is_an_open_span_in_the_store(run_dir):
    rltrace.init(run_dir)
    handle = rltrace.start_phase("rollout", step=0)
    rltrace.flush()
    (row,) = spans(run_dir)
    assert row["is_open"] and row["phase"] == "rollout" and row["span_id"] == handle.span_id
    handle.end()
    rltrace.flush()
    (row,) = spans(run_dir)
    assert not row["is_open"]


def test_end_with_an_error_records_it(run_dir):
    rltrace.init(run_dir)
    a = rltrace.start_phase("reward", step=1)
    a.end(error=ValueError("bad verifier"))
    b = rltrace.start_phase("generate", step=1)
    b.end(error="engine restarted")
    rltrace.shutdown()
    s = by_name(run_dir)
    assert s["reward"]["status"] == "ERROR" and s["reward"]["status_message"] == "ValueError: bad verifier"
    assert json.loads(s["reward"]["events"])[0]["attributes"]["exception.type"] == "ValueError"
    assert (s["generate"]["status"], s["generate"]["status_message"]) == ("ERROR", "engine restarted")


def test_ending_twice_warns_and_keeps_the_first_end(run_dir):
    rltrace.init(run_dir)
    h = rltrace.start_phase("train", step=0)
    h.end()
    with pytest.warns(UserWarning, match="'train' was already ended") as record:
        h.end(error=RuntimeError("late"))
    assert record[0].filename == __file__  # stacklevel points at the caller
    rltrace.shutdown()
    (row,) = spans(run_dir)
    assert row["status"] == "UNSET"


def test_ending_out_of_order_warns_and_records_both(run_dir):
    rltrace.init(run_dir)
    outer = rltrace.start_phase("step", step=0)
    inner = rltrace.start_phase("train")
    with pytest.warns(UserWarning, match=r"'step' was not the innermost open phase when it ended \(the current one is 'train'\)"):
        outer.end()
    with rltrace.phase("still_inner"):  # inner is still open: it stays the parent
        pass
    inner.end()
    with rltrace.phase("top"):  # both ended: the context is clean again
        pass
    rltrace.shutdown()
    s = by_name(run_dir)
    assert not s["step"]["is_open"] and not s["train"]["is_open"]
    assert s["still_inner"]["parent_span_id"] == s["train"]["span_id"]
    assert s["top"]["parent_span_id"] is None


def test_a_handle_that_outlives_its_with_block_warns_and_later_phases_are_not_its_children(run_dir):
    rltrace.init(run_dir)
    with rltrace.phase("epoch", step=1):
        h = rltrace.start_phase("step")
    with pytest.warns(UserWarning, match=r"'step' was not the innermost open phase when it ended \(the current one is none\)"):
        h.end()
    with rltrace.phase("after"):
        pass
    rltrace.shutdown()
    s = by_name(run_dir)
    assert s["step"]["parent_span_id"] == s["epoch"]["span_id"] and s["step"]["step"] == 1
    assert s["after"]["parent_span_id"] is None


def test_ending_from_another_thread_warns_and_the_first_thread_recovers(run_dir):
    rltrace.init(run_dir)
    h = rltrace.start_phase("rollout", step=3)
    caught = []

    def other():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            h.end()
        caught.extend(w)

    t = threading.Thread(target=other, name="callback-thread")
    t.start()
    t.join()
    assert len(caught) == 1 and "ended in thread 'callback-thread'" in str(caught[0].message)
    nxt = rltrace.start_phase("train")  # the first thread unwinds the ended handle first
    nxt.end()
    rltrace.shutdown()
    s = by_name(run_dir)
    assert not s["rollout"]["is_open"] and s["train"]["parent_span_id"] is None
    assert s["train"]["step"] == 3  # not its child: its sibling after it, in its step (as in the README's loop)


def test_without_a_run_handles_are_free_no_ops():
    h = rltrace.start_phase("step", step=0)
    assert h.span is None and h.span_id is None
    h.set(x=1)
    h.end()
    with pytest.warns(UserWarning):
        h.end()


def test_user_mistakes_raise_at_the_call_site(run_dir):
    rltrace.init(run_dir)
    with pytest.raises(ValueError, match="phase name"):
        rltrace.start_phase("")
    with pytest.raises(TypeError, match="step must be an integer"):
        rltrace.start_phase("step", step="3")
    with pytest.raises(ValueError, match="attribute keys"):
        rltrace.start_phase("step", **{"": 1})
