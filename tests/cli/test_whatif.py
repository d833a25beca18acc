"""`rltrace whatif`: the predictions as text and JSON, several scenarios, and the options' checks."""

import json

import pytest

from rltrace.cli import main
from rltrace.testing import RunBuilder

from ..analysis.test_whatif import _loop


@pytest.fixture
def run(tmp_path):
    _loop(tmp_path, gens=[0.3, 0.5], train=1.0, sync=0.2)  # sync step 1.7 s; async: train + sync, 1.2 s
    return str(tmp_path / "run")


def test_json_has_the_prediction_of_the_scenario_asked(run, capsys):
    assert main(["whatif", run, "--async", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["predicted_step_s"] == pytest.approx(1.2, abs=1e-6)
    assert data["recorded"]["recorded_step_s"] == pytest.approx(1.7, abs=1e-6)
    assert [s["scenario"] for s in data["scenarios"]] == ["async K=1"]
    row = data["scenarios"][0]
    assert row["binding"] == "t_T + t_W" and row["staleness_max"] == 1
    assert row["interval_s"][0] <= row["predicted_step_s"] <= row["interval_s"][1]
    assert row["analytic_s"] == pytest.approx(1.2, abs=1e-6)


def test_several_values_make_one_scenario_each(run, capsys):
    assert main(["whatif", run, "--async", "0,1", "--rollout-workers", "1,2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["scenario"] for s in data["scenarios"]] == ["sync, 1 worker", "sync, 2 workers",
                                                          "async K=1, 1 worker", "async K=1, 2 workers"]
    assert [s["predicted_step_s"] for s in data["scenarios"]] == pytest.approx([1.7, 1.7, 1.2, 1.2], abs=1e-6)


def test_text_names_what_binds_and_the_analytic_bound(run, capsys):
    assert main(["whatif", run]) == 0  # no option: async K=1, K=2 and partial rollouts
    out = " ".join(capsys.readouterr().out.split())  # the terminal's line breaks aside
    assert "async K=1" in out and "async K=2" in out and "partial x1.25" in out
    assert "train and weight sync in turn set the step" in out and "max(t_R, t_T) + t_W" in out


@pytest.mark.parametrize("argv, message", [
    (["--partial", "0.5"], "--partial FACTOR must be >= 1"),
    (["--rollout-workers", "0"], "--rollout-workers must be >= 1"),
])
def test_bad_options_are_one_line_errors(run, capsys, argv, message):
    assert main(["whatif", run, *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_counts_are_refused_by_the_parser(run, capsys):
    with pytest.raises(SystemExit):
        main(["whatif", run, "--async", "one"])
    assert "whole numbers" in capsys.readouterr().err


def test_a_run_without_steps_says_so(tmp_path, capsys):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("warmup", 0, 1)
    b.write()
    assert main(["whatif", str(b.run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_step_s"] is None
    assert main(["whatif", str(b.run_dir)]) == 0
    assert "nothing to replay" in capsys.readouterr().out


def test_the_report_puts_the_replayed_prediction_beside_the_analytic_bound(run):
    from rltrace import report, store

    r = report.build(store.open(run))
    assert r["whatif"]["predicted_step_s"] == pytest.approx(1.2, abs=1e-6)
    sentence = next(f for f in r["findings"] if "max(t_R, t_T) + t_W" in f)
    assert "one-step-off (staleness 1): 1.20 s a step against 1.70 s recorded (1.42x" in sentence


def test_another_placements_weight_sync_cost(run, capsys):
    """Train 1.0 s + a 0.5 s sync instead of 0.2 s: one-step-off steps in 1.5 s."""
    assert main(["whatif", run, "--async", "1", "--sync-s", "0.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["predicted_step_s"] == pytest.approx(1.5, abs=1e-6)
    assert data["scenarios"][0]["scenario"] == "async K=1, weight sync 500 ms"
    assert data["scenarios"][0]["analytic_s"] == pytest.approx(max(0.5, 1.0) + 0.5, abs=1e-6)
    assert main(["whatif", run, "--sync-s", "-1"]) == 2
    assert "--sync-s must be >= 0" in capsys.readouterr().err


def test_a_prefill_decode_split_from_the_request_spans_and_the_model_config(tmp_path, capsys):
    """`--pd 1:1,2:1` on a run of one unified engine (4 prompts, 0.1 s of prefill each, 0.3 s of
    decode; train 0.5, sync 0.1): each split's step and what holds it; without the model config for
    the KV bytes, a one-line refusal."""
    from ..analysis.test_whatif import GQA, KV, _requests_loop

    _requests_loop(tmp_path, decode=[0.3] * 4, model=None)
    run, config = str(tmp_path / "run"), tmp_path / "config.json"
    config.write_text(json.dumps(GQA))
    argv = ["whatif", run, "--async", "0", "--pd", "1:1,2:1", "--kv-bandwidth", str(KV / 0.2)]
    assert main([*argv, "--model", str(config), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["scenarios"]
    assert [r["scenario"] for r in rows] == ["sync, prefill/decode 1:1", "sync, prefill/decode 2:1"]
    # one prefill engine: prompts end 0.1 .. 0.4 s, the 0.2 s link sends them by 0.3 .. 0.9; two: by 0.9 too
    assert [r["predicted_step_s"] for r in rows] == pytest.approx([0.9 + 0.3 + 0.6, 0.9 + 0.3 + 0.6], abs=1e-6)
    assert [r["binding"] for r in rows] == ["KV link", "KV link"]
    assert main([*argv, "--model", str(config)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "KV link holds the rollout" in out and "57.3 MB per request at 287 MB/s" in out
    assert "M / (n_P μ_P), M · S_KV / B_KV, the longest decode" in out
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot predict a prefill/decode split: no KV bytes per request: no model config (give --model PATH" in err
    assert "\n" not in err


def test_a_capped_run_predicts_more_engines_and_leaves_out_partial_rollouts(tmp_path, capsys):
    """Engines that batch continuously with a cap of 2 (4 requests of 1 s a step, train 0.5, sync
    0.1): twice the engines halve the rollout; the default set leaves partial rollouts out, saying
    why, and asking for them is a one-line refusal."""
    from ..analysis.test_whatif import _capped_loop

    _capped_loop(tmp_path)
    run = str(tmp_path / "run")
    assert main(["whatif", run, "--async", "0,1", "--rollout-workers", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["predicted_step_s"] for s in data["scenarios"]] == pytest.approx([1.6, 1.0], abs=1e-3)
    assert data["recorded"]["cap"] == 2 and data["recorded"]["schedule"].endswith("at most 2 requests an engine at once")
    assert main(["whatif", run]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "async K=2" in out and "at most 2 requests at once" in out
    assert "partial x1.25: cannot predict partial rollouts" in out
    assert main(["whatif", run, "--partial"]) == 2
    assert "batch continuously" in capsys.readouterr().err
