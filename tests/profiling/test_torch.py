"""torch.profiler windows with the real profiler: one Chrome trace per chosen phase run, linked to
its span, with Kineto's clock inside the span's wall-clock bounds; never breaking a user's profiler."""

from __future__ import annotations

import gzip
import json

import pytest

import rltrace
from rltrace import store
from rltrace.profiling import artefact_path

from .conftest import frames, profiles, run_program

torch = pytest.importorskip("torch")  # the torch extra; CI installs it


@pytest.fixture(scope="module")
def window_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("torch") / "run"
    done = run_program(run_dir, "torch", RLTRACE_TORCH_PROFILE="train:2-3")
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def test_each_phase_run_in_the_window_gets_a_trace_linked_to_its_span(window_run):
    rows = profiles(window_run)
    assert [(r["kind"], r["trigger"], r["status"], r["step"]) for r in rows] == [
        ("torch", "window", "ok", 2),
        ("torch", "window", "ok", 3),
    ]
    con = store.open(window_run)
    for row in rows:
        span = con.execute(
            "SELECT phase, step, start_ns, end_ns FROM spans WHERE trace_id = ? AND span_id = ?",
            [row["trace_id"], row["span_id"]],
        ).fetchone()
        assert span[:2] == ("train", row["step"])
        trace = json.loads(gzip.open(artefact_path(window_run, row["path"])).read())
        ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        assert ops, "the trace holds the phase's operators"
        # Kineto times are microseconds from baseTimeNanoseconds: they must fall inside the span.
        first = min(trace["baseTimeNanoseconds"] + e["ts"] * 1000 for e in ops)
        last = max(trace["baseTimeNanoseconds"] + (e["ts"] + e["dur"]) * 1000 for e in ops)
        assert span[2] - 5e6 <= first and last <= span[3] + 5e6
        # the window's own cost (starting and stopping the profiler) is inside the span, not after it
        assert span[2] <= row["started_ns"] and row["ended_ns"] <= span[3]


def test_the_top_operators_are_stored(window_run):
    row = profiles(window_run)[0]
    top = frames(window_run, row["profile_id"])
    assert {f["frame"] for f in top[:2]} == {"aten::mm", "aten::tanh"}, [(f["frame"], f["self_share"]) for f in top]
    assert all(not f["frame"].startswith("ProfilerStep") for f in top)
    assert sum(f["self_share"] for f in top) == pytest.approx(1.0, abs=0.01)


def _train(run_dir, **profile):
    rltrace.init(run_dir, **profile)
    x = torch.randn(32, 32)
    with rltrace.phase("train", step=0):
        (x @ x).sum()
    rltrace.shutdown()
    return profiles(run_dir)


def test_rank0_only_takes_windows_on_rank_0(tmp_path):
    policy = {"torch": "train:0", "torch_rank0_only": True}
    assert _train(tmp_path / "r1", rank=1, profile=policy) == []
    [row] = _train(tmp_path / "r0", rank=0, profile=policy)
    assert row["status"] == "ok" and row["rank"] == 0


def test_a_users_own_profiler_is_left_alone(tmp_path):
    with torch.profiler.profile() as outer:
        [row] = _train(tmp_path / "run", profile={"torch": "train:0"})
    assert row["status"] == "failed" and "another torch profiler" in row["message"]
    assert any(e.key == "aten::mm" for e in outer.key_averages())
