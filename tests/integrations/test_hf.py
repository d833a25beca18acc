"""`RltraceCallback` and `HFInstrumentor` on a real Hugging Face Trainer (tiny Llama, CPU, no download)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import rltrace  # noqa: E402
from rltrace import report, store  # noqa: E402
from rltrace.integrations.hf import HFInstrumentor, RltraceCallback  # noqa: E402

from .hf_train import make_trainer  # noqa: E402


def spans(run_dir) -> list[dict]:
    cur = store.open(run_dir).execute("SELECT * FROM spans ORDER BY start_ns")
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_callback_records_optimizer_steps_from_zero_with_their_metrics(run_dir, tmp_path):
    trainer = make_trainer(steps=3, callbacks=[RltraceCallback(str(run_dir))], output_dir=str(tmp_path / "out"))
    trainer.train()
    rltrace.shutdown()
    rows = spans(run_dir)
    steps = [r for r in rows if r["name"] == "step"]
    assert [(s["step"], s["weight_version"]) for s in steps] == [(0, 0), (1, 1), (2, 2)]
    assert len(steps) == trainer.state.global_step
    assert all(json.loads(s["attributes"])["rl.world_size"] == 1 and s["rank"] == 0 and s["role"] == "trainer"
               for s in steps)
    opt = [r for r in rows if r["name"] == "optimizer"]
    assert [o["parent_span_id"] for o in opt] == [s["span_id"] for s in steps]
    assert [o["step"] for o in opt] == [0, 1, 2]
    for o, s in zip(opt, steps):
        assert s["start_ns"] <= o["start_ns"] <= o["end_ns"] <= s["end_ns"]
    assert not any(r["is_open"] or r["status"] == "ERROR" for r in rows)
    con = store.open(run_dir)
    losses = con.execute("SELECT step, value FROM metrics WHERE name = 'loss' ORDER BY step").fetchall()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert losses == [(h["step"] - 1, pytest.approx(h["loss"])) for h in logged] and [s for s, _ in losses] == [0, 1, 2]


def test_a_trainer_reads_as_training_with_evaluation_saving_and_logging_of_their_own(run_dir, tmp_path):
    """Forward and backward are `train`, not idle time: the step is work from its start to the
    optimizer, and what follows it (log, eval, save) is named."""
    from rltrace import analysis

    trainer = make_trainer(steps=6, eval_steps=3, save_steps=3, callbacks=[RltraceCallback(str(run_dir))],
                           output_dir=str(tmp_path / "out"))
    trainer.train()
    trainer.evaluate()  # your own, after training: an eval of the final weights, in no step
    rltrace.shutdown()
    rows = spans(run_dir)
    by_name = {name: [r for r in rows if r["name"] == name] for name in ("step", "train", "optimizer", "log", "eval", "save")}
    steps = {s["step"]: s for s in by_name["step"]}
    assert sorted(steps) == list(range(6))
    for t in by_name["train"]:  # from the step's start to the optimizer, over both micro-batches
        s = steps[t["step"]]
        assert t["parent_span_id"] == s["span_id"] and t["start_ns"] >= s["start_ns"]
        assert json.loads(t["attributes"])["rl.micro_batches"] == 2
    assert [t["step"] for t in by_name["train"]] == list(range(6))
    assert [o["step"] for o in by_name["optimizer"]] == list(range(6))
    assert [x["step"] for x in by_name["log"]] == list(range(6))
    # evaluation and saving after steps 2 and 5 (global steps 3 and 6), each after the step and its log
    final = by_name["eval"].pop()
    assert (final["step"], final["weight_version"], final["start_ns"] > steps[5]["end_ns"]) == (None, 6, True)
    for name in ("eval", "save"):
        assert [(x["step"], x["weight_version"], x["parent_span_id"]) for x in by_name[name]] == [(2, 3, None), (5, 6, None)]
    for e, sv in zip(by_name["eval"], by_name["save"]):
        log = next(x for x in by_name["log"] if x["step"] == e["step"])
        assert steps[e["step"]]["end_ns"] <= log["start_ns"] <= log["end_ns"] <= e["start_ns"] <= e["end_ns"] <= sv["start_ns"]
    assert not any(r["is_open"] or r["status"] == "ERROR" for r in rows)
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [3, 6, 6]  # the last: ours

    con = store.open(run_dir)
    costs = analysis.cost_model(con).set_index("step")
    for step in range(6):
        work = costs.loc[step, "t_T"]
        if step in (2, 5):  # the step's window runs on through evaluation and saving
            work += sum((x["end_ns"] - x["start_ns"]) / 1e9 for x in by_name["eval"] + by_name["save"] if x["step"] == step)
        assert work >= 0.6 * costs.loc[step, "wall_s"], (step, costs.loc[step].to_dict())
    r = report.build(con)
    assert not any("waited" in f or "idle" in f for f in r["findings"]), r["findings"]
    assert all(w["share"] <= 0.2 for w in r["waits"]), r["waits"]
    assert {"train", "optimizer", "eval", "save", "log"} <= {p["phase"] for p in r["phases"]}


def test_instrumentor_adds_the_callback_and_a_raising_step_ends_with_the_error(run_dir, tmp_path, monkeypatch):
    import transformers.trainer

    monkeypatch.setenv("RLTRACE_RUN_DIR", str(run_dir))
    original = transformers.trainer.Trainer.__init__
    instrumentor = HFInstrumentor()
    assert instrumentor.instrument()
    try:
        trainer = make_trainer(steps=3, raise_at=1, output_dir=str(tmp_path / "out"))
        assert sum(isinstance(cb, RltraceCallback) for cb in trainer.callback_handler.callbacks) == 1
        with pytest.raises(RuntimeError, match="loss is NaN"):
            trainer.train()
    finally:
        instrumentor.uninstrument()
    assert transformers.trainer.Trainer.__init__ is original
    rltrace.shutdown()
    steps = [r for r in spans(run_dir) if r["name"] == "step"]
    assert [(s["step"], s["status"], s["is_open"]) for s in steps] == [(0, "UNSET", False), (1, "ERROR", False)]
    assert steps[1]["status_message"] == "RuntimeError: loss is NaN"


@pytest.mark.slow
def test_rltrace_run_traces_an_unmodified_trainer_script_and_its_crash(hf_crash_run):
    run_dir, out = hf_crash_run  # `rltrace run -- python hf_train.py --steps 3 --raise-at 2` (tests/conftest.py)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "RuntimeError: loss is NaN" in out.stderr
    steps = [r for r in spans(run_dir) if r["name"] == "step"]
    assert [(s["step"], s["status"]) for s in steps] == [(0, "UNSET"), (1, "UNSET"), (2, "ERROR")]
    said = report.build(store.open(run_dir))["findings"]
    assert said[0] == "trainer0 crashed at step 2 in `train`: RuntimeError: loss is NaN."  # raised in the loss
    assert not any("Open span" in s for s in said)
