"""slime dumps in and out: import joins rollout and train dumps and turns traces into spans;
export writes a rollout dump that torch.load(weights_only=True) reads and that matches the original."""

import json

import pytest
import torch

import rltrace
import rltrace.replay as replay
from rltrace.cli.info import collect
from rltrace.replay.errors import SlimeDumpError
from rltrace.replay.slime import import_slime
from rltrace.replay.slime_export import export_slime
from tests.replay.slime_dumps import rollout_dump, sample_dict, train_dump
from tests.replay.tiny import make_run


class CustomLabel:
    """Stands for an object the safe unpickler refuses (an image, a custom class)."""

    def __init__(self, text):
        self.text = text


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


@pytest.fixture
def dumps(tmp_path):
    root = tmp_path / "dump"
    rollouts = {rid: rollout_dump(root / "rollout_data" / f"{rid}.pt", rid, n=4, tensors=rid == 1) for rid in (0, 1)}
    trains = {rid: train_dump(root / "train_data" / f"{rid}.pt", rid, rollouts[rid]) for rid in (0, 1)}
    return root, rollouts, trains


def test_import_makes_one_batch_per_rollout_with_train_fields_joined(tmp_path, dumps):
    root, rollouts, trains = dumps
    result = import_slime([root], tmp_path / "run")
    assert [b["step"] for b in result["batches"]] == [0, 1] and result["spans"] == 16 and result["samples"] == 8
    batch = replay.load(tmp_path / "run", 1)
    assert batch.meta["trigger"] == "import" and len(batch) == 4
    first, original, trained = batch.sample(1), rollouts[1][1], trains[1][1]
    assert torch.equal(torch.cat([first["prompt_tokens"], first["response_tokens"]]), original["tokens"])
    assert first["finish_reason"] == "length" and first["sample_id"] == 1 and first["group_id"] == 0
    assert first["weight_versions"] == [3, 4] and first["weight_version"] == 3
    assert first["reward"] == 1.0 and first["response_text"] == "answer 1" and first["prompt_text"] == "prompt 1"
    assert same(first["train_log_probs"], trained["log_probs"]) and same(first["advantages"], trained["advantages"])
    assert same(first["train_rollout_mask_sums"], trained["rollout_mask_sums"])
    assert first["rollout_routed_experts"].shape == (4, 2, 2)


def test_export_gives_back_the_original_rollout_dump(tmp_path, dumps):
    root, rollouts, _ = dumps
    import_slime([root], tmp_path / "run")
    paths = export_slime(tmp_path / "run", str(tmp_path / "out" / "{rollout_id}.pt"))
    assert [p.name for p in paths] == ["0.pt", "1.pt"]
    for rid, path in enumerate(paths):
        data = torch.load(path, weights_only=True)
        assert data["rollout_id"] == rid
        for original, exported in zip(rollouts[rid], data["samples"]):
            assert list(exported) == list(original)
            for key in original:
                assert same(original[key], exported[key]), key


def test_a_batch_frozen_by_rltrace_exports_as_a_slime_rollout_dump(tmp_path):
    run_dir, tok, samples = make_run(tmp_path, versions=(1, 2))
    (path,) = export_slime(run_dir, str(tmp_path / "rollout.pt"), step=3)
    data = torch.load(path, weights_only=True)
    assert data["rollout_id"] == 3 and len(data["samples"]) == len(samples)
    s, given = data["samples"][1], samples[1]
    assert torch.equal(s["tokens"], torch.cat([given["prompt_tokens"], given["response_tokens"]]))
    assert s["response_length"] == len(given["response_tokens"]) and s["weight_versions"] == ["2"]
    assert s["status"] == {"stop": "completed", "length": "truncated"}[given["finish_reason"]]
    assert (s["index"], s["group_index"], s["reward"], s["prompt"]) == (1, 0, given["reward"], given["prompt_text"])


def test_train_dump_alone_still_makes_a_batch(tmp_path, dumps):
    root, _, trains = dumps
    import_slime([root / "train_data" / "0.pt"], tmp_path / "run")
    batch = replay.load(tmp_path / "run", 0)
    assert len(batch) == 4 and batch["sample_id"] == [0, 1, 2, 3]
    assert same(batch["train_log_probs"][2], trains[0][2]["log_probs"])


