"""The watchdog's rules: which phase gets profiled, how many, bounded memory, and fork safety.

These use a py-spy path that does not exist where only the choice matters: the capture then
ends at once as `missing_executable`, which is a profile row like any other."""

from __future__ import annotations

import os
import time

import rltrace
from rltrace.profiling import watchdog_of
from rltrace.profiling.watchdog import HISTORY, MAX_PHASES

from .conftest import profiles, wait_for_profiles

NO_PYSPY = "/nonexistent/py-spy"


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_only_the_innermost_slow_phase_is_recorded(tmp_path):
    rltrace.init(tmp_path / "run", profile={"after": 0.2})
    with rltrace.phase("step", step=0):
        with rltrace.phase("reward") as reward:
            busy(0.5)
            reward_span = reward.span_id
        busy(0.3)  # the step is still over its limit, but its slowness was the reward's
    rltrace.shutdown()
    [profile] = profiles(tmp_path / "run")
    assert (profile["span_id"], profile["phase"], profile["step"]) == (reward_span, "reward", 0)
    assert profile["threshold_s"] == 0.2 and profile["median_s"] is None


def test_limits_per_phase_and_phase_filter(tmp_path):
    rltrace.init(tmp_path / "run", profile={"after": {"reward": 0.1}, "pyspy": NO_PYSPY})
    for name in ("train", "reward"):
        with rltrace.phase(name, step=1):
            busy(0.3)
    rltrace.shutdown()
    assert [p["phase"] for p in profiles(tmp_path / "run")] == ["reward"]
    rltrace.init(tmp_path / "run2", profile={"after": 0.1, "phases": "train", "pyspy": NO_PYSPY})
    for name in ("train", "reward"):
        with rltrace.phase(name, step=1):
            busy(0.3)
    rltrace.shutdown()
    assert [p["phase"] for p in profiles(tmp_path / "run2")] == ["train"]


def test_slow_needs_enough_history(tmp_path):
    rltrace.init(tmp_path / "run", profile={"slow": 3, "min_samples": 4, "min_seconds": 0.1, "pyspy": NO_PYSPY})
    for step, seconds in enumerate([0.25, 0.01, 0.01, 0.01, 0.01, 0.25]):
        with rltrace.phase("reward", step=step):
            busy(seconds)
    rltrace.shutdown()
    [profile] = profiles(tmp_path / "run")
    assert profile["step"] == 5  # step 0 was as slow, but no median existed yet
    assert 0.005 < profile["median_s"] < 0.05 and profile["threshold_s"] == 0.1  # 3 x median, floored


def test_a_process_takes_at_most_max_profiles(tmp_path):
    rltrace.init(tmp_path / "run", profile={"after": 0.05, "max_profiles": 2, "pyspy": NO_PYSPY})
    for step in range(4):
        with rltrace.phase("reward", step=step):
            busy(0.2)
    rltrace.shutdown()
    assert [p["step"] for p in profiles(tmp_path / "run")] == [0, 1]


def test_memory_is_bounded(tmp_path):
    rltrace.init(tmp_path / "run", profile={"slow": 3})
    watchdog = watchdog_of(rltrace.current_run())
    for i in range(HISTORY * 2):
        with rltrace.phase("generate", step=i):
            pass
    for i in range(MAX_PHASES + 10):
        with rltrace.phase(f"user_phase_{i}"):
            pass
    assert len(watchdog._history["generate"]) == HISTORY
    assert len(watchdog._history) == MAX_PHASES and not watchdog._running
    rltrace.shutdown()


def test_a_forked_child_keeps_watching(tmp_path):
    rltrace.init(tmp_path / "run", profile={"after": 0.1, "pyspy": NO_PYSPY})
    pid = os.fork()
    if pid == 0:  # the child: its own watchdog thread must notice its slow phase
        try:
            with rltrace.phase("generate", step=7):
                busy(0.4)
            rltrace.shutdown()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    rows = wait_for_profiles(tmp_path / "run", lambda rows: rows)
    rltrace.shutdown()
    assert [(r["pid"], r["phase"], r["step"], r["status"]) for r in rows] == [
        (pid, "generate", 7, "missing_executable")
    ]
