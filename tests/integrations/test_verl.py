"""The verl instrumentor on verl's real timer code (`marked_timer`, `simple_timer`, `auto_await`).

verl's trainer needs GPU workers (vLLM/SGLang engines, FSDP/Megatron actors) for a real `fit`;
`verl_app/verl_loop.py` runs its timers in the shape of `RayPPOTrainer.fit` instead (docs/integrations.md).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import rltrace
from rltrace import store

pytest.importorskip("verl.utils.profiler")
from rltrace.integrations import verl as verl_hook  # noqa: E402

from ..conftest import python_env  # noqa: E402

APP = Path(__file__).parent / "verl_app"
sys.path.insert(0, str(APP))
import verl_loop  # noqa: E402

MAPPED = {"start_profile": "start_profile", "step": "step", "gen": "rollout", "reward": "reward",
          "old_log_prob": "train", "ref": "train", "adv": "train", "update_actor": "train",
          "update_weights": "weight_sync", "my_custom_block": "my_custom_block"}


@pytest.fixture
def instrumented():
    assert verl_hook.instrument()
    yield
    verl_hook.uninstrument()


def _check(run_dir, timings):
    con = store.open(run_dir)
    spans = con.execute("""SELECT name, phase, step, span_id, parent_span_id, (end_ns - start_ns) / 1e9 AS s, status
                           FROM spans WHERE NOT is_open ORDER BY start_ns""").df()
    assert len(spans) == len(timings) * len(MAPPED)
    assert dict(zip(spans["name"], spans["phase"])) == MAPPED  # every block, mapped or under its own name
    for t in timings:
        step = t["global_steps"] - 1  # rltrace steps are 0-based
        mine = spans[spans["step"] == step]
        assert sorted(mine["name"]) == sorted(MAPPED)
        (step_id,) = mine.loc[mine["name"] == "step", "span_id"]
        inside = mine[~mine["name"].isin(["step", "start_profile"])]
        assert (inside["parent_span_id"] == step_id).all()  # nested under the one step span
        assert mine.loc[mine["name"] == "start_profile", "parent_span_id"].isna().all()
        for name, seconds in mine[["name", "s"]].itertuples(index=False):
            assert seconds == pytest.approx(t[name], abs=0.02), name  # verl's own timing_raw, still filled
    return spans


def test_marked_timer_blocks_become_phases(instrumented, run_dir):
    rltrace.init(run_dir)
    timings = verl_loop.Trainer().fit(3)
    rltrace.shutdown()
    assert all(set(t) >= set(MAPPED) for t in timings)
    _check(run_dir, timings)
    from rltrace.report.build import build

    r = build(store.open(run_dir))
    assert r["t_W"] == pytest.approx(verl_loop.SLEEP["update_weights"], abs=0.01)
    assert r["bottleneck"]["stage"] in ("rollout", "train")


def test_live_spans_and_imported_tensorboard_log_agree(instrumented, tmp_path, monkeypatch):
    """One run, both ways: the hook's spans, and the TensorBoard log verl's own Tracking wrote."""
    from verl.utils.tracking import Tracking

    from rltrace.importers.metrics import import_metrics
    from rltrace.report.build import build

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["tensorboard"])
    rltrace.init(tmp_path / "live")
    verl_loop.Trainer(tracking).fit(3)
    rltrace.shutdown()
    tracking.logger["tensorboard"].finish()
    import_metrics([tmp_path / "tb"], tmp_path / "imported")
    live, imported = (build(store.open(tmp_path / d)) for d in ("live", "imported"))
    assert [s["step"] for s in live["steps"]] == [s["step"] for s in imported["steps"]] == [0, 1, 2]
    for a, b in zip(live["steps"], imported["steps"]):
        for key in ("t_R", "t_T", "t_W", "t_reward", "wall_s"):
            assert a[key] == pytest.approx(b[key], abs=2e-3), (a["step"], key)  # the span vs verl's Timer
    assert live["bottleneck"]["stage"] == imported["bottleneck"]["stage"]


def test_error_in_block_is_recorded_and_raised(instrumented, run_dir):
    from verl.utils.profiler import marked_timer

    rltrace.init(run_dir)
    timing_raw: dict[str, float] = {}
    with pytest.raises(ZeroDivisionError):
        with marked_timer("gen", timing_raw):
            1 / 0
    rltrace.shutdown()
    rows = store.open(run_dir).execute("SELECT name, phase, status FROM spans").fetchall()
    assert rows == [("gen", "rollout", "ERROR")]


def test_uninstrument_restores_verl(run_dir):
    import verl.utils.profiler.performance as perf

    before = perf._timer
    verl_hook.instrument()
    assert perf._timer is not before
    verl_hook.uninstrument()
    assert perf._timer is before


def test_weight_sync_bytes_from_checkpoint_engine_metrics(run_dir):
    """verl's real `auto_await` around a stand-in manager (the real one drives GPU checkpoint engines)."""
    from verl.utils.profiler import marked_timer
    from verl.utils.ray_utils import auto_await

    class CheckpointEngineManager:  # stand-in: returns what DeltaCheckpointEngine reports per sync
        @auto_await
        async def update_weights(self, global_steps=None):
            await asyncio.sleep(0.001)
            return {"checkpoint_engine/payload_mbytes": 12.5, "checkpoint_engine/flushes": 3.0}

    module = types.SimpleNamespace(CheckpointEngineManager=CheckpointEngineManager)
    verl_hook.instrument()
    verl_hook._patch_sync(module)
    try:
        rltrace.init(run_dir)
        timing_raw: dict[str, float] = {}
        with marked_timer("update_weights", timing_raw):
            assert CheckpointEngineManager().update_weights(3)["checkpoint_engine/flushes"] == 3.0
        rltrace.shutdown()
    finally:
        verl_hook.uninstrument()
    row = store.open(run_dir).execute(
        """SELECT phase, json_extract_string(attributes, '$."rl.bytes"') FROM spans""").fetchall()
    assert row == [("weight_sync", str(int(12.5 * 2**20)))]


@pytest.mark.slow  # imports verl (torch, tensordict, ...) in a fresh interpreter: ~30-60 s here
def test_rltrace_run_instruments_an_unchanged_verl_script(run_dir):
    env = python_env(RLTRACE_INSTRUMENTORS="rltrace.integrations.verl:VerlInstrumentor")
    argv = [sys.executable, "-m", "rltrace", "run", "--run-dir", str(run_dir), "--",
            sys.executable, str(APP / "verl_loop.py"), "2"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    timings = json.loads(out.stdout.strip().splitlines()[-1])
    _check(run_dir, timings)


@pytest.mark.slow  # starts a local Ray instance: ~20 s here
def test_rltrace_run_reaches_ray_workers(run_dir):
    """A Ray worker started by the driver inherits the launcher's start-up hook and traces verl's timers.

    Ray ends its workers without running atexit, so the worker flushes before returning (see docs)."""
    pytest.importorskip("ray")
    env = python_env(RLTRACE_INSTRUMENTORS="rltrace.integrations.verl:VerlInstrumentor")
    argv = [sys.executable, "-m", "rltrace", "run", "--run-dir", str(run_dir), "--",
            sys.executable, str(APP / "verl_ray.py")]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    worker = json.loads(out.stdout.strip().splitlines()[-1])
    assert worker["traced"] is True
    rows = store.open(run_dir).execute("SELECT name, phase, pid FROM spans WHERE NOT is_open").fetchall()
    assert rows == [("generate_sequences", "generate_sequences", worker["pid"])]