def test_format_1_train_dumps_are_transposed(tmp_path, dumps):
    root, rollouts, trains = dumps
    columns = {k: [t[k] for t in trains[0]] for k in trains[0][0] if k not in ("sample_index", "rollout_position")}
    columns["sample_indices"] = [t["sample_index"] for t in trains[0]]
    columns["partition"] = [3, 2, 1, 0]  # the reverse of rollout order: the join must follow it
    torch.save({"rollout_id": 0, "rank": 0, "rollout_data": columns}, root / "train_data" / "0.pt")
    import_slime([root / "rollout_data" / "0.pt", root / "train_data" / "0.pt"], tmp_path / "run")
    batch = replay.load(tmp_path / "run", 0)
    assert same(batch["train_log_probs"][2], trains[0][2]["log_probs"])  # joined by sample_index


def test_traces_become_spans_and_sample_rows(tmp_path, dumps):
    root, rollouts, _ = dumps
    import_slime([root / "rollout_data"], tmp_path / "run")
    con = rltrace.store.open(tmp_path / "run")
    spans = con.execute(
        "SELECT name, phase, step, weight_version, parent_span_id IS NULL, duration_s, events FROM spans "
        "WHERE step = 0 AND attr(attributes, 'slime.sample_id') = '1' ORDER BY start_ns"
    ).fetchall()
    assert [(s[0], s[1], s[2], s[3], s[4]) for s in spans] == [("generate_and_rm", "rollout", 0, 3, True), ("sglang_generate", "generate", 0, 3, False)]
    assert spans[0][5] == pytest.approx(0.4) and json.loads(spans[1][6])[0]["name"] == "sglang_pd_summary"
    parent = con.execute("SELECT count(*) FROM spans c JOIN spans p ON c.parent_span_id = p.span_id AND c.trace_id = p.trace_id").fetchone()[0]
    assert parent == 8
    rows = con.execute("SELECT sample_id, prompt_len, response_len, finish_reason, reward, gen_end - gen_start FROM samples WHERE step = 0 ORDER BY sample_id").fetchall()
    assert rows[1][:5] == ("1", 5, 4, "length", 1.0) and rows[1][5] == pytest.approx(0.4)  # ids are stored as text


def test_evaluation_dumps_are_skipped_and_reported(tmp_path, dumps):
    root, _, _ = dumps
    rollout_dump(root / "rollout_data" / "eval_0.pt", 0, n=2)
    result = import_slime([root], tmp_path / "run")
    assert len(result["batches"]) == 2 and "eval_0.pt: evaluation dump" in result["skipped"][0]


@pytest.mark.parametrize(
    "payload, message",
    [
        (["not", "a", "dict"], "not a slime dump: expected a dict with 'rollout_id' and 'samples'"),
        ({"samples": []}, "field 'rollout_id' is missing"),
        ({"rollout_id": "x", "samples": []}, "field 'rollout_id' is 'x'"),
        ({"rollout_id": 2**70, "samples": []}, r"field 'rollout_id' is 2\*\*70, which does not fit int64"),
        ({"rollout_id": 0, "samples": {}}, "field 'samples' is dict"),
        ({"format_version": 3, "rollout_id": 0, "samples": []}, "format_version 3 is not supported"),
    ],
)
def test_a_file_that_is_not_a_slime_dump_is_an_error_naming_file_and_field(tmp_path, payload, message):
    path = tmp_path / "odd.pt"
    torch.save(payload, path)
    with pytest.raises(SlimeDumpError, match=message) as err:
        import_slime([path], tmp_path / "run")
    assert str(path) in str(err.value)
    assert not (tmp_path / "run" / "batches").exists()


