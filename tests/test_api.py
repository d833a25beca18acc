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
from rltrace.cli.info import collect

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


def test_siblings_after_a_stepped_phase_take_its_step_as_the_readme_loop_writes_them(run_dir):
    """The README passes `step=` to `rollout` only: `reward`, `train`, `weight_sync` after it are in that step."""
    rltrace.init(run_dir)
    with rltrace.phase("warmup"):  # before any step: start-up, no step to take
        pass
    for step in range(2):
        with rltrace.phase("rollout", step=step):
            pass
        with rltrace.phase("reward"):
            with rltrace.phase("judge"):
                pass
        with rltrace.phase("train"):
            pass
    with rltrace.phase("eval", step=9):  # an explicit step still wins, and becomes the last one
        pass
    with rltrace.phase("save"):
        pass
    rltrace.shutdown()
    got = [(s["phase"], s["step"]) for s in spans(run_dir)]
    assert got == [("warmup", None), ("rollout", 0), ("reward", 0), ("judge", 0), ("train", 0),
                   ("rollout", 1), ("reward", 1), ("judge", 1), ("train", 1), ("eval", 9), ("save", 9)]


def test_step_is_never_taken_across_threads_asyncio_tasks_or_runs(run_dir, tmp_path):
    rltrace.init(run_dir)

    async def task(step):
        if step is not None:
            with rltrace.phase("generate", step=step):
                await asyncio.sleep(0.01)
        else:
            await asyncio.sleep(0.005)
            with rltrace.phase("score"):  # another task's step is not this one's
                pass

    async def main():
        await asyncio.gather(task(4), task(None))

    asyncio.run(main())
    with rltrace.phase("rollout", step=1):
        pass
    thread = threading.Thread(target=lambda: rltrace.phase("other_thread").__enter__().__exit__(None, None, None))
    thread.start()
    thread.join()
    rltrace.shutdown()
    assert {s["phase"]: s["step"] for s in spans(run_dir)} == {"generate": 4, "score": None, "rollout": 1,
                                                               "other_thread": None}
    other = tmp_path / "other"
    rltrace.init(other)
    with rltrace.phase("reward"):  # a new run: the last run's step 1 is not its step
        pass
    rltrace.shutdown()
    assert spans(other)[0]["step"] is None


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


