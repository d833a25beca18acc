"""TRL's real GRPOTrainer on CPU (tiny Llama from a config, character tokenizer), traced by instrument().

Two trained runs are shared by the module: `run1` (one generation per step) and `run2`
(`steps_per_generation=2`: each generation feeds two optimizer steps, so half its samples are
one version stale; batches frozen every 2 steps for replay).
"""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("trl")

import rltrace  # noqa: E402
import rltrace.replay  # noqa: E402
from rltrace import analysis, store  # noqa: E402
from rltrace.integrations import _trl_faults  # noqa: E402
from rltrace.integrations import trl as rltrace_trl  # noqa: E402
from rltrace.integrations.trl import instrument, uninstrument  # noqa: E402
from rltrace.replay.diff import diff_against_record  # noqa: E402
from rltrace.replay.rerun import run_entry  # noqa: E402

from examples import trl_grpo  # noqa: E402

BATCH = trl_grpo.BATCH
MISMATCH = ("train_rollout_logprob_abs_diff", "mismatch_k3", "tis_mean", "tis_clipfrac")


def _train(tmp_path_factory, name, steps, **kwargs):
    base = tmp_path_factory.mktemp(name)
    freeze = kwargs.pop("freeze", None)
    trainer = trl_grpo.build_trainer(str(base / "out"), steps=steps, **kwargs)
    instrument(trainer, base / "run", freeze=freeze)
    trainer.train()
    rltrace.shutdown()
    return trainer, base / "run"


@pytest.fixture(scope="module")
def run1(tmp_path_factory):
    return _train(tmp_path_factory, "trl1", 3)


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    return _train(tmp_path_factory, "trl2", 4, steps_per_generation=2, freeze=rltrace.replay.FreezePolicy(every=2))


def spans(run_dir):
    return store.open(run_dir).execute(
        "SELECT name, phase, step, weight_version, start_ns, end_ns, status, status_message, attributes "
        "FROM spans WHERE NOT is_open ORDER BY start_ns").df()


def test_steps_start_at_zero_and_match_optimizer_steps(run1):
    trainer, run_dir = run1
    s = spans(run_dir)
    steps = list(range(trainer.state.global_step))
    assert steps == [0, 1, 2]
    for phase in ("step", "optimizer", "rollout", "generate", "reward", "train"):
        assert sorted(s[s.phase == phase].step.unique()) == steps, phase
    assert sorted(s[s.phase == "step"].step) == steps  # one step span per optimizer step (HF callback)
    assert (s[s.phase == "rollout"].weight_version == s[s.phase == "rollout"].step).all()
    con = store.open(run_dir)
    loss_steps = [r[0] for r in con.execute("SELECT step FROM metrics WHERE name = 'loss' ORDER BY step").fetchall()]
    assert loss_steps == steps


def test_phases_nest_as_trl_runs_them(run1):
    _, run_dir = run1
    s = spans(run_dir)
    names = set(s.name)
    assert {"rollout", "generate", "reward", "reward_a", "reward_short", "train"} <= names
    funcs = s[s.name.isin(["reward_a", "reward_short"])]
    assert {json.loads(a)["rl.reward_function"] for a in funcs.attributes} == {"reward_a", "reward_short"}
    # no train span covers a generation: TRL's training_step is never wrapped whole
    gens, trains = s[s.phase == "generate"], s[s.phase == "train"]
    for _, g in gens.iterrows():
        assert not ((trains.start_ns <= g.start_ns) & (trains.end_ns >= g.end_ns)).any()


def test_train_time_excludes_generation(run1):
    _, run_dir = run1
    costs = analysis.cost_model(store.open(run_dir))  # t_R, t_T: time in each stage, once per instant
    assert len(costs) == 3
    assert ((costs.t_R > 0) & (costs.t_T > 0)).all()
    assert (costs.t_R + costs.t_T <= costs.wall_s * 1.001).all(), costs