@pytest.mark.parametrize(
    "sample, message",
    [
        ({"status": "completed", "response_length": 1}, "field 'tokens' is missing"),
        ({"tokens": [1], "response_length": 1}, "field 'status' is missing"),
        ({"tokens": [1, 2], "response_length": 5, "status": "completed"}, "field 'response_length' is 5, expected 0..2 (len(tokens))"),
        ({"tokens": [1, 2], "response_length": 2**70, "status": "completed"}, "field 'response_length' is 2**70, expected 0..2 (len(tokens))"),
        ({"tokens": ["a"], "response_length": 0, "status": "completed"}, "field 'tokens': expected a list of token ids (integers that fit int64)"),
        ({"tokens": [2**70], "response_length": 0, "status": "completed"}, "field 'tokens': expected a list of token ids (integers that fit int64)"),
        ({"tokens": [1], "response_length": 0, "status": 3}, "field 'status' is 3, expected one of"),
        ("not a sample", "expected a dict (Sample.to_dict()), got str"),
    ],
)
def test_a_bad_sample_costs_only_itself_and_is_counted_with_file_position_and_reason(tmp_path, sample, message):
    """One unreadable sample among good ones, in one of two dumps: every other sample and dump is
    imported; the bad one is counted (`rltrace info`) with its file, its place in the dump and why."""
    good = [sample_dict(i) for i in range(3)]
    path = tmp_path / "dump" / "0.pt"
    path.parent.mkdir()
    torch.save({"rollout_id": 0, "samples": [good[0], sample, good[1], good[2]]}, path)
    rollout_dump(tmp_path / "dump" / "1.pt", 1, n=2)
    result = import_slime([tmp_path / "dump"], tmp_path / "run")
    assert [(b["step"], b["samples"]) for b in result["batches"]] == [(0, 3), (1, 2)]
    assert replay.load(tmp_path / "run", 0)["sample_id"] == [0, 1, 2]
    (line,) = result["dropped"]
    assert line.startswith(f"{path}, sample 1: {message}"), line
    info = collect(str(tmp_path / "run"))
    assert info["rows_dropped"] == 1
    assert [(r["table"], r["count"]) for r in info["drop_reasons"]] == [("slime samples", 1)]
    assert info["drop_reasons"][0]["reason"].startswith(f"{path}, sample 1: {message}")
    con = rltrace.store.open(tmp_path / "run")
    assert con.execute("SELECT step, count(*) FROM samples GROUP BY step ORDER BY step").fetchall() == [(0, 3), (1, 2)]


def test_a_dump_whose_every_sample_is_bad_still_counts_them(tmp_path):
    path = tmp_path / "0.pt"
    torch.save({"rollout_id": 0, "samples": [{"tokens": [1], "response_length": 2**70, "status": "completed"}] * 2}, path)
    result = import_slime([path], tmp_path / "run")
    assert result["batches"] == [] and result["dropped"] == [f"{path}, samples 0 and 1: field 'response_length' is 2**70, expected 0..1 (len(tokens))"]
    assert collect(str(tmp_path / "run"))["rows_dropped"] == 2