def _zero_d_values():
    """0-d tensors of every kind a training loop has at hand, and numpy scalars: (name, value, number)."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    grad = torch.tensor(0.75, requires_grad=True) * 2  # a loss: part of a graph
    return [
        ("reward", torch.tensor(0.5), 0.5),
        ("bf16", torch.tensor(0.25, dtype=torch.bfloat16), 0.25),
        ("fp16", torch.tensor(1.5, dtype=torch.float16), 1.5),
        ("grad", grad, 1.5),
        ("leaf", torch.tensor(2.0, requires_grad=True), 2.0),
        ("int32", torch.tensor(7, dtype=torch.int32), 7),
        ("np32", np.float32(0.125), 0.125),
        ("np0d", np.array(3.5), 3.5),
        ("npint", np.int64(9), 9),
    ]


def test_zero_d_tensors_and_numpy_scalars_are_numbers_in_log_samples(run_dir):
    """A tensor reward is what most loops have at hand: stored as the number it holds, never dropped."""
    values = _zero_d_values()
    rltrace.init(run_dir)
    rltrace.log_samples(0, [{"sample_id": i, **{name: v for name, v, _ in values}} for i in range(2)])
    rltrace.log_samples(1, {name: [v, v] for name, v, _ in values})  # a dict of columns
    rltrace.log_samples(2, [{"reward": values[0][1]}, {"reward": 0.25}])  # tensors and floats in one column
    rltrace.shutdown()
    con = store.open(run_dir)
    names = [name for name, _, _ in values]
    rows = con.execute(f"SELECT step, {', '.join(names)} FROM samples WHERE step < 2 ORDER BY step").fetchall()
    assert rows == [(step, *(number for _, _, number in values)) for step in (0, 0, 1, 1)]
    assert con.execute("SELECT reward FROM samples WHERE step = 2").fetchall() == [(0.5,), (0.25,)]
    assert {str(t) for (t,) in con.execute("SELECT DISTINCT typeof(reward) FROM samples").fetchall()} == {"DOUBLE"}
    assert collect(str(run_dir))["drop_reasons"] == []


def test_zero_d_tensors_are_numbers_in_log_metrics_phases_and_freeze(run_dir):
    from rltrace import replay

    values = _zero_d_values()
    rltrace.init(run_dir)
    rltrace.log_metrics(0, **{name: v for name, v, _ in values})
    with rltrace.phase("train", step=0, **{name: v for name, v, _ in values}) as p:
        p.set(later=values[1][1])
    replay.freeze(0, [{"reward": v, "tag": name} for name, v, _ in values])  # one column, many kinds of number
    replay.flush()  # the replay writer holds two batches at a time
    replay.freeze(1, [{"reward": values[1][1], "sample_id": values[5][1]}, {"reward": values[1][1], "sample_id": values[5][1]}])
    replay.freeze(2, [{"adv": values[0][1]}, {"adv": values[1][1]}, {"adv": values[3][1]}])  # torch only, three dtypes
    replay.flush()
    rltrace.shutdown()
    con = store.open(run_dir)
    assert dict(con.execute("SELECT name, value FROM metrics WHERE step = 0 AND name NOT LIKE 'replay_%'").fetchall()) == \
        {name: number for name, _, number in values}
    (span,) = spans(run_dir)
    attrs = json.loads(span["attributes"])
    assert {name: attrs[f"rl.{name}"] for name, _, _ in values} == {name: number for name, _, number in values}
    assert attrs["rl.later"] == 0.25
    assert [r for (r,) in con.execute("SELECT reward FROM batches WHERE step = 0 ORDER BY sample_index").fetchall()] == \
        [number for _, _, number in values]
    batch = replay.load(run_dir, 1)  # all bf16: stored as numbers, given back as the tensors frozen
    assert [str(r.dtype) for r in batch["reward"]] == ["torch.bfloat16"] * 2 and float(batch["reward"][0]) == 0.25
    assert [int(i) for i in batch["sample_id"]] == [7, 7]
    assert con.execute("SELECT DISTINCT reward, sample_id FROM batches WHERE step = 1").fetchall() == [(0.25, 7)]
    assert replay.load(run_dir, 2)["adv"] == [0.5, 0.25, 1.5]
    assert collect(str(run_dir))["drop_reasons"] == []


class _CudaScalar:
    """Stands in for a 0-d CUDA tensor (no GPU on the test machines): it records the thread that reads it."""

    ndim = 0
    device = type("device", (), {"type": "cuda"})()

    def __init__(self, value, log):
        self.value, self.log = value, log

    def detach(self):
        return self

    def clone(self):
        self.log.append(("clone", threading.get_ident()))
        return _CudaScalar(self.value, self.log)

    def item(self):
        self.log.append(("item", threading.get_ident()))
        return self.value

    def __float__(self):
        self.log.append(("float", threading.get_ident()))
        return float(self.value)


def test_a_cuda_scalar_metric_is_read_on_the_writer_thread_after_its_copy(run_dir, monkeypatch):
    """No device sync on the training thread: the value is copied there (an async kernel) and an
    event recorded after the copy; the writer thread waits for the event, then reads the copy."""
    torch = pytest.importorskip("torch")
    log = []

    class Event:
        def record(self, stream):
            log.append(("record", threading.get_ident()))

        def synchronize(self):
            log.append(("synchronize", threading.get_ident()))

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    rltrace.init(run_dir)
    caller = threading.get_ident()
    rltrace.log_metrics(0, loss=_CudaScalar(0.5, log))
    assert log == [("clone", caller), ("record", caller)]  # nothing read yet
    rltrace.shutdown()
    assert [what for what, _ in log] == ["clone", "record", "synchronize", "item"]
    assert all(thread != caller for what, thread in log[2:])
    assert store.open(run_dir).execute("SELECT value FROM metrics WHERE name = 'loss'").fetchall() == [(0.5,)]


def test_numbers_cost_no_torch_import(tmp_path):
    """Users who do not use torch never pay for it: numpy values through every API that takes values."""
    code = (
        "import sys, numpy as np, rltrace\n"
        f"rltrace.init({str(tmp_path / 'run')!r})\n"
        "rltrace.log_samples(0, [{'reward': np.float32(0.5)}, {'reward': 1.0, 'x': np.array(2.0)}])\n"
        "rltrace.log_metrics(0, loss=np.float32(0.25))\n"
        "with rltrace.phase('train', step=np.int64(0), n=np.int32(3)):\n"
        "    pass\n"
        "rltrace.shutdown()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], env=python_env(), check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False"
    rows = store.open(tmp_path / "run").execute("SELECT reward, x FROM samples ORDER BY reward").fetchall()
    assert rows == [(0.5, None), (1.0, 2.0)]


def test_a_column_without_a_name_is_refused_with_a_reason_not_renamed(run_dir):
    """DuckDB would show a column named "" as C7: no query could rely on that name."""
    pa = pytest.importorskip("pyarrow")
    rltrace.init(run_dir)
    rltrace.log_samples(0, [{"": 1.0, "x": 2}, {"x": 3}])
    rltrace.log_samples(1, {"": [1.0], "x": [4]})
    rltrace.log_samples(2, pa.table({"": [1.0], "x": [5]}))
    rltrace.shutdown()
    con = store.open(run_dir)
    columns = [c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()]
    assert not [c for c in columns if c == "" or (c.startswith("C") and c[1:].isdigit())]
    assert con.execute("SELECT step, x FROM samples ORDER BY step, x").fetchall() == [(0, 2), (0, 3), (1, 4), (2, 5)]
    (reason,) = collect(str(run_dir))["drop_reasons"]
    assert reason["table"] == "sample values" and reason["column"] == "" and reason["count"] == 3
    assert "cannot be queried by name" in reason["reason"]


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


def test_sample_times_in_another_unit_are_recognised_not_dropped(run_dir):
    """`gen_start=time.time_ns()` (or ms) is stored in seconds, said once, never dropped."""
    rltrace.init(run_dir)
    ns = 1_796_000_000_000_000_000
    rltrace.log_samples(0, [{"sample_id": i, "gen_start": ns + i * 10**9, "gen_end": ns + (i + 2) * 10**9} for i in range(3)])
    rltrace.log_samples(1, [{"sample_id": 9, "gen_start": 1_796_000_000_000.0, "gen_end": 1_796_000_000_500.0}])  # ms
    rltrace.log_samples(2, [{"sample_id": 7, "gen_start": 1_796_000_000.0, "gen_end": 1_796_000_001.5}])  # seconds
    rltrace.shutdown()
    con = store.open(run_dir)
    rows = con.execute("SELECT step, gen_start, gen_end - gen_start FROM samples ORDER BY step, sample_id").fetchall()
    assert rows == [(0, 1_796_000_000.0, 2.0), (0, 1_796_000_001.0, 2.0), (0, 1_796_000_002.0, 2.0),
                    (1, 1_796_000_000.0, 0.5), (2, 1_796_000_000.0, 1.5)]
    assert collect(str(run_dir))["rows_dropped"] == 0
