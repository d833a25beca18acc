"""`rltrace report`: stable JSON keys, sentences naming the culprit, step ranges, comparison."""

import json

import pytest

from rltrace import report, store
from rltrace.cli import main
from rltrace.testing import RunBuilder

KEYS = {"run", "steps", "phases", "t_R", "t_T", "t_W", "t_reward", "t_rollout", "t_sync", "async_bound",
        "async_speedup_bound", "async", "bottleneck", "critical_path", "waits", "long_tail", "stragglers",
        "weight_sync_fit", "staleness", "mismatch", "reward", "open_spans", "dropped", "findings"}


def _run(path, reward_s=1.0, hang=False, straggler_len=80):
    b = RunBuilder(path)
    tr, ro, rw = b.process("trainer"), b.process("rollout"), b.process("reward")
    t = 0.0
    for step in range(1, 5):
        ro.span("rollout", t, t + 3, step=step)
        rw.span("reward", t + 3, t + 3 + reward_s, step=step)
        tr.span("train", t + 3 + reward_s, t + 5 + reward_s, step=step)
        tr.span("weight_sync", t + 5 + reward_s, t + 5.5 + reward_s, step=step, bytes=1e9 * step)
        b.samples(step, [{"sample_id": i, "response_len": 10 if i else straggler_len, "gen_start": t,
                          "gen_end": t + (1 + 1.9 * straggler_len / 80 if i == 0 else 1)}
                         for i in range(8)])
        b.metric(step, "reward_mean", 0.1 * step)
        b.metric(step, "train/train_rollout_logprob_abs_diff", 0.01 * step)
        t += 5.5 + reward_s
    if hang:
        ro.span("rollout", t, None, step=5)
    b.write()
    return b.run_dir


def test_json_has_the_documented_keys_and_names_the_culprit(tmp_path, capsys):
    run = _run(tmp_path / "slow-reward", reward_s=6.0, hang=True)
    assert main(["report", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert KEYS <= set(data)
    assert data["bottleneck"]["stage"] == "reward" and data["bottleneck"]["role"] == "reward"
    assert data["t_R"] == pytest.approx(9.0) and data["t_T"] == pytest.approx(2.0) and data["t_W"] == pytest.approx(0.5)
    assert data["async_bound"] == pytest.approx(9.5) and data["async_speedup_bound"] == pytest.approx(11.5 / 9.5)
    assert data["weight_sync_fit"]["sizes"] == 4 and data["weight_sync_fit"]["t_0"] == pytest.approx(0.5)
    trainer = [w for w in data["waits"] if w["role"] == "trainer"]
    assert trainer[0]["waited_for"] == "reward" and trainer[0]["seconds"] == pytest.approx(6.0)
    assert [s["sample_id"] for s in data["stragglers"]] == ["0", "0", "0", "0"]
    assert data["open_spans"][0]["phase"] == "rollout" and data["open_spans"][0]["step"] == 5
    assert data["mismatch"]["trends"][0]["metric"] == "train_rollout_logprob_abs_diff"
    text = " ".join(data["findings"])
    assert "Bottleneck: reward on reward0" in text and "Open span: rollout on rollout0 at step 5" in text
    assert "straggler sample(s)" in text


def test_an_ordinary_spread_of_lengths_is_listed_but_not_a_finding(tmp_path, capsys):
    run = _run(tmp_path / "spread", straggler_len=25)  # 2.5x the median length, 1.6x its time
    assert main(["report", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["sample_id"] for s in data["stragglers"]] == ["0", "0", "0", "0"]
    assert not any("straggler" in f for f in data["findings"])


def test_terminal_report_and_step_range(tmp_path, capsys):
    run = _run(tmp_path / "run")
    assert main(["report", str(run), "--steps", "2:3"]) == 0
    out = capsys.readouterr().out
    assert "Bottleneck: rollout" in out and "Cost model" in out and "Longest waits" in out
    assert main(["report", str(run), "--steps", "2:3", "--json"]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)["steps"]] == [2, 3]


def test_compare_puts_runs_side_by_side(tmp_path, capsys):
    fast, slow = _run(tmp_path / "fast"), _run(tmp_path / "slow", reward_s=4.0)
    assert main(["report", str(slow), "--compare", str(fast), "--json"]) == 0
    rows = {(r["what"], r["unit"]): r for r in json.loads(capsys.readouterr().out)["compare"]["rows"]}
    assert rows[("phase reward", "s/step (mean)")]["ratio"] == pytest.approx(4.0)
    assert rows[("reward_mean", "mean over steps")]["ratio"] == pytest.approx(1.0)
    assert main(["report", str(slow), "--compare", str(fast)]) == 0
    assert "Compare: " in capsys.readouterr().out


def test_bad_input_is_one_line(tmp_path, capsys):
    run = _run(tmp_path / "run")
    assert main(["report", str(run), "--steps", "x"]) == 2
    assert "invalid step range 'x'" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bottleneck_names_an_attached_profile(tmp_path):
    run = _run(tmp_path / "run", reward_s=6.0)
    con = store.open(run)
    span_id = con.execute("SELECT span_id FROM spans WHERE phase = 'reward' ORDER BY duration_s DESC LIMIT 1").fetchone()[0]
    assert span_id.isalnum()  # safe to inline: views cannot take parameters
    con.execute(
        f"CREATE OR REPLACE VIEW profiles AS SELECT '0' AS trace_id, '{span_id}' AS span_id, 'p1' AS profile_id, "
        "'py-spy' AS kind, 'profiles/p1.json' AS path")
    data = report.build(con)
    assert data["bottleneck"]["profiles"][0]["profile_id"] == "p1"
    assert any("py-spy p1 at profiles/p1.json" in s for s in data["findings"])


def test_json_is_strict_and_a_closed_pipe_is_no_traceback(tmp_path):
    """`rltrace report --json | head`: valid JSON while it lasts, and no BrokenPipeError traceback."""
    import subprocess
    import sys

    from tests.conftest import python_env

    run_dir = _run(tmp_path / "run")
    cmd = [sys.executable, "-m", "rltrace", "report", str(run_dir), "--json"]
    full = subprocess.run(cmd, env=python_env(), capture_output=True, text=True, timeout=120, check=True)
    json.loads(full.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    pipe = subprocess.Popen(cmd, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pipe.stdout.close()  # the reader hangs up before rltrace writes (as `head` does once it has its lines)
    err = pipe.stderr.read().decode()
    assert pipe.wait(timeout=120) in (0, 141) and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_run_with_no_finished_step_says_so_without_an_empty_cost_model(tmp_path, capsys):
    import rltrace

    rltrace.init(tmp_path / "run")
    rltrace.shutdown()  # a run that recorded nothing yet
    assert main(["report", str(tmp_path / "run")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "no finished span with a step yet: nothing to report" in text
    assert "Cost model" not in text and "not recorded" not in text
