"""Entry points run on a frozen batch; results are stored next to it and compared with the record."""

import sys
from pathlib import Path

import pytest
import torch

import rltrace
from rltrace.replay.diff import diff_against_record, diff_replays, repeatability
from rltrace.replay.errors import ReplayError, TokenizerMismatchError
from rltrace.replay.rerun import latest_replay, load_entry, load_replays, run_entry
from tests.replay.tiny import CharTokenizer, make_run

ENTRIES = str(Path(__file__).parent / "entries.py")


def test_a_recomputed_reward_matches_the_record_and_is_stored(tmp_path):
    run_dir, _, samples = make_run(tmp_path)
    result = run_entry(run_dir, 3, f"{ENTRIES}:reward", repeat=2)
    assert [r.repeat for r in result.repeats] == [0, 1]
    assert repeatability(result.repeats) == {"reward": True}
    stored = latest_replay(run_dir, 3)
    assert [r.replay_id for r in stored] == [result.replay_id] * 2
    assert stored[0]["reward"] == [s["reward"] for s in samples]
    (d,) = diff_against_record(rltrace.replay.load(run_dir, 3), stored[0])
    assert (d.a, d.b, d.bitwise_equal, d.samples_different, d.max_abs) == ("reward", "reward", True, 0, 0.0)
    con = rltrace.store.open(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT repeat) FROM replays WHERE replay_id = ?", [result.replay_id]).fetchone() == (16, 2)  # 8 samples x 2 repeats


def test_training_forward_against_the_bf16_rollout_engine_shows_the_mismatch(tmp_path):
    run_dir, _, samples = make_run(tmp_path, versions=(2,), rollout_dtype=torch.bfloat16)
    result = run_entry(run_dir, 3, f"{ENTRIES}:logprobs_fp32")
    batch = rltrace.replay.load(run_dir, 3)
    (d,) = diff_against_record(batch, result.repeats[0])
    assert (d.a, d.b, d.per_token) == ("rollout_log_probs", "log_probs", True)
    assert d.tokens == sum(len(s["response_tokens"]) for s in samples)
    assert 0 < d.mean_abs < 0.1 and d.k3 > 0 and not d.aligned
    worst = d.top_tokens[0]
    assert worst["token_id"] == int(samples[worst["sample_index"]]["response_tokens"][worst["position"]])


def test_an_fp32_rollout_engine_is_aligned_with_the_fp32_trainer(tmp_path):
    run_dir, _, _ = make_run(tmp_path, versions=(2,), rollout_dtype=torch.float32)
    result = run_entry(run_dir, 3, f"{ENTRIES}:logprobs_fp32")
    (d,) = diff_against_record(rltrace.replay.load(run_dir, 3), result.repeats[0])
    assert d.bitwise_equal and d.aligned and d.mean_abs == 0.0


