"""`rltrace replay|import|export` end to end: output a user reads, and one-line errors (exit 2)."""

import json
from pathlib import Path

import pytest
import torch

import rltrace
from rltrace.cli import main
from tests.replay.slime_dumps import rollout_dump, sample_dict, train_dump
from tests.replay.tiny import CharTokenizer, make_run

REPLAY_TESTS = Path(__file__).parent.parent / "replay"

ENTRIES = str(REPLAY_TESTS / "entries.py")
TOKENIZER = str(REPLAY_TESTS / "tiny.py") + ":CharTokenizer"


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    yield
    rltrace.shutdown()


@pytest.fixture
def run_dir(tmp_path):
    run_dir, _, _ = make_run(tmp_path, versions=(0, 1, 2))
    rltrace.shutdown()
    return run_dir


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *args):
    code, out, err = cli(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_list_and_show(capsys, run_dir):
    data = cli_json(capsys, "replay", "list", run_dir)
    (batch,) = data["batches"]
    assert (batch["step"], batch["n_samples"], batch["trigger"], batch["train_version"], batch["replays"]) == (3, 8, "on_demand", 2, 0)
    code, out, _ = cli(capsys, "replay", "show", run_dir, "--step", 3)
    assert code == 0 and "step 3" in out and "TRUNC" in out and "flags: truncated" in out
    code, out, _ = cli(capsys, "replay", "show", run_dir, "--step", 3, "--sample", 0)
    assert code == 0 and "prompt" in out and "<|im_start|>user" in out
    shown = cli_json(capsys, "replay", "show", run_dir, "--step", 3, "--flagged")
    assert shown["samples"] and all(s["flags"] for s in shown["samples"])


def test_show_decodes_tokens_with_the_right_tokenizer_only(capsys, tmp_path):
    rltrace.init(tmp_path / "run")
    rltrace.replay.freeze(1, [{"response_tokens": torch.tensor([3, 4, 5])}], batch_meta={"tokenizer": CharTokenizer()})
    rltrace.replay.flush()
    view = cli_json(capsys, "replay", "show", tmp_path / "run", "--step", 1, "--sample", 0, "--tokenizer", TOKENIZER)
    assert view["response_text"] == "abc"
    code, _, err = cli(capsys, "replay", "show", tmp_path / "run", "--step", 1, "--tokenizer", str(REPLAY_TESTS / "tiny.py") + ":SPECIAL")
    assert code == 2 and "has no decode() method" in err


def test_show_with_a_tokenizer_decodes_tokens_so_a_stripped_template_leak_is_visible(capsys, tmp_path):
    tok = CharTokenizer()
    rltrace.init(tmp_path / "run")
    leaked = tok.encode("<|im_start|>ab")  # the framework decoded it with special tokens skipped
    rltrace.replay.freeze(1, [{"response_tokens": torch.tensor(leaked), "response_text": "ab"}], batch_meta={"tokenizer": tok})
    rltrace.replay.flush()
    plain = cli_json(capsys, "replay", "show", tmp_path / "run", "--step", 1, "--sample", 0)
    assert plain["response_text"] == "ab" and plain["text_from"] == "stored"
    view = cli_json(capsys, "replay", "show", tmp_path / "run", "--step", 1, "--sample", 0, "--tokenizer", TOKENIZER)
    assert view["response_text"] == "<|im_start|>ab" and view["text_from"] == "tokens"
    assert view["stored_response_text"] == "ab" and "template_leak" in view["flags"]
    code, out, _ = cli(capsys, "replay", "show", tmp_path / "run", "--step", 1, "--sample", 0, "--tokenizer", TOKENIZER)
    assert code == 0 and "<|im_start|>ab" in out and "decoded from its tokens" in out and "response as stored" in out


def test_run_diff_and_compare(capsys, run_dir):
    ran = cli_json(capsys, "replay", "run", run_dir, "--step", 3, "--entry", f"{ENTRIES}:reward", "--repeat", 2)
    assert ran["repeatable"] == {"reward": True} and ran["diffs"][0]["bitwise_equal"]
    diff = cli_json(capsys, "replay", "diff", run_dir, "--step", 3)
    assert diff["replay_id"] == ran["replay_id"]
    code, out, _ = cli(capsys, "replay", "compare", run_dir, "--step", 3, "--entry", f"{ENTRIES}:logprobs_fp32", "--entry", f"{ENTRIES}:logprobs_bf16")
    assert code == 0
    assert "logprobs_fp32: repeatable over 2 runs: yes, bitwise" in out and "logprobs_bf16: repeatable over 2 runs: yes, bitwise" in out
    assert "aligned (" in out and "): no" in out and "repeatable is not aligned" in out
    replays = cli_json(capsys, "replay", "list", run_dir)["batches"][0]["replays"]
    assert replays == 3
    a_id = ran["replay_id"]
    other = cli_json(capsys, "replay", "run", run_dir, "--step", 3, "--entry", f"{ENTRIES}:noisy")
    against = cli_json(capsys, "replay", "diff", run_dir, "--step", 3, "--replay", a_id, "--against", other["replay_id"])
    assert against["diffs"][0]["bitwise_equal"] is False


def test_diff_pair_with_a_missing_column_is_one_line(capsys, run_dir):
    cli_json(capsys, "replay", "run", run_dir, "--step", 3, "--entry", f"{ENTRIES}:reward")
    code, _, err = cli(capsys, "replay", "diff", run_dir, "--step", 3, "--pair", "reward=nope")
    assert code == 2 and "has no column 'nope'" in err and "rollout_log_probs" in err
    assert "Traceback" not in err and err.count("\n") == 1
    code, _, err = cli(capsys, "replay", "diff", run_dir, "--step", 3, "--pair", "log_probs=reward")
    assert code == 2 and "replay " in err and "has no column 'log_probs'" in err and "reward" in err


def test_diff_two_recorded_columns(capsys, tmp_path):
    """Rollout vs train log-probs as the loop recorded them: no replay needed."""
    rltrace.init(tmp_path / "run")
    q = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    p = [torch.tensor([-1.0, -2.5]), torch.tensor([-0.5])]
    rltrace.replay.freeze(1, {"rollout_log_probs": q, "train_log_probs": p, "response_tokens": [[4, 5], [6]]})
    rltrace.replay.flush()
    data = cli_json(capsys, "replay", "diff", tmp_path / "run", "--step", 1, "--recorded", "rollout_log_probs", "train_log_probs")
    (d,) = data["diffs"]
    assert (d["a"], d["b"], d["tokens"], d["samples_different"]) == ("rollout_log_probs", "train_log_probs", 3, 1)
    assert d["mean_abs"] == pytest.approx(0.5 / 3) and d["top_tokens"][0]["token_id"] == 5
    code, out, _ = cli(capsys, "replay", "diff", tmp_path / "run", "--step", 1, "--recorded", "rollout_log_probs", "train_log_probs")
    assert code == 0 and "recorded columns of step 1" in out and "train_log_probs" in out
    code, _, err = cli(capsys, "replay", "diff", tmp_path / "run", "--step", 1, "--recorded", "rollout_log_probs", "x")
    assert code == 2 and "has no column 'x'" in err and "Traceback" not in err
    code, _, err = cli(capsys, "replay", "diff", tmp_path / "run", "--step", 1, "--recorded", "a", "b", "--pair", "x=y")
    assert code == 2 and "takes no --replay" in err


def test_decompose(capsys, run_dir):
    code, out, _ = cli(capsys, "replay", "decompose", run_dir, "--step", 3, "--entry", f"{ENTRIES}:logprobs_at")
    assert code == 0 and "parameter staleness" in out and "engine gap" in out and "by age" in out
    data = cli_json(capsys, "replay", "decompose", run_dir, "--step", 3, "--entry", f"{ENTRIES}:logprobs_at")
    assert data["versions"] == [0, 1, 2] and data["share_staleness"] + data["share_engine"] == pytest.approx(1)


def test_request_reaches_a_running_freezer(capsys, run_dir):
    freezer = rltrace.replay.Freezer()
    rltrace.init(run_dir)
    assert freezer.decide(10) is None
    code, out, _ = cli(capsys, "replay", "request", run_dir, "--reason", "text looks wrong")
    assert code == 0 and freezer.decide(11) == ("request", "text looks wrong")


@pytest.mark.parametrize("damage, message", [("truncate", "truncated or not a Parquet file"), ("newer", "newer than this rltrace reads")])
def test_bad_parts_are_one_line_errors(capsys, run_dir, damage, message):
    part = next((run_dir / "batches").glob("*.parquet"))
    if damage == "truncate":
        part.write_bytes(part.read_bytes()[:300])
    else:
        import pyarrow.parquet as pq

        from rltrace import _names
        from rltrace.store.parts import write_part

        newer = _names.Table("batches", "batches", _names.BATCHES_SCHEMA, 99, ())
        write_part(part.parent, part.name, pq.read_table(part), newer)
    for args in (("replay", "show", run_dir, "--step", 3), ("replay", "run", run_dir, "--step", 3, "--entry", f"{ENTRIES}:reward")):
        code, out, err = cli(capsys, *args)
        assert code == 2 and message in err and part.name in err and "Traceback" not in err and err.count("\n") == 1
    code, out, err = cli(capsys, "replay", "list", run_dir)  # a list reads every batch: it names the bad one
    assert code == 2 and message in err and part.name in err and "--skip-corrupt" in err and err.count("\n") == 1
    code, out, err = cli(capsys, "replay", "list", run_dir, "--skip-corrupt")
    assert code == 0 and "unreadable part skipped" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (("replay", "show", "{run}", "--step", 9), "no frozen batch at step 9; frozen steps: [3]"),
        (("replay", "show", "{run}", "--step", 3, "--sample", 99), "--sample 99 is out of range"),
        (("replay", "show", "{run}", "--step", 3, "--tokenizer", "tests.nothing:x"), "cannot import tests.nothing"),
        (("replay", "run", "{run}", "--step", 3, "--entry", f"{ENTRIES}:broken"), "the reward server is down"),
        (("replay", "diff", "{run}", "--step", 3), "no replay of step 3 yet"),
        (("replay", "compare", "{run}", "--step", 3, "--entry", f"{ENTRIES}:reward"), "needs two entries"),
        (("replay", "list", "{run}/nope"), "does not exist"),
        (("replay", "request", "{run}/nope"), "does not exist"),
        (("export", "{run}", "--format", "slime", "--out", "{run}/x.pt", "--step", 7), "no frozen batch at step 7"),
        (("export", "{run}", "--format", "slime", "--out", "{run}/a{b}.pt"), "only {rollout_id} is filled in"),
        (("export", "{run}", "--format", "slime", "--out", "{run}/a{0}.pt"), "write {{ and }} for literal braces"),
    ],
)
def test_user_mistakes_are_one_line_errors(capsys, run_dir, args, message):
    code, _, err = cli(capsys, *[str(a).replace("{run}", str(run_dir)) for a in args])
    assert code == 2 and message in err and "Traceback" not in err