def test_samples_logged_for_every_generation(run1):
    trainer, run_dir = run1
    con = store.open(run_dir)
    rows = con.execute("SELECT * FROM samples ORDER BY CAST(sample_id AS BIGINT)").df()  # ids are stored as text
    assert list(rows.sample_id) == [str(i) for i in range(3 * BATCH)]
    assert list(rows.group_id) == [str(i // trl_grpo.GENERATIONS) for i in range(3 * BATCH)]
    assert (rows.step == rows.train_version).all() and (rows.staleness == 0).all()
    assert set(rows.finish_reason) <= {"stop", "length"}
    assert (rows[rows.finish_reason == "length"].response_len == trl_grpo.MAX_COMPLETION).all()
    assert (rows.finish_reason == "stop").any() and (rows.finish_reason == "length").any()
    assert (rows.prompt_len > 0).all() and (rows.gen_end >= rows.gen_start).all()
    assert rows.reward.tolist() == pytest.approx((rows.reward_reward_a + rows.reward_reward_short).tolist())
    # TRL's own mean reward per step, forwarded as reward_mean, agrees with the samples
    means = dict(con.execute("SELECT step, value FROM metrics WHERE name = 'reward_mean'").fetchall())
    for step, group in rows.groupby("step"):
        assert means[step] == pytest.approx(group.reward.mean(), abs=1e-6)


def test_mismatch_metrics_per_step(run1):
    _, run_dir = run1
    con = store.open(run_dir)
    got = con.execute("SELECT name, count(DISTINCT step), max(value), min(value) FROM metrics "
                      f"WHERE name IN {MISMATCH} GROUP BY name").fetchall()
    stats = {name: (n, hi, lo) for name, n, hi, lo in got}
    assert set(stats) == set(MISMATCH) and all(n == 3 for n, _, _ in stats.values())
    # rollout log q comes from generate's sampling scores, train log p from TRL's forward: the same
    # weights, so they agree to float32 rounding but are two computations (KV cache vs full pass)
    assert 0 < stats["train_rollout_logprob_abs_diff"][1] < 1e-4
    assert stats["tis_mean"][1] == pytest.approx(1.0, abs=1e-4) and stats["tis_clipfrac"][1] == 0
    samples = con.execute("SELECT logprob_abs_diff FROM samples").df()
    assert samples.logprob_abs_diff.notna().all()
    # TRL's other logs keep their names
    names = {r[0] for r in con.execute("SELECT DISTINCT name FROM metrics").fetchall()}
    assert {"reward_mean", "reward_std", "response_len_mean", "loss", "grad_norm", "rewards/reward_a/mean"} <= names
    assert "reward" not in names


def test_staleness_with_steps_per_generation_2(run2):
    trainer, run_dir = run2
    con = store.open(run_dir)
    rows = con.execute("SELECT step, weight_version, train_version, staleness FROM samples ORDER BY step").df()
    assert len(rows) == 4 * BATCH  # two generations of 16, each sample logged once, when first trained on
    assert sorted(rows.weight_version.unique()) == [0, 2]
    assert rows.groupby("step").staleness.max().to_dict() == {0: 0, 1: 1, 2: 0, 3: 1}
    stale = analysis.staleness(con)
    assert stale["max"].max() >= 1
    # mismatch is the engine gap (TRL's old log-probs at the generation's weights), not the staleness
    diffs = con.execute("SELECT max(value) FROM metrics WHERE name = 'train_rollout_logprob_abs_diff'").fetchone()[0]
    assert diffs < 1e-4
    gens = spans(run_dir).query("phase == 'rollout'")
    assert list(gens.step) == [0, 2]
    # TRL recomputes the old log-probs when one generation feeds several steps: a train phase in the rollout
    olds = spans(run_dir).query("phase == 'train'")
    assert any(json.loads(a).get("rl.logprobs_of") == "policy" for a in olds.attributes)


def test_replay_reproduces_rewards_and_logprobs(run2):
    _, run_dir = run2
    con = store.open(run_dir)
    frozen = [r[0] for r in con.execute("SELECT DISTINCT step FROM batches ORDER BY step").fetchall()]
    assert frozen == [0, 2]
    batch = rltrace.replay.load(run_dir, 2)
    assert len(batch) == BATCH and batch.meta["checkpoint"].endswith("step_000002")
    assert batch.meta["train_version"] == 2 and batch.meta["tokenizer_hash"]
    result = run_entry(run_dir, 2, "rltrace.integrations.trl_replay:rewards")
    (reward,) = [d for d in diff_against_record(batch, result.repeats[0]) if d.a == "reward"]
    assert reward.bitwise_equal and reward.samples == BATCH
    result = run_entry(run_dir, 2, "rltrace.integrations.trl_replay:logprobs")
    diffs = {d.a: d for d in diff_against_record(batch, result.repeats[0])}
    train = diffs["train_log_probs"]
    assert train.samples == BATCH and train.max_abs <= 1e-5
    assert diffs["rollout_log_probs"].max_abs <= 1e-4


def test_reward_function_that_raises_is_recorded(tmp_path):
    def reward_boom(completions, **kwargs):
        raise RuntimeError("reward service down")

    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=1, reward_funcs=[trl_grpo.reward_a, reward_boom])
    instrument(trainer, tmp_path / "run")
    with pytest.raises(RuntimeError, match="reward service down"):
        trainer.train()
    rltrace.shutdown()
    s = spans(tmp_path / "run").set_index("name")
    for name in ("reward_boom", "reward", "rollout"):
        assert s.loc[name, "status"] == "ERROR", name
        assert s.loc[name, "status_message"] == "RuntimeError: reward service down"
    assert s.loc["reward_a", "status"] != "ERROR"
    assert s.loc["step", "status"] == "ERROR" and "reward service down" in s.loc["step", "status_message"]


def test_unknown_trainer_is_a_clear_error():
    with pytest.raises(TypeError, match="supports GRPOTrainer, RLOOTrainer.*got builtins.object"):
        instrument(object(), "unused")


def test_untested_version_and_missing_hook_warn_once_and_record_the_rest(tmp_path, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.99.0")
    monkeypatch.setattr(rltrace_trl, "HOOK_POINTS", rltrace_trl.HOOK_POINTS + (("_renamed_later", "nothing"),))
    monkeypatch.setattr(_trl_faults, "_warned", set())
    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        instrument(trainer, tmp_path / "run")
        instrument(trainer, tmp_path / "run")  # idempotent: nothing twice
    texts = [str(w.message) for w in caught if "rltrace" in str(w.message)]
    assert texts == [
        "rltrace: trl 1.99.0 is outside the tested range >=1.16,<1.17; hooks that still match will record, "
        "missing ones are reported",
        "rltrace: trl 1.99.0 GRPOTrainer has no method _renamed_later; not recorded: nothing",
    ]
    trainer.train()
    rltrace.shutdown()
    assert {"rollout", "reward", "train"} <= set(spans(tmp_path / "run").phase)


def test_a_wrapped_generate_is_named_and_the_report_says_mismatch_is_not_recorded(tmp_path):
    from rltrace.report.build import build

    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=2)
    model = trainer.accelerator.unwrap_model(trainer.model)
    original = model.generate

    def my_generate(*args, **kwargs):  # what a user adds to log or post-process generations
        return original(*args, **kwargs)

    model.generate = my_generate
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        instrument(trainer, tmp_path / "run")
    texts = [str(w.message) for w in caught if "rltrace" in str(w.message)]
    found = ("`model.generate` is wrapped by a plain function (test_a_wrapped_generate_is_named_and_the_report_says_"
             "mismatch_is_not_recorded.<locals>.my_generate); the rollout log-prob processor cannot be attached")
    assert texts == [f"rltrace: {found}; mismatch (train_rollout_logprob_abs_diff, mismatch_k3, tis_mean, "
                     "tis_clipfrac) is not recorded for any step of this trainer, and the report says so"]
    trainer.train()
    rltrace.shutdown()
    s = spans(tmp_path / "run")
    assert sorted(s[s.phase == "generate"].step) == [0, 1]  # the user's generate is still timed
    rollouts = s[s.phase == "rollout"]
    assert [json.loads(a)["rl.mismatch_missing"] for a in rollouts.attributes] == [found, found]
    con = store.open(tmp_path / "run")
    assert con.execute(f"SELECT count(*) FROM metrics WHERE name IN {MISMATCH}").fetchone()[0] == 0
    missing = analysis.mismatch_missing(con)
    assert missing[["role", "rank", "reason", "steps", "first_step", "last_step"]].values.tolist() == [
        ["trainer", 0, found, 2, 0, 1]]
    said = build(con)["findings"]
    assert f"Mismatch not recorded on trainer0 (2 steps, 0–1): {found}." in said


def test_a_plain_run_has_no_missing_mismatch(run1):
    _, run_dir = run1
    con = store.open(run_dir)
    assert analysis.mismatch_missing(con).empty
    from rltrace.report.build import build

    assert not any(f.startswith("Mismatch not recorded") for f in build(con)["findings"])


def test_a_reward_function_found_through_sys_path_is_recorded_by_its_file(tmp_path, monkeypatch):
    """Frozen batches name the run's reward functions for `trl_replay:rewards`; one imported from a
    folder only the training script put on sys.path is named by its file, so a replay from
    another folder finds it."""
    import sys

    from rltrace.integrations.trl_replay import _function_ref
    from rltrace.replay.rerun import load_object

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "rewards_on_path_xyz.py").write_text("def judge(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.delitem(sys.modules, "rewards_on_path_xyz", raising=False)
    import rewards_on_path_xyz

    ref = _function_ref(rewards_on_path_xyz.judge)
    assert ref["spec"] == f"{lib / 'rewards_on_path_xyz.py'}:judge"
    assert _function_ref(trl_grpo.reward_a)["spec"] == "examples.trl_grpo:reward_a"  # installed with the project
    sys.path.remove(str(lib))
    monkeypatch.chdir(tmp_path)
    assert load_object(ref["spec"], "reward function")(["x", "y"]) == [1.0, 1.0]


def test_uninstrument_restores_the_trainer(tmp_path):
    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=1)
    before = (trainer.compute_loss, trainer.reward_funcs, trainer.accelerator.backward, len(trainer.callback_handler.callbacks))
    instrument(trainer, tmp_path / "run")
    assert trainer.compute_loss != before[0] and trainer.reward_funcs is not before[1]
    uninstrument(trainer)
    after = (trainer.compute_loss, trainer.reward_funcs, trainer.accelerator.backward, len(trainer.callback_handler.callbacks))
    assert after == before
    assert "compute_loss" not in vars(trainer) and "generate" not in vars(trainer.model)


