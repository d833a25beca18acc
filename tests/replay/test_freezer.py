"""Freezing from a loop: never waits for the writer, skips and counts when full or over budget,
and freezes on the steps the policy picks."""

import threading

import pytest
import torch

import rltrace
import rltrace.replay as replay
from rltrace.replay import writer as writer_module
from rltrace.replay.freezer import FreezePolicy, Freezer, check_canonical, write_request
from tests.replay.tiny import CharTokenizer, checkpoint, make_samples


def _steps(run_dir) -> list[int]:
    return sorted(int(p.name.split("-")[0]) for p in (run_dir / "batches").glob("*.parquet"))


@pytest.fixture
def blocked_writer(monkeypatch):
    """The writer thread stops inside its first conversion until `release` is set."""
    started, release = threading.Event(), threading.Event()
    real = writer_module.build_table

    def slow_build(*args, **kwargs):
        started.set()
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "build_table", slow_build)
    yield started, release
    release.set()


def test_freeze_before_init_does_nothing():
    assert replay.freeze(1, [{"reward": 1.0}]) is False


def test_a_full_queue_skips_and_counts_without_waiting(tmp_path, monkeypatch, blocked_writer):
    started, release = blocked_writer
    monkeypatch.setenv("RLTRACE_REPLAY_QUEUE", "1")
    run = rltrace.init(tmp_path / "run")
    assert replay.freeze(1, [{"reward": 1.0}])
    assert started.wait(30)  # the writer holds step 1; the queue is empty again
    assert replay.freeze(2, [{"reward": 2.0}])  # fills the queue of 1
    assert replay.freeze(3, [{"reward": 3.0}]) is False  # returns at once, counted
    w = writer_module.writer_for(run)
    assert w.skipped_queue == 1
    release.set()
    replay.flush()
    assert _steps(tmp_path / "run") == [1, 2]
    rltrace.flush()
    con = rltrace.store.open(tmp_path / "run")
    last = dict(con.execute("SELECT name, value FROM metrics WHERE step = 2 AND name LIKE 'replay_%'").fetchall())
    assert last == {"replay_frozen": 2.0, "replay_skipped": 1.0, "replay_failed": 0.0, "replay_columns_dropped": 0.0,
                    "replay_bytes": float(w.bytes_written)}


def test_the_disk_budget_skips_and_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_REPLAY_BUDGET_MB", "0.2")
    run = rltrace.init(tmp_path / "run")
    assert replay.freeze(1, [{"reward": 1.0}])
    assert replay.freeze(2, {"x": torch.randn(64, 4096)})  # 1 MB: does not fit, skipped
    replay.flush()
    w = writer_module.writer_for(run)
    assert _steps(tmp_path / "run") == [1] and w.skipped_budget == 1 and w.frozen == 1


def test_a_sample_that_cannot_be_converted_is_counted_and_the_rest_is_frozen(tmp_path, caplog):
    run = rltrace.init(tmp_path / "run")
    assert replay.freeze(1, [{"x": torch.zeros(2)}, {"x": 1.0}])  # only the first sample is checked here
    assert replay.freeze(2, [{"x": torch.zeros(2)}])
    replay.flush()
    w = writer_module.writer_for(run)
    assert w.failed == 0 and w.dropped_samples == 1 and w.frozen == 2
    assert _steps(tmp_path / "run") == [1, 2]
    assert len(replay.load(tmp_path / "run", 1)) == 1
    reasons = [r for r in run.drops.records() if r["table"] == "batches"]
    assert reasons and "mixes" in reasons[0]["reason"] and reasons[0]["column"] == "x"
    assert "could not freeze a sample of step 1" in caplog.text


def test_copy_true_protects_against_in_place_changes(tmp_path, blocked_writer):
    started, release = blocked_writer
    rltrace.init(tmp_path / "run")
    tokens, per_sample, meta = torch.arange(5), [torch.ones(2), torch.ones(3)], {"lr": 1.0}
    assert replay.freeze(1, [{"response_tokens": tokens, "metadata": meta}], copy=True)
    assert replay.freeze(2, {"logp": per_sample}, copy=True)
    assert started.wait(30)
    tokens.add_(100)
    per_sample[1].add_(1)
    meta["lr"] = 2.0
    release.set()
    replay.flush()
    first = replay.load(tmp_path / "run", 1)
    assert torch.equal(first["response_tokens"][0], torch.arange(5)) and first["metadata"] == [{"lr": 1.0}]
    assert torch.equal(replay.load(tmp_path / "run", 2)["logp"][1], torch.ones(3))