def test_a_lone_surrogate_in_a_prompt_is_escaped_not_fatal(tmp_path):
    """What `os.fsdecode` makes of an undecodable byte: stored as its escape, as everywhere in the store."""
    samples = [sample_dict(i) for i in range(3)]
    samples[1]["prompt"] = "bad \udcff prompt"
    samples[2]["response"] = "\ud800"
    samples[2]["metadata"] = {"note": "\udcfe"}
    torch.save({"rollout_id": 0, "samples": samples}, tmp_path / "0.pt")
    result = import_slime([tmp_path / "0.pt"], tmp_path / "run")
    assert result["dropped"] == [] and result["batches"][0]["samples"] == 3
    batch = replay.load(tmp_path / "run", 0)
    assert batch["prompt_text"] == ["prompt 0", "bad \\udcff prompt", "prompt 2"]
    assert batch["response_text"][2] == "\\ud800"
    con = rltrace.store.open(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 3


def test_truncated_and_foreign_files(tmp_path, dumps):
    root, _, _ = dumps
    path = root / "rollout_data" / "0.pt"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(SlimeDumpError, match="not a readable torch.save file"):
        import_slime([path], tmp_path / "run")
    path.write_text("hello")
    with pytest.raises(SlimeDumpError, match="not a slime dump: it holds text"):
        import_slime([path], tmp_path / "run")
    with pytest.raises(SlimeDumpError, match="no such file or directory"):
        import_slime([tmp_path / "missing.pt"], tmp_path / "run")


def test_a_jsonl_log_or_garbage_is_named_as_not_a_slime_dump_never_a_trust_pickle_case(tmp_path):
    log = tmp_path / "metrics.pt"
    log.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    for trust in (False, True):
        with pytest.raises(SlimeDumpError) as err:
            import_slime([log], tmp_path / "run", trust_pickle=trust)
        assert str(err.value) == f"{log}: not a slime dump: it holds JSON text (a log?), not what torch.save writes"
    garbage = tmp_path / "garbage.pt"
    for head in (bytes(range(200, 256)) * 4, b"\x80\x02" + bytes(range(256)), b"PK\x03\x04" + bytes(100)):
        garbage.write_bytes(head)
        with pytest.raises(SlimeDumpError) as err:
            import_slime([garbage], tmp_path / "run")
        assert "--trust-pickle" not in str(err.value) and str(garbage) in str(err.value)
        assert "not a slime dump" in str(err.value) or "not a readable torch.save file" in str(err.value)


def test_a_file_that_is_not_a_dump_costs_only_itself(tmp_path, dumps, capsys):
    from rltrace.cli import main as cli

    root, _, _ = dumps
    (root / "rollout_data" / "notes.pt").write_text("not a dump")
    code = cli(["import", "slime", str(root / "rollout_data"), "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 1 and "not imported" in out and "notes.pt: not a slime dump" in out
    assert [s for s in range(2) if replay.load(tmp_path / "run", s)] == [0, 1]


def test_train_samples_of_another_rollout_are_counted_and_the_rollout_kept(tmp_path, dumps):
    root, rollouts, _ = dumps
    other = [sample_dict(i + 10) for i in range(4)]  # other tokens...
    for s, o in zip(other, rollouts[0]):
        s["index"] = o["index"]  # ...under the same sample indices
    train_dump(root / "train_data" / "0.pt", 0, other)
    result = import_slime([root / "rollout_data" / "0.pt", root / "train_data" / "0.pt"], tmp_path / "run")
    train = root / "train_data" / "0.pt"
    assert result["dropped"] == [f"{train}, train sample {j}: field 'tokens' differs from rollout sample {j}'s; the two dumps "
                                 "are not of the same rollout" for j in range(4)]
    batch = replay.load(tmp_path / "run", 0)
    assert len(batch) == 4 and "train_log_probs" not in batch.columns
    assert collect(str(tmp_path / "run"))["rows_dropped"] == 4


def test_pickles_that_need_more_than_the_safe_loader_need_trust(tmp_path):
    samples = [sample_dict(0), sample_dict(1)]
    samples[0]["label"] = CustomLabel("x")
    path = tmp_path / "custom.pt"
    torch.save({"rollout_id": 0, "samples": samples}, path)
    with pytest.raises(SlimeDumpError, match="pass --trust-pickle only if you trust it") as err:
        import_slime([path], tmp_path / "run")
    assert "CustomLabel" in str(err.value)
    result = import_slime([path], tmp_path / "run", trust_pickle=True)  # the field that cannot be stored costs only itself
    assert result["dropped"] == [f"{path}, sample 0: field 'label' holds CustomLabel, which cannot be stored; "
                                 "leave it out with --drop-field label"]
    batch = replay.load(tmp_path / "run", 0)
    assert batch["response_text"] == ["answer 0", "answer 1"] and [s.get("label") for s in batch["slime"]] == [None, "1"]
    import_slime([path], tmp_path / "run2", trust_pickle=True, drop=["label"])
    assert replay.load(tmp_path / "run2", 0)["response_text"] == ["answer 0", "answer 1"]


def test_a_field_of_another_kind_than_its_column_costs_only_that_sample_field(tmp_path):
    samples = [sample_dict(i) for i in range(3)]
    samples[1]["rollout_log_probs"] = "not numbers"  # a list of floats in the others
    samples[2]["group_index"] = 2**70  # group_id is int64
    torch.save({"rollout_id": 0, "samples": samples}, tmp_path / "0.pt")
    result = import_slime([tmp_path / "0.pt"], tmp_path / "run")
    path = tmp_path / "0.pt"
    assert f"{path}, sample 1: field 'rollout_log_probs' holds str where most samples hold list; leave it out with " \
           "--drop-field rollout_log_probs" in result["dropped"]
    assert f"{path}, sample 2: field 'group_id' holds 2**70, which cannot be stored; leave it out with --drop-field group_id" \
           in result["dropped"]
    batch = replay.load(tmp_path / "run", 0)
    assert len(batch) == 3 and batch["rollout_log_probs"][1] is None and batch["group_id"] == [0, 0, None]


def test_exported_files_hold_no_pickled_objects_beyond_tensors(tmp_path, dumps):
    root, _, _ = dumps
    import_slime([root], tmp_path / "run")
    (path,) = export_slime(tmp_path / "run", str(tmp_path / "x.pt"), step=1)
    torch.load(path, weights_only=True)  # raises on anything else
    with pytest.raises(SlimeDumpError, match="pass --step N, or an --out with {rollout_id}"):
        export_slime(tmp_path / "run", str(tmp_path / "y.pt"))
