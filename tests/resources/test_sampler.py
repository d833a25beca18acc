"""The resource sampler for real on this machine's CPU: rows join the phases they ran under."""

from __future__ import annotations

import time

import pytest

import rltrace
from rltrace import analysis, store
from rltrace._config import RltraceConfigError


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_cpu_busy_phase_and_a_sleeping_phase_are_told_apart(run_dir):
    """Known answer: `train` spins, `rollout` sleeps; the samples under each match the CPU time the
    process measured itself over each phase (on a loaded machine a spinning thread gets less than a core)."""
    rltrace.init(run_dir, role="trainer", resources=True, resources_interval=0.1)
    expected = {}
    for step in range(2):
        with rltrace.phase("step", step=step):
            for name, work in (("train", _spin), ("rollout", time.sleep)):
                cpu, wall = time.process_time(), time.perf_counter()
                with rltrace.phase(name):
                    work(1.5)
                expected[step, name] = 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)
    rltrace.shutdown()
    con = store.open(run_dir)
    per = analysis.phase_resources(con)
    cpu = per[per["kind"] == "cpu"].set_index(["step", "phase"])
    for step in range(2):
        train, rollout = cpu.loc[(step, "train")], cpu.loc[(step, "rollout")]
        assert train["samples"] >= 5 and rollout["samples"] >= 5  # ~15 each
        # the samples straddling a boundary are the only mixed ones
        assert abs(train["util_mean_pct"] - expected[step, "train"]) < 10 + 0.2 * expected[step, "train"], (cpu, expected)
        assert rollout["util_mean_pct"] < 10, cpu
        assert train["util_mean_pct"] > rollout["util_mean_pct"] + 0.5 * expected[step, "train"], (cpu, expected)
        assert train["mem_max_bytes"] > 10e6  # a Python process's RSS
    # the step holds both: its mean lies between
    assert cpu.loc[(0, "rollout"), "util_mean_pct"] < cpu.loc[(0, "step"), "util_mean_pct"] < cpu.loc[(0, "train"), "util_mean_pct"]
    # this machine has no NVIDIA driver: the GPU path is skipped with its reason stored
    notes = analysis.resource_notes(con)
    gpu = notes[notes["kind"] == "gpu"]
    if len(gpu):
        assert "NVIDIA" in gpu["note"].iloc[0] or "nvidia-ml-py" in gpu["note"].iloc[0]


def test_off_by_default_and_on_from_the_environment(run_dir, monkeypatch, tmp_path):
    rltrace.init(run_dir)
    with rltrace.phase("train", step=0):
        time.sleep(0.3)
    rltrace.shutdown()
    assert store.open(run_dir).execute("SELECT count(*) FROM resources").fetchone()[0] == 0

    monkeypatch.setenv("RLTRACE_RESOURCES", "1")
    monkeypatch.setenv("RLTRACE_RESOURCES_INTERVAL", "0.05")
    other = tmp_path / "env_run"
    rltrace.init(other)
    time.sleep(0.5)
    rltrace.flush()  # hands pending samples to the writer without ending the run
    n = store.open(other).execute("SELECT count(*) FROM resources WHERE kind = 'cpu' AND note IS NULL").fetchone()[0]
    assert n >= 3


def test_a_bad_interval_is_a_config_error(run_dir, monkeypatch):
    monkeypatch.setenv("RLTRACE_RESOURCES_INTERVAL", "0")
    with pytest.raises(RltraceConfigError, match="RLTRACE_RESOURCES_INTERVAL"):
        rltrace.init(run_dir, resources=True)
    with pytest.raises(RltraceConfigError, match="resources_interval"):
        rltrace.init(run_dir, resources=True, resources_interval=-1.0)


def test_without_psutil_memory_is_skipped_with_a_stored_reason(run_dir, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError("No module named 'psutil'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    rltrace.init(run_dir, resources=True, resources_interval=0.05)
    time.sleep(0.3)
    rltrace.shutdown()
    con = store.open(run_dir)
    rows = con.execute("SELECT util_pct, mem_bytes FROM resources WHERE kind = 'cpu' AND note IS NULL").df()
    assert len(rows) >= 2 and rows["util_pct"].notna().all() and rows["mem_bytes"].isna().all()
    notes = analysis.resource_notes(con)
    assert notes[notes["kind"] == "cpu"]["note"].str.contains("psutil is not installed").any()
