"""The public API as a training loop uses it: phases, metrics, samples, context across threads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import warnings

import pyarrow as pa
import pytest

import rltrace
from rltrace import api, store
from rltrace._config import RltraceConfigError

from .conftest import PYTHON, python_env


def spans(run_dir, where: str = "true") -> list[dict]:
    con = store.open(run_dir)
    cur = con.execute(f"SELECT * FROM spans WHERE {where} ORDER BY start_ns")
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]


def test_phase_records_rl_attributes_nesting_and_inheritance(run_dir):
    rltrace.init(run_dir, role="trainer", rank=0)
    with rltrace.phase("step", step=7, weight_version=3):
        with rltrace.phase("weight_sync", method="disk", bytes=1024, **{"gen_ai.system": "x"}) as p:
            p.set(chunks=4)
    rltrace.shutdown()
    step, sync = spans(run_dir)
    assert (step["name"], step["phase"], step["step"], step["weight_version"]) == ("step", "step", 7, 3)
    assert step["parent_span_id"] is None and step["is_open"] is False
    assert (sync["phase"], sync["step"], sync["weight_version"]) == ("weight_sync", 7, 3)  # inherited
    assert sync["parent_span_id"] == step["span_id"] and sync["trace_id"] == step["trace_id"]
    attrs = json.loads(sync["attributes"])
    assert attrs == {"rl.method": "disk", "rl.bytes": 1024, "gen_ai.system": "x", "rl.chunks": 4,
                     "rl.operation.name": "rl.sync"}  # the OTel rl.* proposal's group, alongside (docs/store.md)
    assert (sync["role"], sync["rank"]) == ("trainer", 0)
    assert sync["thread_id"] == threading.get_ident() and sync["thread_name"] == "MainThread"
    assert 0 <= sync["duration_s"] <= step["duration_s"]


def test_explicit_step_overrides_the_enclosing_phase(run_dir):
    rltrace.init(run_dir)
    with rltrace.phase("step", step=1, weight_version=1):
        with rltrace.phase("eval", step=0):
            pass
    rltrace.shutdown()
    evaluation = spans(run_dir, "phase = 'eval'")[0]
    assert (evaluation["step"], evaluation["weight_version"]) == (0, 1)


def test_exception_is_recorded_and_reraised(run_dir):
    rltrace.init(run_dir)
    with pytest.raises(ZeroDivisionError):
        with rltrace.phase("reward", step=2):
            1 / 0
    rltrace.shutdown()
    (span,) = spans(run_dir)
    assert span["status"] == "ERROR" and "ZeroDivisionError" in span["status_message"]
    (event,) = json.loads(span["events"])
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "ZeroDivisionError"


def test_decorator_on_sync_and_async_functions(run_dir):
    rltrace.init(run_dir)

    @rltrace.phase("reward", verifier="exact")
    def score(x):
        return x * 2

    @rltrace.phase("generate")
    async def generate(x):
        await asyncio.sleep(0)
        return x + 1

    assert score(2) == 4 and score(3) == 6
    assert asyncio.run(generate(1)) == 2
    assert score.__name__ == "score"
    rltrace.shutdown()
    rows = spans(run_dir)
    assert [r["phase"] for r in rows] == ["reward", "reward", "generate"]
    assert json.loads(rows[0]["attributes"]) == {"rl.verifier": "exact", "rl.operation.name": "rl.reward"}
    assert rows[0]["span_id"] != rows[1]["span_id"]


def test_decorating_a_generator_warns_and_leaves_it_alone():
    def gen():
        yield 1

    with pytest.warns(UserWarning, match="generator"):
        wrapped = rltrace.phase("rollout")(gen)
    assert wrapped is gen


def test_user_mistakes_raise_at_the_call_site(run_dir):
    rltrace.init(run_dir)
    with pytest.raises(TypeError, match="step must be an integer"):
        rltrace.phase("train", step=1.5)
    with pytest.raises(ValueError, match="non-empty string"):
        rltrace.phase("")
    with pytest.raises(TypeError, match="not a number"):
        rltrace.log_metrics(0, loss="high")
    with pytest.raises(ValueError, match="set by rltrace itself"):
        rltrace.log_samples(0, [{"step": 1, "reward": 0.0}])
    with pytest.raises(TypeError, match="rows must be dicts"):
        rltrace.log_samples(0, [1, 2, 3])
    p = rltrace.phase("train")
    with p:
        with pytest.raises(RuntimeError, match="already running"):
            p.__enter__()


def test_numpy_and_torch_scalars_are_accepted(run_dir):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    rltrace.init(run_dir)
    with rltrace.phase("train", step=np.int64(4), loss=torch.tensor(0.5), ids=[np.int32(1), 2]):
        pass
    rltrace.log_metrics(torch.tensor(4), loss=torch.tensor(0.25), grad_norm=np.float32(1.5))
    rltrace.shutdown()
    (span,) = spans(run_dir)
    assert span["step"] == 4 and json.loads(span["attributes"]) == {"rl.loss": 0.5, "rl.ids": [1, 2],
                                                                "rl.operation.name": "rl.train"}
    metrics = dict(store.open(run_dir).execute("SELECT name, value FROM metrics WHERE step = 4").fetchall())
    assert metrics == {"loss": 0.25, "grad_norm": 1.5}


def test_log_metrics_and_samples_land_in_their_views(run_dir):
    rltrace.init(run_dir, role="trainer", rank=1)
    rltrace.log_metrics(3, reward_mean=0.5, loss=float("nan"))
    rows = [
        {"sample_id": i, "group_id": i // 2, "reward": i, "weight_version": [1, 2] if i == 0 else 2, "train_version": 3, "tag": "a"}
        for i in range(4)
    ]
    rltrace.log_samples(3, rows)
    rltrace.log_samples(4, {"sample_id": [10, 11], "reward": [0.1, 0.2], "weight_version": [4, 4], "train_version": [4, 5]})
    rltrace.log_samples(5, pa.table({"sample_id": [20], "response_len": [9]}))
    rltrace.log_samples(6, [])
    rltrace.shutdown()
    con = store.open(run_dir)
    metrics = con.execute("SELECT step, name, value, role, rank FROM metrics ORDER BY name").fetchall()
    assert metrics[0][:2] == (3, "loss") and metrics[0][2] != metrics[0][2]  # NaN is kept
    assert metrics[1] == (3, "reward_mean", 0.5, "trainer", 1)
    samples = con.execute(
        "SELECT step, sample_id, reward, weight_version, weight_versions, staleness, tag, response_len "
        "FROM samples ORDER BY step, sample_id"
    ).fetchall()
    assert len(samples) == 7
    assert samples[0] == (3, "0", 0.0, 1, [1, 2], 2, "a", None)  # a list of versions: the oldest is v_s
    assert samples[1][3:6] == (2, None, 1)
    assert samples[4][:6] == (4, "10", 0.1, 4, None, 0)
    assert samples[6] == (5, "20", None, None, None, None, None, 9)
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE samples)").fetchall())
    assert types["reward"] == "DOUBLE" and types["sample_id"] == "VARCHAR" and types["gen_start"] == "DOUBLE"


def test_inject_and_attach_continue_a_trace_on_another_thread(run_dir):
    rltrace.init(run_dir)
    carriers = {}
    with rltrace.phase("rollout", step=5, weight_version=2):
        carriers["c"] = rltrace.inject()

    def worker():
        with rltrace.attach(carriers["c"]):
            with rltrace.phase("generate"):
                pass

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    rltrace.shutdown()
    gen = spans(run_dir, "phase = 'generate'")[0]
    roll = spans(run_dir, "phase = 'rollout'")[0]
    assert gen["parent_span_id"] == roll["span_id"] and gen["trace_id"] == roll["trace_id"]
    assert (gen["step"], gen["weight_version"]) == (5, 2)  # carried in W3C baggage
    assert carriers["c"]["traceparent"].startswith(f"00-{roll['trace_id']}-{roll['span_id']}-")


def test_traceparent_in_a_child_process_environment(run_dir):
    rltrace.init(run_dir, role="trainer")
    with rltrace.phase("rollout", step=1):
        carrier = rltrace.inject()
        code = (
            "import rltrace\n"
            f"rltrace.init({str(run_dir)!r}, role='rollout', rank=0)\n"
            "with rltrace.attach():\n"
            "    with rltrace.phase('generate'):\n"
            "        pass\n"
        )
        env = python_env(TRACEPARENT=carrier["traceparent"], BAGGAGE=carrier["baggage"])
        subprocess.run([PYTHON, "-c", code], env=env, check=True, timeout=120)
    rltrace.shutdown()
    gen = spans(run_dir, "phase = 'generate'")[0]
    roll = spans(run_dir, "phase = 'rollout'")[0]
    assert gen["parent_span_id"] == roll["span_id"] and gen["role"] == "rollout" and gen["step"] == 1
    assert gen["process_id"] != roll["process_id"]


def test_no_init_means_no_op_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with rltrace.phase("train", step=1) as p:
        p.set(x=1)
        assert p.span is None and p.trace_id is None
    rltrace.log_metrics(1, loss=1.0)
    rltrace.log_samples(1, [{"reward": 1.0}])
    assert rltrace.inject() == {}
    assert list(tmp_path.iterdir()) == []


def test_disabled_by_environment_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_DISABLED", "1")
    run = rltrace.init(tmp_path / "run")
    assert getattr(run, "disabled", False)
    with rltrace.phase("train", step=1):
        pass
    rltrace.log_metrics(1, loss=1.0)
    assert not (tmp_path / "run").exists()


def test_run_dir_from_environment_needs_no_code_change(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_RUN_DIR", str(tmp_path / "envrun"))
    monkeypatch.setenv("RLTRACE_ROLE", "reward")
    monkeypatch.setenv("RANK", "3")
    with rltrace.phase("reward", step=0):
        pass
    run = rltrace.current_run()
    assert (run.role, run.rank) == ("reward", 3)
    rltrace.shutdown()
    (span,) = spans(tmp_path / "envrun")
    assert (span["role"], span["rank"]) == ("reward", 3)


def test_bad_settings_fail_at_init_with_the_variable_named(run_dir, monkeypatch):
    monkeypatch.setenv("RLTRACE_FLUSH_INTERVAL", "soon")
    with pytest.raises(RltraceConfigError, match="RLTRACE_FLUSH_INTERVAL"):
        rltrace.init(run_dir)
    monkeypatch.delenv("RLTRACE_FLUSH_INTERVAL")
    with pytest.raises(RltraceConfigError, match="rank=-1 is invalid"):
        rltrace.init(run_dir, rank=-1)
    with pytest.raises(RltraceConfigError, match="needs a run directory"):
        rltrace.init()
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(RltraceConfigError, match=r"pip install 'rltrace\[otlp\]'"):
        rltrace.init(run_dir, otlp_endpoint="http://127.0.0.1:9")


def test_init_twice_returns_the_same_run_and_new_args_start_a_new_one(run_dir, tmp_path):
    a = rltrace.init(run_dir, role="trainer")
    assert rltrace.init(run_dir, role="trainer") is a
    b = rltrace.init(tmp_path / "other", role="trainer")
    assert b is not a and rltrace.current_run() is b
    assert a.manifest["run_id"] != b.manifest["run_id"]


def test_processes_of_one_run_share_its_id_and_config(run_dir):
    run = rltrace.init(run_dir, role="trainer", config={"lr": 0.001, "group_size": 8})
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["config"] == {"lr": 0.001, "group_size": 8}
    code = f"import rltrace; r = rltrace.init({str(run_dir)!r}, role='rollout', config={{'other': 1}}); print(r.run_id)"
    out = subprocess.run([PYTHON, "-c", code], env=python_env(), check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == run.run_id
    assert json.loads((run_dir / "run.json").read_text())["config"] == {"lr": 0.001, "group_size": 8}


def test_internal_fault_never_breaks_the_loop(run_dir, monkeypatch):
    """Outside pytest a fault inside rltrace is logged and the phase runs untraced."""
    run = rltrace.init(run_dir)
    monkeypatch.delenv("PYTEST_CURRENT_TEST")

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(run.tracer, "start_span", broken)
    ran = False
    with warnings.catch_warnings():
        with rltrace.phase("train", step=1) as p:
            ran = True
    assert ran and p.span is None


def test_run_and_disabled_run_both_say_whether_they_record(run_dir, monkeypatch):
    run = rltrace.init(run_dir)
    assert run.disabled is False
    rltrace.shutdown()
    monkeypatch.setenv("RLTRACE_DISABLED", "1")
    assert rltrace.init(run_dir).disabled is True


def test_current_run_only_looks_and_never_creates_a_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_RUN_DIR", str(tmp_path / "envrun"))
    assert rltrace.current_run() is None
    assert not (tmp_path / "envrun").exists()
    rltrace.log_metrics(0, loss=1.0)  # a recording call still starts the run from the environment
    assert rltrace.current_run() is not None and (tmp_path / "envrun").is_dir()


DEFAULT_ROLE_WARNING = "continues a trace from another process but records as role 'trainer', the default"
REMOTE_CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def test_default_role_warns_once_when_the_process_continues_another_processs_trace(run_dir, monkeypatch):
    monkeypatch.setattr(api, "_remote_parent", False)
    monkeypatch.setattr(api, "_role_warned", False)
    rltrace.init(run_dir)
    with rltrace.phase("rollout", step=0):
        own = rltrace.inject()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rltrace.attach(own):  # its own carrier (another thread of this process): no warning
            pass
    with pytest.warns(UserWarning, match=DEFAULT_ROLE_WARNING):
        with rltrace.attach(REMOTE_CARRIER):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rltrace.attach(REMOTE_CARRIER):  # once per process
            pass


def test_default_role_warns_at_init_after_a_remote_carrier_and_not_when_chosen(run_dir, monkeypatch):
    monkeypatch.setattr(api, "_remote_parent", False)
    monkeypatch.setattr(api, "_role_warned", False)
    with rltrace.attach(REMOTE_CARRIER):  # before init: nothing to warn about yet
        with pytest.warns(UserWarning, match=DEFAULT_ROLE_WARNING):
            rltrace.init(run_dir)
    rltrace.shutdown()
    monkeypatch.setattr(api, "_role_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rltrace.init(run_dir, role="rollout", rank=0)
        rltrace.attach(REMOTE_CARRIER).detach()
        rltrace.shutdown()
        monkeypatch.setenv("RLTRACE_ROLE", "trainer")  # chosen by the environment, even if it is the default
        rltrace.init(run_dir)
        rltrace.attach(REMOTE_CARRIER).detach()
