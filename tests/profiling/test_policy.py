"""Profiling settings: environment variables, `init(profile=...)` dicts and policies, and errors
that name the setting; nothing of rltrace.profiling is imported unless a setting asks for it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import rltrace
from rltrace._config import RltraceConfigError
from rltrace.profiling import ProfilePolicy, TorchWindow, resolve_policy


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (
        "RLTRACE_PROFILE_SLOW",
        "RLTRACE_PROFILE_AFTER",
        "RLTRACE_HANG_TIMEOUT",
        "RLTRACE_TORCH_PROFILE",
        "RLTRACE_PROFILE_PHASES",
        "RLTRACE_PYSPY_FLAGS",
        "RLTRACE_PYSPY_RATE",
    ):
        monkeypatch.delenv(name, raising=False)


def test_environment_variables_make_a_policy(monkeypatch):
    monkeypatch.setenv("RLTRACE_PROFILE_SLOW", "3")
    monkeypatch.setenv("RLTRACE_HANG_TIMEOUT", "300")
    monkeypatch.setenv("RLTRACE_PROFILE_AFTER", "reward=2, train=30")
    monkeypatch.setenv("RLTRACE_TORCH_PROFILE", "train:5-7,rollout:3")
    monkeypatch.setenv("RLTRACE_PYSPY_FLAGS", "subprocesses,native")
    policy = resolve_policy(None)
    assert (policy.slow, policy.hang_timeout) == (3.0, 300.0)
    assert policy.after == {"reward": 2.0, "train": 30.0}
    assert policy.torch == (TorchWindow("train", 5, 7), TorchWindow("rollout", 3, 3))
    assert policy.pyspy_flags == ("subprocesses", "native")
    assert (policy.min_samples, policy.rate, policy.max_profiles) == (5, 100, 20)  # defaults
    assert policy.armed


def test_given_values_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("RLTRACE_PROFILE_SLOW", "3")
    assert resolve_policy({"slow": 5, "after": 10}).slow == 5.0
    assert resolve_policy({"after": 10}).after == {"*": 10.0}
    assert resolve_policy(ProfilePolicy(torch=["train:2"])).torch == (TorchWindow("train", 2, 2),)
    assert resolve_policy(resolve_policy({"slow": 2})) == resolve_policy({"slow": 2})  # idempotent


def test_nothing_set_arms_nothing():
    assert not resolve_policy(None).armed


@pytest.mark.parametrize(
    ("profile", "env", "names"),
    [
        ({"slow": -1}, {}, "slow"),
        ({"slo": 3}, {}, "unknown key"),
        ({"pyspy_flags": "nonblocking"}, {}, "unknown py-spy flag"),
        ({"torch": "train:7-5"}, {}, "train:7-5"),
        (None, {"RLTRACE_HANG_TIMEOUT": "soon"}, "RLTRACE_HANG_TIMEOUT"),
        (None, {"RLTRACE_PROFILE_AFTER": "=3"}, "RLTRACE_PROFILE_AFTER"),
        ("fast", {}, "ProfilePolicy"),
    ],
)
def test_bad_settings_raise_naming_the_setting(monkeypatch, profile, env, names):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RltraceConfigError, match=names):
        resolve_policy(profile)


def test_init_rejects_a_bad_policy_before_starting_the_run(tmp_path):
    with pytest.raises(RltraceConfigError, match="slow"):
        rltrace.init(tmp_path / "run", profile={"slow": 0})
    assert not (tmp_path / "run").exists()


def test_profiling_is_imported_only_when_a_setting_asks_for_it(tmp_path):
    code = f"""
import os, sys, threading, rltrace
def state():
    return "rltrace.profiling" in sys.modules, "rltrace-watchdog" in [t.name for t in threading.enumerate()]
rltrace.init({str(tmp_path / "a")!r})
print(state())
rltrace.shutdown()
os.environ["RLTRACE_PROFILE_SLOW"] = "3"
rltrace.init({str(tmp_path / "b")!r}, profile=False)
print(state())
rltrace.shutdown()
rltrace.init({str(tmp_path / "c")!r})
print(state())
rltrace.shutdown()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLTRACE_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:3] == ["(False, False)", "(False, False)", "(True, True)"]