def test_a_tokenizer_mismatch_names_the_field(capsys, tmp_path):
    rltrace.init(tmp_path / "run")
    rltrace.replay.freeze(1, [{"response_tokens": torch.tensor([3])}], batch_meta={"tokenizer": {"a": 1}})
    rltrace.replay.flush()
    code, _, err = cli(capsys, "replay", "show", tmp_path / "run", "--step", 1, "--tokenizer", TOKENIZER)
    assert code == 2 and "field tokenizer_hash" in err and "(tests/char-tokenizer)" in err and err.count("\n") == 1


def test_import_and_export_slime(capsys, tmp_path):
    rollout = rollout_dump(tmp_path / "dump" / "rollout_data" / "5.pt", 5)
    train_dump(tmp_path / "dump" / "train_data" / "5.pt", 5, rollout)
    code, out, _ = cli(capsys, "import", "slime", tmp_path / "dump", "--out", tmp_path / "run")
    assert code == 0 and "step 5: 4 samples" in out and "8 spans" in out
    code, out, _ = cli(capsys, "export", tmp_path / "run", "--format", "slime", "--out", tmp_path / "back.pt")
    assert code == 0 and "back.pt" in out
    data = torch.load(tmp_path / "back.pt", weights_only=True)
    assert [s["index"] for s in data["samples"]] == [0, 1, 2, 3] and data["rollout_id"] == 5


