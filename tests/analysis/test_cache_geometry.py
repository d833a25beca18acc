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
C_R = 36 * (P_SSM * 2 + P_CONV * 2)  # 36 linear layers · (bf16 SSM state + bf16 conv state): vLLM 0.34's default
C_R_FP32_SSM = 36 * (P_SSM * 4 + P_CONV * 2)  # with mamba_ssm_dtype float32


def test_gqa_and_mha_by_the_formula():
    gqa = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
           "torch_dtype": "bfloat16"}
    g = geometry(gqa)
    assert (g["c_A"], g["c_R"], g["kind"], g["kv_dtype"], g["refused"]) == (57_344, None, "gqa", "bf16", None)
    mha = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "dtype": "float32"}  # head_dim 16
    assert (geometry(mha)["c_A"], geometry(mha)["kind"]) == (2 * 2 * 4 * 16 * 2, "mha")  # a float32 checkpoint serves in bf16
    assert geometry(gqa, kv_dtype="fp8_e5m2")["c_A"] == 57_344 // 2
    nested = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": {**gqa, "torch_dtype": None}}
    assert geometry(nested)["c_A"] == 57_344  # a multimodal config's text model


def test_a_hybrid_model_exactly_and_fp8_halves_only_c_a():
    g = geometry(QWEN3_NEXT)
    assert (g["kind"], g["c_A"], g["c_R"]) == ("hybrid", C_A, C_R) == ("hybrid", 24_576, 39_518_208)
    rows = {r["layer_type"]: r for r in g["layers"]}
    assert (rows["full_attention"]["layers"], rows["linear_attention"]["layers"]) == (12, 36)
    assert (rows["linear_attention"]["P_SSM"], rows["linear_attention"]["P_conv"]) == (P_SSM, P_CONV)
    assert (g["ssm_dtype"], g["conv_dtype"]) == ("bf16", "bf16")  # the model's dtype (mamba_ssm_cache_dtype auto)
    assert geometry({**QWEN3_NEXT, "mamba_ssm_dtype": "float32"})["c_R"] == C_R_FP32_SSM == 77_266_944
    fp8 = geometry(QWEN3_NEXT, kv_dtype="fp8_e4m3")
    assert (fp8["c_A"], fp8["c_R"]) == (C_A // 2, C_R)
    fp32_state = geometry({**QWEN3_NEXT, "mamba_ssm_dtype": "bfloat16"}, ssm_dtype="fp32")  # --ssm-dtype wins
    assert (fp32_state["c_A"], fp32_state["c_R"]) == (C_A, C_R_FP32_SSM)
    listed = {**QWEN3_NEXT, "layer_types": ["linear_attention"] * 3 + ["full_attention"]} | {"num_hidden_layers": 4}
    assert (geometry(listed)["c_A"], geometry(listed)["c_R"]) == (C_A // 12, C_R // 12)


@pytest.mark.parametrize(("change", "reason"), [
    ({"model_type": "deepseek_v3", "kv_lora_rank": 512}, "MLA: measure the cache tensor, the GQA formula does not apply"),
    ({"model_type": "deepseek_v32", "kv_lora_rank": 512, "index_topk": 2048}, "DSA (DeepSeek sparse attention)"),
    ({"layer_types": ["sliding_attention", "full_attention"], "num_hidden_layers": 2}, "sliding-window or chunked attention "
                                                                                         "layers (1 sliding_attention of 2"),
    ({"layer_types": ["mystery_attention", "full_attention"], "num_hidden_layers": 2}, "layer type mystery_attention"),
    ({"model_type": "jamba", "layers_block_type": ["mamba", "attention"]}, "state-space layers of another family"),
    ({"linear_conv_kernel_dim": None}, "linear_attention layers without the gated delta-net sizes (linear_conv_kernel_dim)"),
    ({"num_key_value_heads": None, "num_attention_heads": None, "head_dim": None}, "lacks num_key_value_heads and head_dim"),
    ({"head_dim": None, "hidden_size": None}, "lacks head_dim"),
    ({"layer_types": ["full_attention"]}, "layer_types does not list num_hidden_layers (48) layers"),
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


#: Published Hugging Face configs (their cache-relevant keys, as written in each config.json), with the
#: hand figure of KV bytes per token (the whole model, the served dtype) or the refusal. The same
#: table is in docs/analysis.md, "Which config fields are read".
PUBLISHED = {
    "tiiuae/falcon-7b": ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
                          "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True, "alibi": False,
                          "torch_dtype": "bfloat16"}, 2 * 1 * 64 * 2 * 32),  # 8,192: one KV head (multi_query)
    "tiiuae/falcon-40b": ({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
                           "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True, "alibi": False,
                           "torch_dtype": "bfloat16"}, 2 * 8 * 64 * 2 * 60),  # 122,880
    "tiiuae/falcon-40b (RefinedWeb)": ({"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_head_kv": 8,
                                        "n_layer": 60, "parallel_attn": True, "alibi": False,
                                        "torch_dtype": "bfloat16"}, 2 * 8 * 64 * 2 * 60),
    "openai-community/gpt2": ({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024},
                              2 * 12 * 64 * 2 * 12),  # 36,864: no torch_dtype, read as float32, served in bf16
    "EleutherAI/gpt-neox-20b": ({"model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64,
                                 "num_hidden_layers": 44, "torch_dtype": "float16"}, 2 * 64 * 96 * 2 * 44),
    "THUDM/chatglm3-6b": ({"model_type": "chatglm", "num_layers": 28, "hidden_size": 4096, "num_attention_heads": 32,
                           "kv_channels": 128, "multi_query_attention": True, "multi_query_group_num": 2,
                           "torch_dtype": "float16"}, 2 * 2 * 128 * 2 * 28),  # 28,672
    "mosaicml/mpt-7b": ({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "max_seq_len": 2048,
                         "attn_config": {"attn_type": "multihead_attention", "alibi": True, "clip_qkv": None},
                         "torch_dtype": "bfloat16"}, 2 * 32 * 128 * 2 * 32),  # 524,288: no kv_n_heads, every head
    "databricks/dbrx-base": ({"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40, "max_seq_len": 32768,
                              "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
                              "torch_dtype": "bfloat16"}, 2 * 8 * 128 * 2 * 40),  # 163,840: attn_config.kv_n_heads
    "mistralai/Mistral-7B-v0.3": ({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
                                   "num_key_value_heads": 8, "num_hidden_layers": 32, "sliding_window": None,
                                   "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}, 2 * 8 * 128 * 2 * 32),
    "Qwen/Qwen2.5-7B": ({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                         "num_hidden_layers": 28, "sliding_window": 131072, "use_sliding_window": False,
                         "max_window_layers": 28, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"},
                        2 * 4 * 128 * 2 * 28),  # 57,344: its window is off
    "HuggingFaceTB/SmolLM-135M": ({"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
                                   "num_key_value_heads": 3, "num_hidden_layers": 30, "max_position_embeddings": 2048,
                                   "torch_dtype": "float32"}, 2 * 3 * 64 * 2 * 30),  # 23,040: served in bf16, not fp32
    "mistralai/Mistral-7B-v0.1": ({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
                                   "num_key_value_heads": 8, "num_hidden_layers": 32, "sliding_window": 4096,
                                   "max_position_embeddings": 32768, "torch_dtype": "bfloat16"},
                                  "sliding-window attention (sliding_window 4096 on every layer"),
    "microsoft/Phi-3-mini-4k-instruct": ({"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
                                          "num_key_value_heads": 32, "num_hidden_layers": 32, "sliding_window": 2047,
                                          "max_position_embeddings": 4096, "torch_dtype": "bfloat16"},
                                         "sliding-window attention (sliding_window 2047 on every layer"),
    "google/gemma-2-9b": ({"model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16,
                           "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "sliding_window": 4096,
                           "max_position_embeddings": 8192, "torch_dtype": "float32"},
                          "sliding-window attention (sliding_window 4096 on every other layer"),
    "google/gemma-3-4b-it": ({"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": {
                                 "model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8,
                                 "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 34, "sliding_window": 1024,
                                 "sliding_window_pattern": 6}},
                             "sliding-window attention (sliding_window 1024 on 5 of every 6 layers"),
    "meta-llama/Llama-4-Scout-17B-16E": ({"model_type": "llama4", "torch_dtype": "bfloat16", "text_config": {
                                             "model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
                                             "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48,
                                             "attention_chunk_size": 8192, "max_position_embeddings": 10485760}},
                                         "chunked attention (attention_chunk_size 8192, Llama-4)"),
}


#: llava-hf/llava-1.5-7b-hf: its text_config names only what differs from transformers' LlamaConfig
#: defaults (32 layers, 32 heads, 4,096 wide), which the engines fill through transformers
LLAVA_15 = {"model_type": "llava", "torch_dtype": "float16", "image_token_index": 32000,
            "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                            "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                            "torch_dtype": "float16", "vocab_size": 32064},
            "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_attention_heads": 16,
                              "num_hidden_layers": 24, "patch_size": 14}}


def test_a_text_config_that_leaves_its_sizes_to_transformers_defaults_is_refused_by_name():
    """Never the vision tower's 24 layers, never a guess: the refusal says whose defaults are missing."""
    g = geometry(LLAVA_15)
    assert g["c_A"] is None and g["refused"] == (
        "config.json lacks num_hidden_layers (a positive integer): its llama sizes left to transformers' defaults, "
        "which rltrace does not assume; give a config.json that lists them")


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_read_as_the_engines_read_them(name):
    config, want = PUBLISHED[name]
    g = geometry(json.loads(json.dumps(config)))
    if isinstance(want, str):
        assert g["refused"].startswith(want) and g["c_A"] is None
        assert "not modelled, measure the cache tensor" in g["refused"]
    else:
        assert (g["refused"], g["c_A"]) == (None, want)
        assert g["kv_dtype"] in ("bf16", "fp16")


def test_the_served_dtype_is_said():
    assert geometry(PUBLISHED["HuggingFaceTB/SmolLM-135M"][0])["dtype_from"].startswith(
        "torch_dtype float32, served in bf16")
    assert geometry(PUBLISHED["openai-community/gpt2"][0])["dtype_from"].startswith("no torch_dtype: read as float32")
    assert geometry(PUBLISHED["THUDM/chatglm3-6b"][0])["dtype_from"] == "the config's torch_dtype"
    g = geometry(PUBLISHED["HuggingFaceTB/SmolLM-135M"][0], kv_dtype="fp32")
    assert (g["c_A"], g["dtype_from"]) == (2 * 3 * 64 * 4 * 30, "--kv-dtype")
    layers = [{"layer_types": ["full_attention", "sliding_attention"] * 2, "num_hidden_layers": 4, "sliding_window": 512,
               "num_attention_heads": 4, "head_dim": 8, "torch_dtype": "bfloat16"}]
    assert geometry(layers[0])["refused"].startswith("sliding-window or chunked attention layers (2 sliding_attention of 4")


def test_the_engine_whose_dtype_defaults_apply_is_given_or_read_from_the_spans_and_said(tmp_path):
    smol = PUBLISHED["HuggingFaceTB/SmolLM-135M"][0]  # torch_dtype float32: the engines' `auto` serves it in bf16
    g = geometry(smol, engine="vllm", engine_from="--engine")
    assert g["dtype_from"] == ("torch_dtype float32, served in bf16 (vLLM's dtype auto serves a float32 checkpoint "
                               "in 16 bits; engine from --engine)")
    assert (g["defaults_of"], g["defaults_from"], g["kv_dtype"]) == ("vllm", "--engine", "bf16")
    assert "(vLLM's and SGLang's dtype auto serve" in geometry(smol)["dtype_from"]  # no engine known: both said
    assert geometry(smol)["defaults_of"] is None
    rltrace.init(tmp_path / "run", role="rollout", model=smol)
    with rltrace.phase("rollout", step=0):
        pass
    rltrace.shutdown()
    con = store.open(tmp_path / "run")
    configure_serving(con, engine="sglang")
    geo = serving_section(con)["geometry"]
    assert (geo["defaults_of"], geo["defaults_from"]) == ("sglang", "--engine")
    assert geo["dtype_from"].endswith("(SGLang's dtype auto serves a float32 checkpoint in 16 bits; engine from --engine)")
    from rltrace.analysis.serving import model_geometry

    configure_serving(con)
    read, _, _ = model_geometry(con, ["vllm"])  # the kinds the request spans name (engine_requests.engine_kind)
    assert (read["defaults_of"], read["defaults_from"]) == ("vllm", "the engine spans")
    with pytest.raises(RltraceConfigError, match="--engine 'tgi'"):
        configure_serving(con, engine="tgi")
    assert main(["report", str(tmp_path / "run"), "--engine", "sglang", "--json"]) == 0
