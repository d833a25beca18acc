"""The model's serving cache from its config.json: exact bytes per token (c_A) and per state slot
(c_R), dtype overrides, and refusals for every cache the formulas do not describe."""

from __future__ import annotations

import json

import pytest

import rltrace
from rltrace import store
from rltrace._config import RltraceConfigError
from rltrace.analysis import configure_serving, serving_section
from rltrace.analysis.cache_geometry import DtypeError, geometry
from rltrace.cli import main

#: Qwen3-Next-80B-A3B's cache-relevant config (48 layers: every 4th full attention, the rest gated delta-net)
QWEN3_NEXT = {
    "model_type": "qwen3_next", "num_hidden_layers": 48, "full_attention_interval": 4, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048, "torch_dtype": "bfloat16",
    "linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
C_A = 12 * 2 * 2 * 256 * 2  # 12 full-attention layers · K and V · 2 KV heads · 256 · 2 bytes (bf16)
P_SSM = 32 * 128 * 128
P_CONV = (4 - 1) * (2 * 16 * 128 + 32 * 128)
C_R = 36 * (P_SSM * 4 + P_CONV * 2)  # 36 linear layers · (fp32 SSM state + bf16 conv state)


def test_gqa_and_mha_by_the_formula():
    gqa = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
           "torch_dtype": "bfloat16"}
    g = geometry(gqa)
    assert (g["c_A"], g["c_R"], g["kind"], g["kv_dtype"], g["refused"]) == (57_344, None, "gqa", "bf16", None)
    mha = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "dtype": "float32"}  # head_dim 16
    assert (geometry(mha)["c_A"], geometry(mha)["kind"]) == (2 * 2 * 4 * 16 * 4, "mha")
    assert geometry(gqa, kv_dtype="fp8_e5m2")["c_A"] == 57_344 // 2
    nested = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": {**gqa, "torch_dtype": None}}
    assert geometry(nested)["c_A"] == 57_344  # a multimodal config's text model