def test_slime_import_errors_are_one_line(capsys, tmp_path):
    sample = sample_dict(0)
    del sample["status"]
    torch.save({"rollout_id": 0, "samples": [sample, sample_dict(1)]}, tmp_path / "odd.pt")
    code, out, err = cli(capsys, "import", "slime", tmp_path / "odd.pt", "--out", tmp_path / "run")  # a bad sample costs only itself
    assert code == 0 and "step 0: 1 samples" in out and "Traceback" not in err
    assert "left out" in out and "odd.pt, sample 0: field 'status' is missing" in out.replace("\n", "")
    (tmp_path / "junk.pt").write_bytes(b"\x80\x04junk")
    code, _, err = cli(capsys, "import", "slime", tmp_path / "junk.pt", "--out", tmp_path / "run")
    assert code == 2 and "junk.pt: not a readable torch.save file" in err and "--trust-pickle" not in err


def test_every_frozen_batch_is_one_command_away(capsys, tmp_path):
    """`--step all`: one table of the samples of every batch, sorted by a flag or a column, and
    one rerun of an entry over every batch."""
    from rltrace import replay
    from tests.replay.tiny import make_samples

    run_dir, tok, _ = make_run(tmp_path, versions=(0, 1, 2))
    meta = {"weight_version": 2, "tokenizer": tok, "checkpoint": str(run_dir / "ckpt" / "v2.pt"), "max_response_len": 12}
    assert replay.freeze(5, make_samples(tok, run_dir / "ckpt", n=4, versions=(2,)), batch_meta=meta)
    replay.flush()
    rltrace.shutdown()
    shown = cli_json(capsys, "replay", "show", run_dir, "--step", "all", "--sort", "response_len")["samples"]
    assert sorted({(s["step"], s["batch_id"] is not None) for s in shown}) == [(3, True), (5, True)] and len(shown) == 12
    lengths = [s["response_len"] for s in shown]
    assert lengths == sorted(lengths, reverse=True)
    truncated = cli_json(capsys, "replay", "show", run_dir, "--step", "all", "--sort", "truncated")["samples"]
    flagged = ["truncated" in s["flags"] for s in truncated]
    assert any(flagged) and flagged == sorted(flagged, reverse=True)  # flagged first
    code, _, err = cli(capsys, "replay", "show", run_dir, "--step", "all", "--sort", "nonsense")
    assert code == 2 and "neither a flag" in err
    ran = cli_json(capsys, "replay", "run", run_dir, "--step", "all", "--entry", f"{ENTRIES}:reward")["batches"]
    assert [b["step"] for b in ran] == [3, 5] and all(b["diffs"][0]["bitwise_equal"] for b in ran)
    assert [b["replays"] for b in cli_json(capsys, "replay", "list", run_dir)["batches"]] == [1, 1]


def test_reward_outliers_sort_by_how_far_they_are():
    from rltrace.cli.replay import _sort_views

    views = [{"step": 1, "batch_id": "b", "reward": r, "flags": {"reward_outlier": "x"} if abs(r) > 2 else {}}
             for r in (0.1, 0.2, 9.0, 0.0, -30.0, 0.15, 3.0)]
    assert [v["reward"] for v in _sort_views(views, "reward_outlier")][:3] == [-30.0, 9.0, 3.0]
