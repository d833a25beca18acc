"""`rltrace report` on real demo runs: each fault flag makes the report name its culprit, in the
JSON and in the sentences; colocated and async (Ray) runs report their waits and overlap.

Runs come from `conftest.RUNS` (shared with test_tiny_grpo_runs.py); the report runs in-process
through the CLI entry point, the terminal form at 80 columns.
"""

from __future__ import annotations

import json

import pytest

import rltrace.store
from rltrace import analysis
from rltrace.cli import main


@pytest.fixture
def report_of(capsys, monkeypatch):
    """`report_of(run_dir)` -> (the --json dict, the terminal report with its line wraps undone)."""
    monkeypatch.setenv("COLUMNS", "80")

    def run(run_dir) -> tuple[dict, str]:
        assert main(["report", str(run_dir), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert main(["report", str(run_dir)]) == 0
        terminal = capsys.readouterr().out
        assert max(len(line) for line in terminal.splitlines()) <= 80
        return data, " ".join(terminal.split())

    return run


def test_slow_reward_is_the_bottleneck(demo, report_of):
    data, text = report_of(demo("slow_reward")[0])
    assert data["bottleneck"]["stage"] == "reward" and data["bottleneck"]["role"] == "trainer"
    assert data["t_reward"] > data["t_rollout"] + data["t_T"]
    assert data["findings"][0].startswith("Bottleneck: reward on trainer")
    assert "Bottleneck: reward on trainer" in text


def test_straggler_samples_are_named(demo, report_of):
    data, text = report_of(demo("straggler")[0])
    worst = {s["step"]: s for s in data["stragglers"] if s["response_len"] == 96}  # the --straggler budget
    assert sorted(worst) == [0, 1, 2] and all(s["len_ratio"] >= 4 for s in worst.values())  # median 8-24 tokens
    sentence = next(f for f in data["findings"] if "straggler sample(s)" in f)
    latest = max(data["stragglers"], key=lambda s: s["after_median_s"])
    assert f"worst: sample {latest['sample_id']} at step {latest['step']}" in sentence
    # the 96-token sample keeps generating long after the median one finished: ~84 more decode steps
    # against the median's ~12 and its prefill. Wall times move with machine load (a stall inside the
    # median sample's window, the first step's warm-up), so every step is held to 1x and one to 2x.
    tails = data["long_tail"]
    assert [t["step"] for t in tails] == [0, 1, 2] and all(t["max_len"] >= 4 * t["median_len"] for t in tails)
    assert all(t["tail_s"] > t["median_gen_s"] and t["tail_share"] > 0 for t in tails)
    assert max(t["tail_s"] / t["median_gen_s"] for t in tails) > 2
    assert "Stragglers" in text and sentence in text


def test_slow_weight_sync_is_the_cost_to_fix(demo, report_of):
    data, text = report_of(demo("slow_sync")[0])
    assert data["bottleneck"]["stage"] == "weight_sync"
    assert 1e6 < data["weight_sync_fit"]["effective_B_W"] <= 2.1e6  # --slow-sync-bandwidth 2e6 paces the copy
    assert "Bottleneck: weight_sync on trainer" in text and "of the synchronous step" in text
    assert "the cost to fix first" in text


def test_hang_is_the_first_finding(demo, report_of):
    data, text = report_of(demo("hang")[0])
    hung = [o for o in data["open_spans"] if o["phase"] == "generate"]
    assert [(o["step"], o["role"], o["thread_name"]) for o in hung] == [(2, "trainer", "rollout-engine")]
    assert data["findings"][0].startswith("Open span: generate on trainer (thread rollout-engine) at step 2")
    waited = [w for w in data["waits"] if w["step"] == 2 and w["role"] == "trainer"]
    assert waited[0]["waited_for"] == "rollout" and waited[0]["seconds"] > 5  # --hang-timeout 6
    assert "Open spans" in text and "for rollout on another thread" in text


@pytest.mark.slow
def test_colocated_run_reports_the_wait_for_the_engine_thread(demo, report_of):
    data, text = report_of(demo("colocated")[0])
    assert len(data["steps"]) == 24 and data["bottleneck"] is not None
    engine = [w for w in data["waits"] if w["in_phase"] == "rollout" and w["waited_for"] == "rollout"]
    assert {w["step"] for w in engine} == set(range(24))  # every step's wait for generation on the engine thread
    assert all(w["waited_for_process"] == w["process_id"] for w in engine)
    assert "on another thread" in engine[0]["text"]
    assert "(thread)" in text and not data["async"]["overlapping"]
    assert "no measured overlap): async could at best bring a step" in text
    assert not any(f.startswith(("tis_mean", "tis_clipfrac")) for f in data["findings"])  # flat in a sync run


@pytest.mark.slow
def test_async_ray_run_reports_overlap_staleness_and_the_weight_update_stall(demo, report_of):
    run = demo("ray_async")[0]
    data, text = report_of(run)
    assert data["async"]["overlapping"] and data["async"]["achieved_speedup"] > 1.1
    assert "Stages overlap (measured)" in text
    assert data["staleness"]["max"] >= 1 and "Staleness: mean" in text
    assert {w["role"] for w in data["waits"]} == {"trainer", "rollout"}
    waits = analysis.waits(rltrace.store.open(run))  # every wait, not only each step's longest three
    sync = waits[(waits["role"] == "trainer") & (waits["in_phase"] == "weight_sync")]
    assert set(sync["kind"]) == {"declared"} and set(sync["waited_for"]) == {"weight_load"}
    assert set(sync["step"]) == set(range(8))  # every update waits for the workers to load it
    stall = waits[(waits["role"] == "rollout") & (waits["in_phase"] == "weight_load")]
    assert set(stall["waited_for"]) <= {"generate"}  # a weight load waits only for the batch in flight


@pytest.mark.slow
def test_hung_ray_worker_is_the_first_finding(demo, report_of):
    data, text = report_of(demo("ray_sync_hang")[0])
    assert data["findings"][0].startswith("Open span: generate on rollout0")
    assert any(o["phase"] == "generate" and o["step"] == 3 and o["role"] == "rollout" for o in data["open_spans"])
    assert "Open spans" in text