@pytest.mark.parametrize(
    "samples, message",
    [
        ({"a": torch.zeros(3, 2), "b": [1, 2]}, "has 2 rows"),
        ([{"weight_version": [1, 2]}], "weight_versions"),
        ({"reward": [[1.0, 2.0]]}, "reward_components"),
        ({"reward": torch.zeros(4, 2)}, "reward_components"),
        ({"x": 3}, "must be a tensor/array"),
        ("text", "list of dicts or a dict of columns"),
        ([1, 2], "must be dicts"),
        ([{3: 1.0}], "column names must be strings"),
    ],
)
def test_mistakes_are_counted_and_logged_never_raised_into_the_loop(tmp_path, samples, message, caplog):
    run = rltrace.init(tmp_path / "run")
    assert replay.freeze(1, samples) is False
    w = writer_module.writer_for(run)
    assert w.failed == 1 and message in w.last_error and "could not freeze step 1" in caplog.text
    assert replay.freeze("one", [{"reward": 1.0}]) is False and w.failed == 2  # a bad step too
    assert replay.freeze(2, [{"reward": 1.0}])  # and the next good freeze goes through
    replay.flush()
    assert _steps(tmp_path / "run") == [2]


def test_a_train_version_column_that_agrees_becomes_the_batchs_own(tmp_path):
    """`log_samples` rows carry train_version; freezing the same rows must work."""
    run = rltrace.init(tmp_path / "run")
    rows = [{"reward": 1.0, "train_version": 4}, {"reward": 0.0, "train_version": 4}]
    assert replay.freeze(1, rows)  # v_t from the column
    assert replay.freeze(2, {"reward": [1.0, 0.0], "train_version": torch.tensor([5, 5])}, batch_meta={"weight_version": 5})
    replay.flush()
    one, two = replay.load(tmp_path / "run", 1), replay.load(tmp_path / "run", 2)
    assert (one.meta["train_version"], two.meta["train_version"]) == (4, 5)
    assert "train_version" not in one.columns and one["reward"] == [1.0, 0.0]
    assert writer_module.writer_for(run).columns_dropped == 0


def test_clashing_columns_are_dropped_counted_and_explained(tmp_path, caplog):
    run = rltrace.init(tmp_path / "run")
    rows = [{"reward": 1.0, "train_version": 3, "step": 7, "_shape_x": 1}, {"reward": 0.0, "train_version": 4}]
    assert replay.freeze(1, rows, batch_meta={"weight_version": 3})
    replay.flush()
    batch = replay.load(tmp_path / "run", 1)
    assert batch.meta["train_version"] == 3 and batch["reward"] == [1.0, 0.0]  # the batch is kept
    assert set(batch.extra["dropped_columns"]) == {"train_version", "step", "_shape_x"}
    assert "versions [3, 4]" in batch.extra["dropped_columns"]["train_version"]
    assert writer_module.writer_for(run).columns_dropped == 3
    assert "frozen without its column 'step'" in caplog.text
    rltrace.flush()
    con = rltrace.store.open(tmp_path / "run")
    assert con.execute("SELECT max(value) FROM metrics WHERE name = 'replay_columns_dropped'").fetchone() == (3.0,)


def test_every_n_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_REPLAY_QUEUE", "10")
    rltrace.init(tmp_path / "run")
    freezer = Freezer(FreezePolicy(every=3))
    triggers = [freezer.step(s, [{"reward": float(s)}]) for s in range(7)]
    replay.flush()
    assert triggers == ["every_n", None, None, "every_n", None, None, "every_n"]
    assert _steps(tmp_path / "run") == [0, 3, 6]


def test_on_demand_in_code_and_from_the_command_line(tmp_path):
    rltrace.init(tmp_path / "run")
    freezer = Freezer(FreezePolicy())
    assert freezer.decide(0) is None  # first look: an old request file would not count
    freezer.request("checking the template")
    assert freezer.decide(1) == ("on_demand", "checking the template")
    assert freezer.decide(2) is None
    write_request(tmp_path / "run", "text looks wrong")
    assert freezer.decide(3) == ("request", "text looks wrong")
    assert freezer.decide(4) is None
    write_request(tmp_path / "run")
    assert freezer.decide(5)[0] == "request"


