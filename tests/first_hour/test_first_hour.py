"""The first hour of a new user: a loop written from the README as it stands (`user_loop.py`:
spawned rollout workers, a reward slow on some steps, a slow worker weight load), recorded once
with slow-phase profiling on, gives the right answers without instrumentation beyond the README's."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

import rltrace
from rltrace import analysis, report, store
from rltrace.cli.info import collect
from rltrace.report.findings import steps_text
from tests.conftest import python_env
from tests.profiling.conftest import PYSPY
from tests.ui.conftest import app, no_exceptions  # noqa: F401  (app: a fixture)
from tests.ui.conftest import components_scanned_once  # noqa: F401  (autouse: one component scan a session)

LOOP = Path(__file__).with_name("user_loop.py")
STEPS = 14
NO_STEP = "have no step"


@pytest.fixture(scope="module")
def user_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("first_hour") / "run"
    done = subprocess.run([sys.executable, str(LOOP), str(out), str(STEPS)], capture_output=True, text=True,
                          timeout=300, check=False,
                          env=python_env(RLTRACE_PROFILE_SLOW="3", RLTRACE_PYSPY=PYSPY))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_readme_loop_puts_every_phase_in_its_step(user_run):
    con = store.open(user_run)
    rows = con.execute("SELECT role, phase, count(*), count(step), min(step), max(step) FROM spans "
                       "GROUP BY ALL ORDER BY ALL").fetchall()
    assert {(role, phase) for role, phase, *_ in rows} == {
        ("trainer", "rollout"), ("trainer", "reward"), ("trainer", "train"), ("trainer", "weight_sync"),
        ("rollout", "generate"), ("rollout", "weight_load")}
    for role, phase, n, stepped, first, last in rows:
        assert (n, stepped, first, last) == (n, n, 0, STEPS - 1), (role, phase)
    r = report.build(con)
    assert r["unstepped"]["spans"] == 0 and not any(NO_STEP in f for f in r["findings"])
    assert r["t_T"] is not None and r["t_W"] is not None and r["t_reward"] > 0
    assert collect(str(user_run))["unstepped"]["spans"] == 0


def test_spans_no_step_holds_are_named_with_the_fix(run_dir, app):
    """A phase run on a thread of its own takes no step: `info`, `report` and the Overview say so, once."""
    rltrace.init(run_dir)
    with rltrace.phase("warmup"):  # before the first step: start-up, not a mistake
        pass
    for step in range(3):
        with rltrace.phase("rollout", step=step):
            pass

        def score():
            with rltrace.phase("reward"):
                pass
        thread = threading.Thread(target=score)
        thread.start()
        thread.join()
    rltrace.shutdown()
    sentence = ('3 spans (reward) have no step, so every per-step figure leaves them out: wrap the step in '
                '`rltrace.phase("step", step=…)` or pass `step=`.')
    assert collect(str(run_dir))["unstepped"] == {"spans": 3, "phases": [("reward", 3)]}
    info = subprocess.run([sys.executable, "-m", "rltrace", "info", str(run_dir)], capture_output=True, text=True,
                          env=python_env(COLUMNS="300"), check=True).stdout
    assert sentence in info
    assert [f for f in report.build(store.open(run_dir))["findings"] if NO_STEP in f] == [sentence]
    at = app(run_dir)  # the Overview
    no_exceptions(at)
    shown = "\n".join(str(e.value) for kind in ("info", "markdown") for e in getattr(at, kind)).replace("\\", "")
    assert sentence in shown


def _profiles(run: Path) -> dict[tuple, dict]:
    con = store.open(run)
    rows = con.execute("SELECT * FROM profiles WHERE kind = 'pyspy_record'").df().to_dict("records")
    out = {}
    for r in rows:
        frames = con.execute("SELECT frame, self_share, thread FROM profile_frames WHERE profile_id = ? ORDER BY rank",
                             [r["profile_id"]]).fetchall()
        out[(r["role"], r["rank"], r["phase"], r["step"])] = {**r, "frames": frames}
    return out


def test_each_slow_phase_gets_a_profile_of_itself_idle_waits_included(user_run):
    """The reward waiting on a judge names the wait, the CPU-bound one the verifier, the worker's
    slow weight load its own load: never the code that ran after the phase, nor another thread."""
    got = _profiles(user_run)
    expected = {("trainer", 0, "reward", 5): "call_remote_judge", ("trainer", 0, "reward", 11): "slow_verifier",
                ("rollout", 0, "weight_load", 7): "load_weights", ("trainer", 0, "weight_sync", 7): None}
    assert set(expected) <= set(got), sorted(got)
    for key, frame in expected.items():
        p = got[key]
        assert p["status"] == "ok" and p["samples"] > 0, (key, p["status"], p["message"])
        assert p["inside_share"] > 0 and all("MainThread" in thread for _, _, thread in p["frames"]), key
        if frame:
            assert p["frames"][0][:2] == (frame, pytest.approx(1.0, abs=0.2)), (key, p["frames"][:3])
    assert got[("trainer", 0, "reward", 5)]["idle_share"] > got[("trainer", 0, "reward", 11)]["idle_share"]
    assert got[("trainer", 0, "reward", 5)]["idle_share"] > 0.6  # a sleep: the thread was blocked


def test_start_up_and_unequal_siblings_are_not_told_as_waits(user_run):
    """Workers spawning at step 0 are starting up, not waiting for the trainer's rollout; worker 0
    idle while worker 1 (3x as slow) generates is an imbalance, not a wait on worker 1."""
    con = store.open(user_run)
    r = report.build(con)
    roles = {p["process_id"]: p["role"] for p in collect(str(user_run))["processes"]}
    waits = analysis.waits(con)
    step0 = waits[(waits["step"] == 0) & (waits["role"] == "rollout")]["seconds"].sum()
    startup = {s["name"]: s["seconds"] for s in r["startups"]}
    assert set(startup) == {"rollout0", "rollout1"} and min(startup.values()) >= 1.0
    assert step0 < 0.5 * min(startup.values())  # the start-up is not in the waits
    assert not any(roles[p] == roles.get(o) for p, o in zip(waits["process_id"], waits["waited_for_process"]))
    said = r["findings"]
    assert any(f.startswith("Start-up: rollout") and "not a wait" in f for f in said)
    [imbalance] = [i for i in r["imbalance"] if i["phase"] == "generate"]
    assert (imbalance["slow_name"], imbalance["fast_name"]) == ("rollout1", "rollout0") and imbalance["ratio"] > 1.5
    assert not any("rollout0 waited" in f and "on rollout1" in f for f in said)


def test_every_slow_step_is_named_with_its_period(user_run):
    r = report.build(store.open(user_run))
    [reward] = [o for o in r["outliers"] if o["stage"] == "reward"]
    assert {5, 11} <= set(reward["over_steps"])  # (a busy machine may slow another step past 3x too)
    assert any(f"took over 3x the median: {steps_text(reward['over_steps'])})" in f for f in r["findings"])
    assert steps_text([3, 13, 23, 33]) == "steps 3, 13, 23 and 33, every 10 steps"
    assert steps_text(list(range(3, 200, 10))) == "steps 3, 13, 23, 33, 43, 53, 63, 73, 83, 93 and 10 more, every 10 steps"


def test_compare_includes_every_logged_scalar(user_run):
    from rltrace.report.compare import compare

    con = store.open(user_run)
    whole, start = report.build(con), report.build(con, steps=(0, 5))
    listed = compare(whole, start)
    rows = {(r["what"], r["unit"]): r for r in listed}
    loss = rows[("loss", "mean over steps")]  # the user's own scalar, not only rltrace's known names
    assert loss["other"] == pytest.approx(sum(1 / (1 + s) for s in range(6)) / 6)
    assert [r["unit"] for r in listed if r["what"] == "reward_mean"] == ["mean over steps", "last step"]  # said once