def test_a_hybrid_model_exactly_and_fp8_halves_only_c_a():
    g = geometry(QWEN3_NEXT)
    assert (g["kind"], g["c_A"], g["c_R"]) == ("hybrid", C_A, C_R) == ("hybrid", 24_576, 77_266_944)
    rows = {r["layer_type"]: r for r in g["layers"]}
    assert (rows["full_attention"]["layers"], rows["linear_attention"]["layers"]) == (12, 36)
    assert (rows["linear_attention"]["P_SSM"], rows["linear_attention"]["P_conv"]) == (P_SSM, P_CONV)
    assert (g["ssm_dtype"], g["conv_dtype"]) == ("fp32", "bf16")
    fp8 = geometry(QWEN3_NEXT, kv_dtype="fp8_e4m3")
    assert (fp8["c_A"], fp8["c_R"]) == (C_A // 2, C_R)
    bf16_state = geometry(QWEN3_NEXT, ssm_dtype="bf16")
    assert (bf16_state["c_A"], bf16_state["c_R"]) == (C_A, 36 * (P_SSM * 2 + P_CONV * 2))
    listed = {**QWEN3_NEXT, "layer_types": ["linear_attention"] * 3 + ["full_attention"]} | {"num_hidden_layers": 4}
    assert (geometry(listed)["c_A"], geometry(listed)["c_R"]) == (C_A // 12, C_R // 12)


@pytest.mark.parametrize(("change", "reason"), [
    ({"model_type": "deepseek_v3", "kv_lora_rank": 512}, "MLA: measure the cache tensor, the GQA formula does not apply"),
    ({"model_type": "deepseek_v32", "kv_lora_rank": 512, "index_topk": 2048}, "DSA (DeepSeek sparse attention)"),
    ({"layer_types": ["sliding_attention", "full_attention"], "num_hidden_layers": 2}, "layer type sliding_attention"),
    ({"model_type": "jamba", "layers_block_type": ["mamba", "attention"]}, "state-space layers of another family"),
    ({"linear_conv_kernel_dim": None}, "linear_attention layers without the gated delta-net sizes (linear_conv_kernel_dim)"),
    ({"num_key_value_heads": None, "num_attention_heads": None, "head_dim": None}, "lacks num_key_value_heads and head_dim"),
    ({"head_dim": None, "hidden_size": None}, "lacks head_dim"),
    ({"layer_types": ["full_attention"]}, "layer_types does not list num_hidden_layers (48) layers"),
    ({"torch_dtype": None}, "config.json names no dtype"),
])
def test_caches_the_formulas_do_not_describe_are_refused_with_the_reason(change, reason):
    config = {k: v for k, v in {**QWEN3_NEXT, **change}.items() if v is not None}
    g = geometry(config)
    assert reason in g["refused"]
    assert (g["c_A"], g["c_R"], g["layers"]) == (None, None, [])


def test_dtype_names():
    with pytest.raises(DtypeError, match=r"--kv-dtype 'fp9' is not a dtype rltrace knows; use one of .*fp8_e4m3"):
        geometry(QWEN3_NEXT, kv_dtype="fp9")
    assert geometry(QWEN3_NEXT, kv_dtype="torch.float16")["kv_dtype"] == "fp16"


def test_init_stores_the_model_with_the_run_and_report_model_wins(tmp_path, capsys):
    model = tmp_path / "qwen3-next"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_NEXT))
    with pytest.raises(RltraceConfigError, match="does not exist; pass the model's config.json"):
        rltrace.init(tmp_path / "run", role="rollout", model=tmp_path / "nowhere")
    rltrace.init(tmp_path / "run", role="rollout", model=model)
    with rltrace.phase("rollout", step=0):
        pass
    rltrace.shutdown()
    con = store.open(tmp_path / "run")
    s = serving_section(con)
    assert (s["kv_bytes_per_token"], s["state_bytes_per_slot"]) == (C_A, C_R)
    assert s["geometry"]["source"] == str((model / "config.json").resolve())
    assert s["missing"]["requests"].startswith("no engine requests recorded")  # a config, but nothing served yet
    gqa = tmp_path / "gqa.json"
    gqa.write_text(json.dumps({"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                               "head_dim": 128, "torch_dtype": "bfloat16"}))
    assert main(["report", str(tmp_path / "run"), "--json", "--model", str(gqa)]) == 0
    assert json.loads(capsys.readouterr().out)["serving"]["kv_bytes_per_token"] == 57_344
    assert main(["report", str(tmp_path / "run"), "--kv-dtype", "fp9"]) == 2
    assert "--kv-dtype 'fp9' is not a dtype rltrace knows" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "run"), "--kv-bandwidth", "-5"]) == 2
    assert "--kv-bandwidth must be a number of bytes per second > 0" in capsys.readouterr().err


def test_a_refused_model_is_said_once_in_the_findings(tmp_path, capsys):
    rltrace.init(tmp_path / "run", role="rollout", model={"model_type": "deepseek_v3", "kv_lora_rank": 512,
                                                          "num_hidden_layers": 61})
    with rltrace.phase("rollout", step=0):
        pass
    rltrace.shutdown()
    con = store.open(tmp_path / "run")
    configure_serving(con)
    s = serving_section(con)
    assert s["kv_bytes_per_token"] is None and s["missing"]["kv_bytes_per_token"].startswith("MLA: measure")
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f for f in findings if "Cache geometry" in f] == [
        "Cache geometry not computed: MLA: measure the cache tensor, the GQA formula does not apply."]


@pytest.mark.parametrize(("change", "reason"), [
    ({"num_hidden_layers": 2**62}, "num_hidden_layers 4611686018427387904 is not a positive integer up to 1,048,576"),
    ({"num_hidden_layers": 10**30, "model_type": "llama"}, "num_hidden_layers 1000000000000000000000000000000 is not"),
    ({"num_hidden_layers": 1e30}, "num_hidden_layers 1e+30 is not a positive integer"),
    ({"head_dim": 2**62, "model_type": "llama"}, "lacks head_dim for its attention layers (positive integers up to"),
])
def test_hostile_layer_counts_and_sizes_are_refused_before_anything_is_allocated(change, reason):
    g = geometry({**QWEN3_NEXT, **change})
    assert reason in g["refused"] and g["layers"] == []


def test_a_config_nested_100000_deep_is_one_line(tmp_path):
    from rltrace._model import read_config

    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(RltraceConfigError, match="nested too deeply to be a config.json"):
        read_config(path)
