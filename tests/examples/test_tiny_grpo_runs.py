"""Whole demo runs, as a user starts them (`python -m examples.tiny_grpo`), read back through the store.

The runs come from `conftest.RUNS` (one subprocess per configuration per session). The Ray runs
are few: one async run (staleness, overlap, object-store sync) and one sync run that also hangs
on purpose (trace context across the process boundary, gloo sync, the open span of a hung worker).
"""

from __future__ import annotations

import json
import subprocess

import pytest

import rltrace.store
from examples.tiny_grpo.system.cli import Config, prepare_out
from rltrace import _names

from ..conftest import PYTHON, REPO, python_env


def rows(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def metric(con, name: str) -> list[float]:
    return [r[0] for r in con.execute("SELECT value FROM metrics WHERE name = ? ORDER BY step", [name]).fetchall()]


@pytest.fixture
def colocated_run(demo):
    return demo("colocated")


@pytest.mark.slow
def test_reward_rises_clearly_in_a_short_run(colocated_run):
    out, proc = colocated_run
    reward = metric(rltrace.store.open(out), "reward_mean")
    assert len(reward) == 24
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    assert last > first + 0.2, (first, last)
    assert "reward" in proc.stdout and f"rltrace info {out}" in proc.stdout  # progress lines and what next
    summary = json.loads((out / "demo_summary.json").read_text())
    assert summary["exit_code"] == 0 and len(summary["steps"]) == 24


@pytest.mark.slow
def test_every_documented_metric_and_sample_column_is_recorded(colocated_run):
    con = rltrace.store.open(colocated_run[0])
    names = {r[0] for r in con.execute("SELECT DISTINCT name FROM metrics").fetchall()}
    assert set(_names.METRICS) <= names
    sample = rows(con, "SELECT * FROM samples WHERE step = 3 LIMIT 1")[0]
    for column in ("sample_id", "group_id", "prompt_len", "response_len", "finish_reason", "reward",
                   "weight_version", "train_version", "gen_start", "gen_end", "response_text", "logprob_abs_diff"):
        assert sample[column] is not None, column
    assert sample["finish_reason"] in ("stop", "length") and sample["gen_end"] >= sample["gen_start"]
    assert sample["staleness"] == 0  # colocated sync: generated with the weights it trains
    assert metric(con, "staleness_max") == [0.0] * 24


@pytest.mark.slow
def test_phases_nest_as_the_loop_runs(colocated_run):
    con = rltrace.store.open(colocated_run[0])
    spans = rows(con, "SELECT span_id, parent_span_id, name, thread_name, attributes FROM spans WHERE step = 5")
    by_id = {s["span_id"]: s for s in spans}
    parent = {s["name"]: by_id.get(s["parent_span_id"], {}).get("name") for s in spans if s["name"] != "wait"}
    assert parent == {
        "step": None, "rollout": "step", "generate": "rollout", "reward": "step", "train": "step",
        "forward": "train", "backward": "train", "optimizer": "train", "weight_sync": "step",
        # weight_sync's child phases (docs/store.md): colocated, the engine drains and loads in the trainer's thread
        "gather": "weight_sync", "transfer": "weight_sync", "drain": "weight_sync", "load": "weight_sync",
    }
    generate = next(s for s in spans if s["name"] == "generate")
    assert generate["thread_name"] == "rollout-engine"  # generation ran on the engine's own thread
    wait = next(s for s in spans if s["name"] == "wait")
    assert json.loads(wait["attributes"])["rl.waiting_for"] == "generate"
    sync = json.loads(next(s for s in spans if s["name"] == "weight_sync")["attributes"])
    assert sync["rl.method"] == "copy" and sync["rl.bytes"] > 1_000_000


@pytest.mark.slow
def test_final_checkpoint_reproduces_trainer_logprobs(colocated_run):
    from examples.tiny_grpo import load_checkpoint, response_logprobs

    out = colocated_run[0]
    policy, tok = load_checkpoint(out / "checkpoints" / "policy_final.pt")
    prompt = tok.encode(tok.chat_prompt("reverse 12345"))
    (logp,) = response_logprobs(policy, [prompt], [tok.encode("54321<|eos|>")], pad_id=tok.pad_id)
    assert logp.shape == (6,) and logp.sum().item() > -6.0  # the trained policy likes the right answer


def test_bf16_rollout_has_larger_mismatch_than_fp32(demo):
    diffs = {}
    # conftest.RUNS, shared with other tests: two colocated runs with the fast warm-up, one with a bf16 rollout engine
    for precision, name in (("fp32", "slow_reward"), ("bf16", "bf16")):
        out, _ = demo(name)
        assert json.loads((out / "demo_summary.json").read_text())["config"]["rollout_precision"] == precision
        diffs[precision] = max(metric(rltrace.store.open(out), "train_rollout_logprob_abs_diff"))
    assert diffs["fp32"] < 1e-5
    assert diffs["bf16"] > 100 * diffs["fp32"]


def test_hang_leaves_an_open_generate_span_and_exits_nonzero(demo):
    out, proc = demo("hang")
    assert "did not finish step 2 within 6 s" in proc.stdout
    con = rltrace.store.open(out)
    # never finished: still open, or ended by rltrace (status ERROR) when the demo exited with it open
    open_spans = rows(con, "SELECT name, step, role FROM spans WHERE is_open OR status_message = ?",
                      [_names.UNFINISHED_AT_EXIT])
    assert {"name": "generate", "step": 2, "role": "trainer"} in open_spans
    failed = rows(con, "SELECT name FROM spans WHERE status = 'ERROR' AND step = 2")
    assert {"name": "wait"} in failed  # the trainer's wait ended with the timeout recorded on it
    summary = json.loads((out / "demo_summary.json").read_text())
    assert summary["exit_code"] == 3 and [r["step"] for r in summary["steps"]] == [0, 1]


def test_overwrite_replaces_what_the_demo_made_with_rltrace_disabled(tmp_path, capsys):
    """With RLTRACE_DISABLED=1 the demo records no run, but the folder (checkpoints, summary) is
    still its own: --overwrite replaces it (it refused it as "not an rltrace run")."""
    out = tmp_path / "run"
    proc = subprocess.run([PYTHON, "-m", "examples.tiny_grpo", "--out", str(out), "--steps", "1", "--warmup-max-steps", "1"],
                          cwd=REPO, env=python_env(RLTRACE_DISABLED="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (out / "run.json").exists() and (out / "demo_summary.json").exists()
    with pytest.raises(SystemExit) as exit_info:  # never replaced silently
        prepare_out(Config(out=str(out)))
    assert exit_info.value.code == 2 and "already holds an earlier demo run; pass --overwrite" in capsys.readouterr().err
    prepare_out(Config(out=str(out), overwrite=True))
    assert not (out / "demo_summary.json").exists() and (out / "checkpoints").is_dir()


def test_existing_run_is_kept_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        prepare_out(Config(out=str(out)))
    assert exit_info.value.code == 2 and "already holds an rltrace run; pass --overwrite" in capsys.readouterr().err
    assert (out / "run.json").read_text() == "{}"
    prepare_out(Config(out=str(out), overwrite=True))
    assert not (out / "run.json").exists() and (out / "checkpoints").is_dir()
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        prepare_out(Config(out=str(stranger), overwrite=True))
    assert "is not an rltrace run" in capsys.readouterr().err and (stranger / "notes.txt").exists()


@pytest.mark.slow
def test_async_on_ray_overlaps_generation_with_training_and_is_stale(demo):
    out, _ = demo("ray_async")
    con = rltrace.store.open(out)
    staleness = [r[0] for r in con.execute("SELECT staleness FROM samples").fetchall()]
    assert max(staleness) >= 1 and max(staleness) <= 3
    overlapping = con.execute(
        """SELECT count(*) FROM spans g JOIN spans t
           ON g.start_ns < t.end_ns AND t.start_ns < g.end_ns
           WHERE g.name = 'generate' AND g.role = 'rollout' AND t.name = 'train' AND t.role = 'trainer'"""
    ).fetchone()[0]
    assert overlapping >= 1
    sync = rows(con, "SELECT attributes FROM spans WHERE name = 'weight_sync' AND role = 'trainer' AND step = 2")
    assert json.loads(sync[0]["attributes"])["rl.method"] == "object_store"
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("policy_v*.pt"))
    assert checkpoints[-1] == "policy_v000008.pt" and len(checkpoints) == 4  # --keep-checkpoints default


@pytest.mark.slow
def test_async_generate_names_the_weight_sync_that_sent_its_weights(demo):
    con = rltrace.store.open(demo("ray_async")[0])
    pairs = rows(
        con,
        """SELECT g.weight_version AS used, s.weight_version AS sent, s.role
           FROM spans g JOIN spans s ON attr(g.attributes, 'rl.weight_sync_span_id') = s.span_id
            AND attr(g.attributes, 'rl.weight_sync_trace_id') = s.trace_id
           WHERE g.name = 'generate' AND g.role = 'rollout' AND NOT g.is_open""",
    )
    generated = con.execute("SELECT count(*) FROM spans WHERE name = 'generate' AND NOT is_open").fetchone()[0]
    assert len(pairs) == generated >= 8
    assert all(p["used"] == p["sent"] and p["role"] == "trainer" for p in pairs)


@pytest.mark.slow
def test_sync_on_ray_continues_the_trace_and_records_a_hung_worker(demo):
    out, proc = demo("ray_sync_hang")
    assert "rollout hung:" in proc.stdout and "did not answer 'generate at step 3' within 8 s" in proc.stdout
    assert "step   2  reward" in proc.stdout  # the driver printed the trainer actor's progress
    con = rltrace.store.open(out)
    pairs = rows(
        con,
        """SELECT c.name AS child, p.name AS parent, c.step, c.trace_id = p.trace_id AS same_trace
           FROM spans c JOIN spans p ON c.parent_span_id = p.span_id
           WHERE c.role = 'rollout' AND p.role = 'trainer' AND NOT c.is_open ORDER BY c.step, c.name""",
    )
    procs = rows(con, "SELECT role, argv FROM processes")
    assert sorted(p["role"] for p in procs) == ["rollout", "trainer"]  # the driver records nothing
    trainer_argv = json.loads(next(p["argv"] for p in procs if p["role"] == "trainer"))
    assert trainer_argv[0].endswith("default_worker.py")  # the trainer is a Ray actor process
    assert {"child": "generate", "parent": "rollout", "step": 1, "same_trace": True} in pairs
    assert {"child": "weight_load", "parent": "weight_sync", "step": 1, "same_trace": True} in pairs
    hung = rows(con, "SELECT name, step, role FROM spans WHERE is_open OR status_message = ?",
                [_names.UNFINISHED_AT_EXIT])  # the worker may exit (and end it with an error) or be killed
    assert {"name": "generate", "step": 3, "role": "rollout"} in hung
    failed = rows(con, "SELECT name, role FROM spans WHERE status = 'ERROR' AND step = 3")
    assert {"name": "wait", "role": "trainer"} in failed  # the trainer's bounded wait gave up
    summary = json.loads((out / "demo_summary.json").read_text())
    assert summary["exit_code"] == 3 and [r["step"] for r in summary["steps"]] == [0, 1, 2]
    load = rows(con, "SELECT attributes FROM spans WHERE name = 'weight_load' AND step = 1")[0]
    assert json.loads(load["attributes"])["rl.method"] == "gloo"
