"""Each rule on a live run: a process started here records steps, then gets stuck; the watcher,
reading the store while it runs, raises the rule's alert within its window and not before."""

from __future__ import annotations

import subprocess
import time

import pytest

from rltrace import store
from rltrace.alerts import Settings, Threshold, Watcher

from ..conftest import PYTHON, REPO, python_env

MARGIN_S = 15.0  # a loaded 2-core machine: writes land within ~1 s, the margin is for the scheduler


@pytest.fixture
def live(run_dir):
    procs = []

    def start(scenario: str, **env: str) -> subprocess.Popen:
        p = subprocess.Popen([PYTHON, "-m", "tests.alerts.live_process", str(run_dir), scenario], cwd=REPO,
                             env=python_env(**env), stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def _wait_for(watcher: Watcher, rule: str, window: float):
    """Check every 0.25 s until `rule` fires; returns (alert, seconds it took)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < window:
        firing, _ = watcher.check()
        found = [a for a in firing if a.rule == rule]
        if found:
            return found[0], time.monotonic() - t0
        time.sleep(0.25)
    raise AssertionError(f"{rule} did not fire within {window:g} s")


def test_a_stalled_step_and_a_hung_phase(live, run_dir):
    live("stall")
    watcher = Watcher(run_dir, Settings(stall_factor=3, stall_min_s=4.0, hang_s=4.0, rules=("no_progress", "hang")))
    assert watcher.check()[0] == []  # the last step ended a moment ago
    stall, took = _wait_for(watcher, "no_progress", 4.0 + MARGIN_S)
    assert stall.step == 6 and stall.phase == "train" and stall.role == "trainer" and stall.seconds > 4.0
    assert "since step 5" in stall.message and "train on trainer0 at step 6" in stall.message
    hung, _ = _wait_for(watcher, "hang", MARGIN_S)
    assert (hung.phase, hung.step, hung.rank) == ("train", 6, 0) and hung.seconds > 4.0
    assert hung.span_id and hung.limit_s == 4.0
    stored = store.open(run_dir).execute("SELECT rule, key, step, message FROM alerts ORDER BY rule").df()
    assert list(stored["rule"]) == ["hang", "no_progress"]  # each raised once however often it was checked
    assert watcher.check()[1] == []


def test_a_wait_with_nothing_upstream_is_starved(live, run_dir):
    live("starve")
    watcher = Watcher(run_dir, Settings(starved_s=3.0, rules=("starved",)))
    assert watcher.check()[0] == []
    alert, _ = _wait_for(watcher, "starved", 3.0 + MARGIN_S)
    assert alert.phase == "wait" and alert.step == 6 and alert.seconds > 3.0
    assert "trainer0 has waited" in alert.message and "for rollout at step 6 while no rollout ran" in alert.message


def test_a_killed_process_stops_its_heartbeat(live, run_dir):
    p = live("silent", RLTRACE_MERGE_PARTS="0")  # a writer that holds no lock (as one on another host reads)
    watcher = Watcher(run_dir, Settings(heartbeat_s=3.0, rules=("heartbeat",)))
    time.sleep(4.0)
    assert watcher.check()[0] == []  # alive: it writes its heartbeat every 0.2 s
    p.kill()
    p.wait(timeout=30)
    alert, _ = _wait_for(watcher, "heartbeat", 3.0 + MARGIN_S)
    assert alert.role == "trainer" and alert.phase == "train" and alert.step == 6
    assert "has not written to the store for" in alert.message and "while in train at step 6" in alert.message


def test_a_killed_process_on_this_host_is_stopped_at_once_by_its_lock(live, run_dir):
    """Its heartbeat is fresh for a minute yet, but the writer lock it held here is free."""
    p = live("silent")
    watcher = Watcher(run_dir, Settings(heartbeat_s=600.0, rules=("heartbeat",)))
    time.sleep(2.0)  # its open phase is written
    assert watcher.check()[0] == []  # alive
    p.kill()
    p.wait(timeout=30)
    alert, took = _wait_for(watcher, "heartbeat", MARGIN_S)
    assert took < MARGIN_S and alert.role == "trainer" and alert.phase == "train" and alert.step == 6
    assert "stopped while in train at step 6: the writer lock it held is free" in alert.message


def test_a_metric_crossing_its_threshold(live, run_dir):
    p = live("reward_drop")
    watcher = Watcher(run_dir, Settings(thresholds=(Threshold.parse("reward_mean<0.25"),), rules=("threshold",)))
    alert, _ = _wait_for(watcher, "threshold", MARGIN_S)
    assert alert.metric == "reward_mean" and alert.value < 0.25 and alert.threshold == 0.25
    assert p.wait(timeout=60) == 0
    firing, new = watcher.check()  # later steps of the same crossing: the same alert, not a new one
    assert [a.key for a in firing] == ["threshold:reward_mean<0.25:8"] and new == []
    assert "since step 8" in firing[0].message


def test_the_watch_command_follows_a_live_run_until_it_ends(live, run_dir):
    p = live("reward_drop")
    watch = subprocess.run([PYTHON, "-m", "rltrace", "watch", str(run_dir), "--interval", "0.5", "--rules", "threshold",
                            "--threshold", "reward_mean<0.25"], cwd=REPO, env=python_env(), capture_output=True,
                           text=True, timeout=120)
    assert p.wait(timeout=60) == 0
    assert watch.returncode == 1, watch.stderr  # an alert was raised while it watched
    out = watch.stdout
    assert out.count("ALERT threshold: reward_mean") == 1 and "the run has ended; 1 alert(s) raised" in out