def test_repeatable_is_not_aligned(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    a = run_entry(run_dir, 3, f"{ENTRIES}:logprobs_fp32", repeat=2)
    b = run_entry(run_dir, 3, f"{ENTRIES}:logprobs_bf16", repeat=2)
    assert repeatability(a.repeats) == {"log_probs": True} and repeatability(b.repeats) == {"log_probs": True}
    (d,) = diff_replays(a.repeats[0], b.repeats[0], rltrace.replay.load(run_dir, 3))
    assert not d.bitwise_equal and not d.aligned and d.mean_abs > 1e-4


def test_a_noisy_entry_is_not_repeatable(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    result = run_entry(run_dir, 3, f"{ENTRIES}:noisy", repeat=2)
    assert repeatability(result.repeats) == {"reward": False}


def test_each_repeat_gets_a_fresh_batch(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    result = run_entry(run_dir, 3, f"{ENTRIES}:mutating", repeat=3)
    assert repeatability(result.repeats) == {"reward": True}
    assert rltrace.replay.load(run_dir, 3)["response_tokens"][0][0] < 100  # the part on disk is untouched


def test_entries_named_by_module(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])  # the repository root, as for `python -m rltrace`
    assert load_entry("tests.replay.entries:reward").__name__ == "reward"


def test_an_entry_file_imports_its_neighbours(tmp_path, monkeypatch):
    """`--entry path/to/file.py:fn` works like `python path/to/file.py`: modules beside it import."""
    code = tmp_path / "my_eval"
    code.mkdir()
    (code / "my_reward_lib.py").write_text("def score(text):\n    return float(len(text))\n")
    (code / "eval_entry.py").write_text(
        "import my_reward_lib\n\n"
        "def reward(batch):\n"
        "    return {'reward': [my_reward_lib.score(t) for t in batch['response_text']]}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # undone after the test (the entry adds its own folder)
    monkeypatch.chdir(tmp_path)  # the file is named relative to here, not from its own folder
    run_dir, _, _ = make_run(tmp_path / "runs")
    result = run_entry(run_dir, 3, "my_eval/eval_entry.py:reward")
    texts = rltrace.replay.load(run_dir, 3)["response_text"]
    assert result.repeats[0]["reward"] == [float(len(t)) for t in texts]


def test_an_entry_found_through_sys_path_is_recorded_by_its_file_and_reruns_from_anywhere(tmp_path, monkeypatch):
    """`--entry my_rewards_xyz:reward` imports because PYTHONPATH (here: sys.path) names its folder;
    a rerun from another folder, without it, needs the file: that is what the replay records."""
    lib, work, elsewhere = tmp_path / "lib", tmp_path / "work", tmp_path / "elsewhere"
    for folder in (lib, work, elsewhere):
        folder.mkdir()
    (lib / "my_rewards_xyz.py").write_text(
        "def reward(batch):\n    return {'reward': [float(len(t)) for t in batch['response_text']]}\n")
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.delitem(sys.modules, "my_rewards_xyz", raising=False)
    monkeypatch.chdir(work)
    run_dir, _, _ = make_run(tmp_path / "runs")
    first = run_entry(run_dir, 3, "my_rewards_xyz:reward")
    recorded = f"{lib / 'my_rewards_xyz.py'}:reward"
    assert first.entry == recorded and first.label == "my_rewards_xyz:reward"
    assert [r.entry for r in load_replays(run_dir)] == [recorded]
    monkeypatch.syspath_prepend(str(elsewhere))  # keeps monkeypatch's undo; then the lib folder goes
    sys.path.remove(str(lib))
    del sys.modules["my_rewards_xyz"]
    monkeypatch.chdir(elsewhere)
    again = run_entry(run_dir, 3, first.entry)  # as a user copies it from `rltrace replay list`
    assert again.repeats[0]["reward"] == first.repeats[0]["reward"]
    sys.path.remove(str(lib))  # the file's folder, put first by loading it as a file
    with pytest.raises(ReplayError, match="cannot import my_rewards_xyz"):
        run_entry(run_dir, 3, "my_rewards_xyz:reward")  # what used to be recorded


def test_an_entry_of_an_installed_or_local_module_keeps_its_module_name(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])  # the repository root, where `tests` imports from
    run_dir, _, _ = make_run(tmp_path / "runs")
    assert run_entry(run_dir, 3, "tests.replay.entries:reward").entry == "tests.replay.entries:reward"
    (tmp_path / "local_entry_xyz.py").write_text("def fn(batch):\n    return {'x': [0.0] * len(batch)}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "local_entry_xyz", raising=False)
    assert run_entry(run_dir, 3, "local_entry_xyz:fn").entry == "local_entry_xyz:fn"  # importable from here
    assert run_entry(run_dir, 3, "local_entry_xyz.py:fn").entry == f"{tmp_path / 'local_entry_xyz.py'}:fn"


@pytest.mark.parametrize(
    "entry, message",
    [
        ("entries.py", "expected module:name"),
        ("no/such/file.py:f", "does not exist"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        (f"{ENTRIES}:nope", "has no attribute 'nope'"),
        (f"{ENTRIES}:_VOCAB", "is not a function"),
    ],
)
def test_bad_entry_names_are_clear(entry, message):
    with pytest.raises(ReplayError, match=message):
        load_entry(entry)


def test_a_failing_entry_says_where_and_stores_nothing(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    with pytest.raises(ReplayError, match=r"failed on repeat 1: RuntimeError: the reward server is down \(.*entries.py:\d+\)"):
        run_entry(run_dir, 3, f"{ENTRIES}:broken")
    assert load_replays(run_dir, step=3) == []


def test_a_result_with_the_wrong_number_of_rows_is_refused(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    with pytest.raises(ReplayError, match="returned 'reward' with 1 rows; the batch has 8 samples"):
        run_entry(run_dir, 3, f"{ENTRIES}:wrong_rows")


def test_rerunning_with_another_tokenizer_is_refused(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    with pytest.raises(TokenizerMismatchError, match="tokenizer_hash"):
        run_entry(run_dir, 3, f"{ENTRIES}:reward", tokenizer=CharTokenizer(alphabet="xyz"))


def test_unknown_replay_id_is_clear(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    with pytest.raises(ReplayError, match="no replay abc"):
        load_replays(run_dir, replay_id="abc")
    with pytest.raises(ReplayError, match="no replay of step 3 yet"):
        latest_replay(run_dir, 3)


def test_an_entry_file_imports_its_neighbours_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "neighbour_of_entry_xyz.py").write_text("VALUE = 7\n")
    (tmp_path / "lib" / "entry.py").write_text("import neighbour_of_entry_xyz\n\ndef fn(batch):\n    return neighbour_of_entry_xyz.VALUE\n")
    monkeypatch.chdir(tmp_path)  # not the file's folder
    assert load_entry(f"{tmp_path / 'lib' / 'entry.py'}:fn")(None) == 7
    assert str(Path.cwd()) not in sys.path or sys.path.index(str(Path.cwd())) > 0


def test_the_current_directory_never_shadows_an_installed_module(tmp_path, monkeypatch):
    """A `colorsys.py` lying in the current directory is not what `import colorsys` gets."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    monkeypatch.delitem(sys.modules, "entry_in_cwd_xyz", raising=False)
    (tmp_path / "colorsys.py").write_text("raise RuntimeError('the stray copy ran')\n")
    (tmp_path / "entry_in_cwd_xyz.py").write_text("import colorsys\n\ndef fn(batch):\n    return colorsys.__file__\n")
    monkeypatch.chdir(tmp_path)
    assert load_entry("entry_in_cwd_xyz:fn")(None) != str(tmp_path / "colorsys.py")  # modules of the cwd still import
    assert sys.path[-1] == str(tmp_path) and sys.path[0] != str(tmp_path)