# --- zero code: `rltrace run -- python train_grpo.py` ---------------------------------------------
def _launch(run_dir, tmp_path, *command):
    """`rltrace run` with the `trl` instrumentor registered as pyproject.toml declares it."""
    import os
    import subprocess
    import tomllib

    from ..conftest import PYTHON, REPO, python_env

    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["rltrace.instrumentors"]["trl"]
    dist = tmp_path / "site" / "rltrace_trl_entry-0.1.dist-info"  # what `pip install rltrace[trl]` puts in site-packages
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rltrace-trl-entry\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[rltrace.instrumentors]\ntrl = {entry}\n")
    env = python_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env["PYTHONPATH"]])
    return subprocess.run([PYTHON, "-m", "rltrace", "run", "--run-dir", str(run_dir), "--", PYTHON, *command],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


CRASHING_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from examples.trl_grpo import build_trainer, reward_a

calls = []

def reward_flaky(completions, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        raise RuntimeError("reward service down")
    return [0.0] * len(completions)

build_trainer({out!r}, steps=3, reward_funcs=[reward_a, reward_flaky]).train()
"""


@pytest.mark.slow
def test_rltrace_run_traces_a_script_that_never_imports_rltrace_and_records_its_crash(tmp_path):
    from ..conftest import REPO

    run_dir, script = tmp_path / "run", tmp_path / "train_grpo.py"
    script.write_text(CRASHING_SCRIPT.format(repo=str(REPO), out=str(tmp_path / "out")))
    out = _launch(run_dir, tmp_path, str(script))
    assert out.returncode == 1 and "RuntimeError: reward service down" in out.stderr, out.stderr[-3000:]
    s = spans(run_dir)
    assert {"rollout", "generate", "reward", "train"} <= set(s.phase)
    assert sorted(s[s.phase == "train"].step) == [0]  # step 0 trained; step 1 died in its reward
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == BATCH
    assert con.execute("SELECT role, rank FROM processes").fetchall() == [("trainer", 0)]
    crash = con.execute("SELECT exc_type, message, phase, step FROM crashes").fetchall()
    assert crash == [("RuntimeError", "reward service down", "reward_flaky", 1)]


def test_rloo_trainer_shares_the_hooks(tmp_path):
    from trl import RLOOConfig, RLOOTrainer

    tok = trl_grpo.build_tokenizer()
    args = RLOOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], bf16=False, max_steps=2, beta=0.0,
                      per_device_train_batch_size=BATCH, num_generations=trl_grpo.GENERATIONS,
                      max_completion_length=trl_grpo.MAX_COMPLETION, logging_steps=1, save_strategy="no", disable_tqdm=True)
    trainer = RLOOTrainer(model=trl_grpo.build_model(tok), reward_funcs=[trl_grpo.reward_a], args=args,
                          train_dataset=trl_grpo.build_dataset(), processing_class=tok)
    instrument(trainer, tmp_path / "run")
    trainer.train()
    rltrace.shutdown()
    s = spans(tmp_path / "run")
    assert {"rollout", "generate", "reward", "reward_a", "train"} <= set(s.phase)
    con = store.open(tmp_path / "run")
    assert con.execute("SELECT count(*), count(DISTINCT step) FROM samples").fetchone() == (2 * BATCH, 2)
    assert con.execute("SELECT count(*) FROM metrics WHERE name = 'mismatch_k3'").fetchone()[0] == 2


@pytest.mark.parametrize("which", ["run1", "run2"])
def test_report_sees_a_sequential_loop(which, request):
    """TRL generates, scores and trains one after another: the report must not claim overlap, also when
    the old log-prob forward (train) runs inside the rollout (run2)."""
    from rltrace.report.build import build

    _, run_dir = request.getfixturevalue(which)
    con = store.open(run_dir)
    report = build(con)
    assert report["async"]["overlapping"] is False and report["async"]["concurrent_s"] == 0
    assert any("no measured overlap" in f for f in report["findings"])
    costs = analysis.cost_model(con).fillna({"t_R": 0.0, "t_T": 0.0})  # a step with no generation has no t_R
    assert (costs.t_R + costs.t_T <= costs.wall_s * 1.001).all(), costs


def test_the_example_runs_as_a_user_runs_it(tmp_path):
    trl_grpo.main(["--out", str(tmp_path / "run"), "--steps", "1"])
    rltrace.shutdown()
    assert {"rollout", "reward", "train", "step"} <= set(spans(tmp_path / "run").phase)


def test_vllm_weight_sync_and_reward_models_are_recorded(tmp_path):
    """Stand-ins: vLLM needs a GPU engine, so a fake `vllm_generation` takes its place (the real
    object has the same two methods); the reward model is a bare nn.Module called directly."""
    import torch

    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=1)

    class FakeClient:  # trl's VLLMClient: only what sync_weights calls at its end
        def reset_prefix_cache(self):
            return None

    class FakeVLLMGeneration:  # stand-in for trl's VLLMGeneration (server mode)
        vllm_client = FakeClient()

        def sync_weights(self):
            self.vllm_client.reset_prefix_cache()  # as trl's does after loading the weights
            return "synced"

        def generate(self, **kwargs):
            return None

    trainer.use_vllm, trainer.vllm_generation = True, FakeVLLMGeneration()
    trainer.args.vllm_mode = "server"
    reward_model = torch.nn.Linear(4, 1)
    trainer.reward_funcs = [*trainer.reward_funcs, reward_model]
    trainer.reward_func_names = [*trainer.reward_func_names, "rm"]
    instrument(trainer, tmp_path / "run")
    assert trainer.vllm_generation.sync_weights() == "synced"
    assert trainer.reward_funcs[-1] is reward_model  # TRL checks isinstance(nn.Module): never wrapped
    reward_model(torch.zeros(2, 4))
    uninstrument(trainer)
    assert not reward_model._forward_hooks and not reward_model._forward_pre_hooks
    rltrace.shutdown()
    s = spans(tmp_path / "run").set_index("name")
    attrs = json.loads(s.loc["weight_sync", "attributes"])
    params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert attrs["rl.method"] == "vllm_server" and attrs["rl.bytes"] == params
    assert attrs["rl.cache_flushed"] is True  # its reset_prefix_cache() ran inside the sync
    assert "reset_prefix_cache" not in vars(trainer.vllm_generation.vllm_client)  # put back
    assert json.loads(s.loc["rm", "attributes"])["rl.reward_function"] == "rm"


def test_freeze_every_from_the_environment(tmp_path, monkeypatch):
    from rltrace._config import RltraceConfigError

    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=1)
    monkeypatch.setenv("RLTRACE_FREEZE_EVERY", "often")
    with pytest.raises(RltraceConfigError, match="RLTRACE_FREEZE_EVERY='often'"):
        instrument(trainer, tmp_path / "run")
    monkeypatch.setenv("RLTRACE_FREEZE_EVERY", "1")
    instrument(trainer, tmp_path / "run")
    trainer.train()
    rltrace.shutdown()
    batch = rltrace.replay.load(tmp_path / "run", 0)
    assert len(batch) == BATCH and batch.meta["trigger"] == "every_n"
    assert (tmp_path / "run" / "checkpoints" / "trl" / "step_000000" / "config.json").exists()


def test_num_iterations_reuses_samples_and_each_use_is_a_row(tmp_path):
    trainer = trl_grpo.build_trainer(str(tmp_path / "out"), steps=2, num_iterations=2)
    instrument(trainer, tmp_path / "run")
    trainer.train()
    rltrace.shutdown()
    con = store.open(tmp_path / "run")
    rows = con.execute("SELECT step, sample_id, weight_version, staleness FROM samples "
                       "ORDER BY step, CAST(sample_id AS BIGINT)").df()
    assert list(rows.step) == [0] * BATCH + [1] * BATCH  # one generation, trained on at steps 0 and 1
    assert list(rows[rows.step == 1].sample_id) == [str(i) for i in range(BATCH)] and set(rows.weight_version) == {0}
    assert rows.groupby("step").staleness.max().to_dict() == {0: 0, 1: 1}
    assert list(spans(tmp_path / "run").query("phase == 'rollout'").step) == [0]


def test_peft_policy_still_gives_rollout_logprobs(tmp_path):
    peft = pytest.importorskip("peft")
    from trl import GRPOConfig, GRPOTrainer

    tok = trl_grpo.build_tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], bf16=False, max_steps=1,
                      per_device_train_batch_size=BATCH, num_generations=trl_grpo.GENERATIONS,
                      max_completion_length=trl_grpo.MAX_COMPLETION, save_strategy="no", disable_tqdm=True)
    trainer = GRPOTrainer(model=trl_grpo.build_model(tok), reward_funcs=[trl_grpo.reward_a], args=args,
                          train_dataset=trl_grpo.build_dataset(), processing_class=tok,
                          peft_config=peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    instrument(trainer, tmp_path / "run")
    trainer.train()
    rltrace.shutdown()
    con = store.open(tmp_path / "run")
    (diff,) = con.execute("SELECT value FROM metrics WHERE name = 'train_rollout_logprob_abs_diff'").fetchone()
    assert 0 <= diff < 1e-4
