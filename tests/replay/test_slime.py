"""slime dumps in and out: import joins rollout and train dumps and turns traces into spans;
export writes a rollout dump that torch.load(weights_only=True) reads and that matches the original."""

import json

import pytest
import torch

import rltrace
import rltrace.replay as replay
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
        (["not", "a", "dict"], "expected a dict with 'rollout_id' and 'samples'"),
        ({"samples": []}, "field 'rollout_id' is missing"),
        ({"rollout_id": "x", "samples": []}, "field 'rollout_id' is 'x'"),
        ({"rollout_id": 0, "samples": {}}, "field 'samples' is dict"),
        ({"rollout_id": 0, "samples": [{"status": "completed", "response_length": 1}]}, "sample 0: field 'tokens' is missing"),
        ({"rollout_id": 0, "samples": [{"tokens": [1], "response_length": 1}]}, "sample 0: field 'status' is missing"),
        ({"rollout_id": 0, "samples": [{"tokens": [1, 2], "response_length": 5, "status": "completed"}]}, r"field 'response_length' is 5, expected 0..2"),
        ({"rollout_id": 0, "samples": [{"tokens": ["a"], "response_length": 0, "status": "completed"}]}, "field 'tokens': expected a list of token ids"),
        ({"rollout_id": 0, "samples": [{"tokens": [1], "response_length": 0, "status": 3}]}, "field 'status' is 3"),
        ({"format_version": 3, "rollout_id": 0, "samples": []}, "format_version 3 is not supported"),
    ],
)
def test_odd_dumps_are_errors_naming_file_and_field(tmp_path, payload, message):
    path = tmp_path / "odd.pt"
    torch.save(payload, path)
    with pytest.raises(SlimeDumpError, match=message) as err:
        import_slime([path], tmp_path / "run")
    assert str(path) in str(err.value)


def test_truncated_and_foreign_files(tmp_path, dumps):
    root, _, _ = dumps
    path = root / "rollout_data" / "0.pt"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(SlimeDumpError, match="not a readable torch.save file"):
        import_slime([path], tmp_path / "run")
    path.write_text("hello")
    with pytest.raises(SlimeDumpError, match="not a readable torch.save file"):
        import_slime([path], tmp_path / "run")
    with pytest.raises(SlimeDumpError, match="no such file or directory"):
        import_slime([tmp_path / "missing.pt"], tmp_path / "run")


def test_train_dump_of_another_rollout_is_refused(tmp_path, dumps):
    root, rollouts, _ = dumps
    other = [sample_dict(i + 10) for i in range(4)]  # other tokens...
    for s, o in zip(other, rollouts[0]):
        s["index"] = o["index"]  # ...under the same sample indices
    train_dump(root / "train_data" / "0.pt", 0, other)
    with pytest.raises(SlimeDumpError, match="field 'tokens' differs from rollout sample 0"):
        import_slime([root / "rollout_data" / "0.pt", root / "train_data" / "0.pt"], tmp_path / "run")


def test_pickles_that_need_more_than_the_safe_loader_need_trust(tmp_path):
    samples = [sample_dict(0)]
    samples[0]["label"] = CustomLabel("x")
    path = tmp_path / "custom.pt"
    torch.save({"rollout_id": 0, "samples": samples}, path)
    with pytest.raises(SlimeDumpError, match="pass --trust-pickle only if you trust it") as err:
        import_slime([path], tmp_path / "run")
    assert "CustomLabel" in str(err.value)
    with pytest.raises(SlimeDumpError, match="field 'label' holds CustomLabel.*--drop-field label"):
        import_slime([path], tmp_path / "run", trust_pickle=True)
    import_slime([path], tmp_path / "run", trust_pickle=True, drop=["label"])
    assert replay.load(tmp_path / "run", 0)["response_text"] == ["answer 0"]


def test_exported_files_hold_no_pickled_objects_beyond_tensors(tmp_path, dumps):
    root, _, _ = dumps
    import_slime([root], tmp_path / "run")
    (path,) = export_slime(tmp_path / "run", str(tmp_path / "x.pt"), step=1)
    torch.load(path, weights_only=True)  # raises on anything else
    with pytest.raises(SlimeDumpError, match="pass --step N, or an --out with {rollout_id}"):
        export_slime(tmp_path / "run", str(tmp_path / "y.pt"))