def test_reward_drop_against_the_recent_mean_with_a_cooldown(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_REPLAY_QUEUE", "10")
    rltrace.init(tmp_path / "run")
    freezer = Freezer(FreezePolicy(reward_drop=0.2, window=3, cooldown=2))
    rewards = [0.5, 0.6, 0.55, 0.2, 0.1, 0.6, 0.6, 0.1]
    frozen = [freezer.step(s, [{"reward": r}], metrics={"reward_mean": r}) for s, r in enumerate(rewards)]
    # step 3 drops below 0.55 - 0.2; steps 4-5 are in the cooldown; step 7 drops below mean(0.1, 0.6, 0.6) - 0.2
    assert frozen == [None, None, None, "anomaly", None, None, None, "anomaly"]
    replay.flush()
    assert "reward drop" in replay.load(tmp_path / "run", 3).meta["reason"]


def test_mismatch_spike(tmp_path):
    rltrace.init(tmp_path / "run")
    freezer = Freezer(FreezePolicy(mismatch_threshold=0.05))
    assert freezer.decide(1, metrics={"train_rollout_logprob_abs_diff": 0.01}) is None
    trigger, reason = freezer.decide(2, metrics={"train_rollout_logprob_abs_diff": 0.2})
    assert trigger == "anomaly" and "mismatch spike" in reason


def test_bad_text_probe_finds_leaked_template_tokens(tmp_path):
    rltrace.init(tmp_path / "run")
    tok = CharTokenizer()
    good = [{"response_text": "hello there", "response_tokens": torch.tensor(tok.encode("hello there"))}]
    bad = [{"response_text": "hi<|im_start|>assistant\nhi", "response_tokens": torch.tensor(tok.encode("hi"))}]
    freezer = Freezer(FreezePolicy(bad_text=True))
    assert freezer.decide(1, good) is None
    trigger, reason = freezer.decide(2, bad)
    assert trigger == "anomaly" and "template_leak" in reason
    no_assistant = [{"prompt_text": "<|im_start|>user\nhi<|im_end|>\n", "response_text": "ok"}]
    meta = {"generation_prompt": "<|im_start|>assistant\n"}
    assert "prompt_template" in Freezer(FreezePolicy(bad_text=True)).decide(3, no_assistant, batch_meta=meta)[1]
    looping = {"response_tokens": torch.tensor([[5, 6, 7] * 10]), "finish_reason": ["length"]}
    assert "repetition" in Freezer(FreezePolicy(bad_text=True)).decide(3, looping)[1]


def test_a_real_batch_freezes_through_the_policy(tmp_path):
    tok = CharTokenizer()
    checkpoint(tmp_path / "ckpt", 1, len(tok.tokens))
    samples = make_samples(tok, tmp_path / "ckpt", n=4)
    rltrace.init(tmp_path / "run")
    freezer = Freezer(FreezePolicy(every=2))
    assert freezer.step(2, samples, batch_meta={"weight_version": 1, "tokenizer": tok}) == "every_n"
    replay.flush()
    batch = replay.load(tmp_path / "run", 2, tokenizer=tok)
    assert batch.meta["trigger"] == "every_n" and batch.meta["reason"] == "every 2 steps"


def test_a_forked_child_freezes_with_its_own_writer(tmp_path):
    import multiprocessing

    rltrace.init(tmp_path / "run")
    assert replay.freeze(1, [{"reward": 1.0}])
    replay.flush()
    child = multiprocessing.get_context("fork").Process(target=_freeze_in_child, args=(2,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert _steps(tmp_path / "run") == [1, 2]
    assert replay.load(tmp_path / "run", 2).meta["pid"] == child.pid


def _freeze_in_child(step: int) -> None:
    assert replay.freeze(step, [{"reward": float(step)}])
    replay.flush()


def test_canonical_columns_are_checked_on_the_callers_thread():
    with pytest.raises(ValueError, match="weight_versions"):
        check_canonical("weight_version", [3, 4])
    with pytest.raises(ValueError, match="reward_components"):
        check_canonical("reward", torch.zeros(3))
    with pytest.raises(ValueError, match="str"):
        check_canonical("response_text", [1, 2])
    check_canonical("reward", torch.tensor(1.0))


def test_a_freezer_given_unreadable_samples_counts_them_and_goes_on(tmp_path):
    run = rltrace.init(tmp_path / "run")
    freezer = Freezer(FreezePolicy(every=1, bad_text=True))
    for bad in ("text", [1, 2], {"response_text": 3}, [{"response_text": 5}]):
        assert freezer.step(0, bad) is None
    assert writer_module.writer_for(run).failed == 4
    assert freezer.step(1, [{"reward": 1.0}]) == "every_n"
