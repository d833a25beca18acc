"""freeze -> load: the batch comes back as it was given; bad parts are clear errors naming the file."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import rltrace
import rltrace.replay as replay
from rltrace import _names
from rltrace.replay.errors import ReplayError, TokenizerMismatchError
from rltrace.store import StoreError
from rltrace.store.parts import write_part
from tests.replay.tiny import CharTokenizer, make_run, same_bits


def test_rows_come_back_bit_exact_with_batch_fields(tmp_path):
    run_dir, tok, samples = make_run(tmp_path)
    batch = replay.load(run_dir, 3)
    assert batch.form == "rows" and len(batch) == len(samples)
    for given, back in zip(samples, batch.original()):
        assert set(given) == set(back)
        for key, value in given.items():
            assert same_bits(value, back[key]) if isinstance(value, torch.Tensor) else value == back[key], key
    assert batch.meta["train_version"] == 2
    assert batch.meta["tokenizer_name"] == "tests/char-tokenizer"
    assert batch.meta["tokenizer_hash"] == replay.tokenizer_identity(tok)[1]
    assert batch.meta["checkpoint"].endswith("v2.pt")
    assert batch.extra["max_response_len"] == 12
    assert batch.extra["special_token_ids"] == tok.all_special_ids  # taken from the tokenizer
    assert batch.meta["trigger"] == "on_demand"


def test_columns_come_back_as_the_same_tensors(tmp_path):
    rltrace.init(tmp_path / "run")
    columns = {
        "response_tokens": torch.randint(0, 50_000, (6, 7)),
        "rollout_log_probs": torch.randn(6, 7).to(torch.bfloat16),
        "loss_mask": torch.ones(6, 7, dtype=torch.bool),
        "reward": torch.rand(6),
        "response_text": ["a", "b", "c", "d", "e", ""],
        "weight_version": [1, 1, 2, 2, 3, 3],
    }
    assert replay.freeze(5, columns, batch_meta={"weight_version": 3, "config": {"lr": 1e-6}})
    replay.flush()
    batch = replay.load(tmp_path / "run", 5)
    assert batch.form == "columns"
    back = batch.original()
    for name, value in columns.items():
        assert same_bits(value, back[name]) if isinstance(value, torch.Tensor) else back[name] == value
    assert batch.meta["config"] == {"lr": 1e-6}
    row = batch.sample(2)
    assert row["response_text"] == "c" and same_bits(row["response_tokens"], columns["response_tokens"][2])


def test_batches_view_has_one_row_per_sample_with_list_columns(tmp_path):
    run_dir, _, samples = make_run(tmp_path)
    con = rltrace.store.open(run_dir)
    rows = con.execute(
        "SELECT sample_index, len(response_tokens), reward, train_version, weight_version, finish_reason "
        "FROM batches WHERE step = 3 ORDER BY sample_index"
    ).fetchall()
    assert [r[0] for r in rows] == list(range(len(samples)))
    assert [r[1] for r in rows] == [len(s["response_tokens"]) for s in samples]
    assert [r[2] for r in rows] == [s["reward"] for s in samples]
    assert {r[3] for r in rows} == {2}
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE batches)").fetchall())
    assert types["response_tokens"] == "INTEGER[]" and types["rollout_log_probs"] == "FLOAT[]"
    mean = con.execute("SELECT avg(list_avg(rollout_log_probs)) FROM batches").fetchone()[0]
    assert mean == pytest.approx(np.mean([float(s["rollout_log_probs"].double().mean()) for s in samples]))


def test_the_latest_batch_of_a_step_wins_unless_one_is_named(tmp_path):
    rltrace.init(tmp_path / "run")
    replay.freeze(1, [{"reward": 1.0}], reason="first")
    replay.flush()
    replay.freeze(1, [{"reward": 2.0}], reason="second")
    replay.flush()
    assert replay.load(tmp_path / "run", 1)["reward"] == [2.0]
    first = next(p for p in (tmp_path / "run" / "batches").iterdir() if replay.load(tmp_path / "run", 1, batch_id=p.stem.split("-")[1])["reward"] == [1.0])
    assert first.name.startswith("0000000001-")


def test_missing_step_lists_the_frozen_steps(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    with pytest.raises(ReplayError, match=r"no frozen batch at step 9; frozen steps: \[3\]"):
        replay.load(run_dir, 9)


def test_loading_one_step_reads_only_that_steps_parts(tmp_path, monkeypatch):
    """A run may hold thousands of batches: loading one checks the footers of its own step's parts
    (a damaged part of another step costs nothing), while a missing step still lists every frozen step."""
    from rltrace.store import views

    rltrace.init(tmp_path / "run")
    for step in range(4):
        replay.freeze(step, [{"reward": float(step)}])
        replay.flush()
    rltrace.shutdown()
    folder = tmp_path / "run" / "batches"
    next(folder.glob("0000000001-*.parquet")).write_bytes(b"not parquet")
    checked = []
    real = views._check_part
    monkeypatch.setattr(views, "_check_part", lambda path, *a: checked.append(path.name) or real(path, *a))
    assert replay.load(tmp_path / "run", 2)["reward"] == [2.0]
    assert [name.split("-")[0] for name in checked] == ["0000000002"]
    with pytest.raises(ReplayError, match=r"no frozen batch at step 9; frozen steps: \[0, 1, 2, 3\]"):
        replay.load(tmp_path / "run", 9)


def test_a_tokenizer_with_another_vocabulary_is_refused_naming_the_field(tmp_path):
    run_dir, tok, _ = make_run(tmp_path)
    replay.load(run_dir, 3, tokenizer=tok)
    other = CharTokenizer(alphabet="abc")
    with pytest.raises(TokenizerMismatchError, match="field tokenizer_hash") as err:
        replay.load(run_dir, 3, tokenizer=other)
    assert "batches/0000000003-" in str(err.value)


def test_tokenizer_identity_reads_every_kind_of_vocabulary():
    class ListVocab:
        vocab = ["<pad>", "a", "b"]

    by_list = replay.tokenizer_identity(ListVocab())
    digest = replay.tokenizer_identity({"<pad>": 0, "a": 1, "b": 2})[1]
    assert by_list == (f"vocab-3-{digest[:12]}", digest)  # no name of its own: named by its vocabulary
    assert by_list[1] != replay.tokenizer_identity({"<pad>": 0, "a": 2, "b": 1})[1]
    with pytest.raises(ReplayError, match="cannot read the vocabulary of tokenizer object"):
        replay.tokenizer_identity(object())


def _only_part(run_dir):
    return next((run_dir / "batches").glob("*.parquet"))


def test_a_truncated_part_is_an_error_naming_the_file(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    part = _only_part(run_dir)
    part.write_bytes(part.read_bytes()[:-100])
    with pytest.raises(ReplayError, match="truncated or not a Parquet file") as err:
        replay.load(run_dir, 3)
    assert part.name in str(err.value)


def test_a_foreign_parquet_file_is_an_error_naming_the_file(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    part = _only_part(run_dir)
    pq.write_table(pa.table({"x": [1, 2]}), part)
    with pytest.raises(ReplayError, match="not an rltrace part"):
        replay.load(run_dir, 3)


def test_a_newer_schema_version_asks_for_an_upgrade(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    part = _only_part(run_dir)
    table = pq.read_table(part)
    newer = _names.Table("batches", "batches", _names.BATCHES_SCHEMA, _names.BATCHES.version + 1, ())
    write_part(part.parent, part.name, table, newer)
    with pytest.raises(ReplayError, match="schema version 2, newer than this rltrace reads"):
        replay.load(run_dir, 3)


def test_a_damaged_codec_field_is_named(tmp_path):
    run_dir, _, _ = make_run(tmp_path)
    part = _only_part(run_dir)
    table = pq.read_table(part)
    spec = json.loads(table.column("codec")[0].as_py())
    spec["response_tokens"]["storage"] = "bf16"  # lies about the storage: decoding must fail cleanly
    table = table.set_column(table.schema.get_field_index("codec"), "codec", pa.array([json.dumps(spec)] * table.num_rows))
    write_part(part.parent, part.name, table, _names.BATCHES)
    batch = replay.load(run_dir, 3)
    with pytest.raises(ReplayError, match="field response_tokens cannot be decoded"):
        batch["response_tokens"]


def test_a_run_dir_that_is_not_a_run_is_a_store_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        replay.load(tmp_path / "nope", 1)


@pytest.mark.slow
def test_ten_thousand_samples_with_long_responses(tmp_path):
    rltrace.init(tmp_path / "run")
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 8192, (10_000,), generator=g).tolist()
    samples = [
        {
            "response_tokens": torch.randint(0, 151_000, (n,), generator=g, dtype=torch.int32),
            "rollout_log_probs": torch.full((n,), -0.5, dtype=torch.bfloat16),
            "reward": float(i),
        }
        for i, n in enumerate(lengths)
    ]
    assert replay.freeze(0, samples)
    replay.flush()
    batch = replay.load(tmp_path / "run", 0)
    assert len(batch) == 10_000
    tokens, logps = batch["response_tokens"], batch["rollout_log_probs"]
    for i in (0, 1, 4_999, 9_999):
        assert same_bits(samples[i]["response_tokens"], tokens[i]) and same_bits(samples[i]["rollout_log_probs"], logps[i])
    assert sum(len(t) for t in tokens) == sum(lengths)


def test_a_hugging_face_tokenizer_built_in_code_gets_a_meaningful_name():
    """Its class name (`TokenizersBackend` in transformers 5) says nothing; `name_or_path` is empty."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<pad>": 0, "<|im_end|>": 1, "a": 2, "b": 3}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>")
    name, digest = replay.tokenizer_identity(hf)
    assert name == f"vocab-4-{digest[:12]}" and digest == replay.tokenizer_identity(vocab)[1]
    named = transformers.PreTrainedTokenizerFast(tokenizer_object=core, name_or_path="org/my-model")
    assert replay.tokenizer_identity(named) == ("org/my-model", digest)
