"""The demo RL loop with profiling turned on by environment variables, as a user would: a slow
reward span gets a py-spy profile naming the slow verifier, and a hung rollout worker gets a
stack dump showing where it is stuck."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rltrace import _names, store
from rltrace.profiling import profiles_for_spans

from .conftest import frames, profiles, program_env

REPO = Path(__file__).resolve().parents[2]
SMALL = ("--prompts-per-step", "2", "--group-size", "4", "--warmup-max-steps", "3")


def run_demo(out: Path, *args: str, **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "examples.tiny_grpo", "--out", str(out), *args, *SMALL],
        cwd=REPO,
        env=program_env(**settings),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_slow_reward_span_gets_a_profile_naming_the_slow_verifier(tmp_path):
    # only reward phases trigger, as for a user chasing a slow reward: on a loaded machine another
    # phase can also run 3x its median and take the one py-spy recording meanwhile
    slow = {"RLTRACE_PROFILE_SLOW": "3", "RLTRACE_PROFILE_MIN_SAMPLES": "2", "RLTRACE_PROFILE_MIN_SECONDS": "0.1",
            "RLTRACE_PROFILE_PHASES": "reward"}
    named, tries = [], []
    for attempt in range(3):  # a slow call (~0.5 s) can end before py-spy has attached on a loaded machine
        out = tmp_path / f"slow{attempt}"
        proc = run_demo(out, "--steps", "8", "--slow-reward", "0.1", **slow)  # slow calls at steps 2 and 7
        assert proc.returncode == 0, proc.stderr[-3000:]
        rewards = [p for p in profiles(out) if p["phase"] == "reward"]
        assert rewards, "a slow reward phase was profiled"
        con = store.open(out)
        for profile in rewards:
            assert (profile["kind"], profile["trigger"]) == ("pyspy_record", "slow")
            assert profile["status"] in ("ok", "no_samples"), profile  # ended while py-spy attached: no samples
            (duration,) = con.execute(
                "SELECT duration_s FROM spans WHERE trace_id = ? AND span_id = ? AND name = 'reward'",
                [profile["trace_id"], profile["span_id"]],
            ).fetchone()
            assert duration > 3 * profile["median_s"]
            if profile["status"] == "ok":
                top = frames(out, profile["profile_id"])[0]
                named.append((top["frame"], top["file"]))
        tries.append([p["status"] for p in rewards])
        if named:
            break
    # a profile with samples names the slow verifier as its top frame
    assert any(f == "slow_verifier" and file.endswith("faults.py") for f, file in named), (tries, named)


@pytest.mark.slow
def test_hung_rollout_worker_gets_a_stack_dump(tmp_path):
    out = tmp_path / "hang"
    proc = run_demo(out, "--steps", "4", "--hang-after", "2", "--hang-timeout", "5", RLTRACE_HANG_TIMEOUT="2")
    assert proc.returncode == 3, proc.stderr[-3000:]  # the demo gives up on the worker after 5 s
    [dump] = [p for p in profiles(out) if p["phase"] == "generate"]
    assert (dump["kind"], dump["trigger"], dump["status"], dump["step"]) == ("pyspy_dump", "hang", "ok", 2)
    con = store.open(out)
    # never finished: still open, or ended by rltrace (status ERROR) when its worker exited with it open
    (is_open, message), = con.execute("SELECT is_open, status_message FROM spans WHERE span_id = ?",
                                      [dump["span_id"]]).fetchall()
    assert is_open or message == _names.UNFINISHED_AT_EXIT
    stack = [f["frame"] for f in frames(out, dump["profile_id"])]
    assert "RolloutWorker.generate" in stack
    top = profiles_for_spans(con).set_index("profile_id").loc[dump["profile_id"]]
    assert top["top_frame"] == "RolloutWorker.generate" and top["top_file"].endswith("worker.py")
