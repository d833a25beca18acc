"""How many bytes a model's serving cache holds per token and per request slot, from its config.json.

Two caches (docs/analysis.md, "Serving capacity"):
- attention layers keep K and V for every token: c_A = Σ over attention layers of 2 · H_KV · d · b_KV / 8
  bytes per token (GQA and MHA alike; unsharded, the whole model);
- linear-attention layers (Qwen3-Next's gated delta-net) keep a fixed state per request slot:
  c_R = Σ over those layers of P_SSM · b_SSM / 8 + P_conv · b_conv / 8, with
  P_SSM = linear_num_value_heads · linear_key_head_dim · linear_value_head_dim and
  P_conv = (linear_conv_kernel_dim − 1) · (2 · linear_num_key_heads · linear_key_head_dim
  + linear_num_value_heads · linear_value_head_dim); the SSM state in the served dtype unless the
  config's `mamba_ssm_dtype` or --ssm-dtype says otherwise (vLLM 0.34's mamba_ssm_cache_dtype
  `auto`), the conv state in the served dtype.

Field names are read as the engines' config convertors read them (vLLM's
ModelConfig.get_total_num_kv_heads / get_head_size, transformers' attribute maps): layers from
num_hidden_layers / n_layer / num_layers / n_layers, heads from num_attention_heads / n_head /
n_heads, KV heads from Falcon's multi_query / num_kv_heads / n_head_kv, MPT's and DBRX's
attn_config.kv_n_heads, ChatGLM's multi_query_group_num, else num_key_value_heads, else every
head; the head size from head_dim, ChatGLM's kv_channels, else hidden size / heads. The served
dtype is the config's torch_dtype, except float32: vLLM's and SGLang's dtype `auto` serve a
float32 checkpoint in 16 bits (bf16), and that is what the cache holds.

Anything these formulas do not describe (MLA and DSA latent caches, sliding-window and chunked
attention layers, whose KV per request is min(tokens, window) rather than per token: Mistral v0.1,
Phi-3, Gemma-2/3, Llama-4's attention_chunk_size; other state-space families, a layer type not
named here) is refused with the reason, never estimated.
"""

from __future__ import annotations

from collections import Counter

from rltrace._config import RltraceError

#: Bits per element of each dtype name a user or a config may give.
DTYPE_BITS = {
    "fp32": 32, "float32": 32, "float": 32,
    "bf16": 16, "bfloat16": 16, "fp16": 16, "float16": 16, "half": 16,
    "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "float8_e4m3fn": 8, "float8_e5m2": 8, "int8": 8,
}
#: The short name each dtype is reported under.
_CANONICAL = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
              "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
FULL, LINEAR = "full_attention", "linear_attention"
GATED_DELTA_NET = ("linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                   "linear_num_key_heads")
FALCON = ("falcon", "RefinedWeb", "RefinedWebModel")  # vLLM's falcon_model_types ("RefinedWeb": the new decoder)
#: the served dtype of a float32 checkpoint under the engines' dtype `auto`
SERVED_FOR_FP32 = "bf16"
#: the engines whose dtype defaults `--engine` names (both serve a float32 checkpoint in bf16 under `auto`)
ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}
#: Config keys of state-space families whose caches these formulas do not describe.
_OTHER_STATE_KEYS = ("layers_block_type", "hybrid_override_pattern", "attn_layer_period", "attn_layer_indices",
                     "mamba_d_state", "ssm_state_size", "attn_type_list", "block_types")


class DtypeError(RltraceError, ValueError):
    """A dtype name that is not in `DTYPE_BITS` (the message lists the names that are)."""


def dtype_name(name: str | None, what: str) -> str | None:
    """The canonical name of a dtype given by a user or a config (`bfloat16` -> `bf16`); None stays None."""
    if name is None:
        return None
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPE_BITS:
        raise DtypeError(f"{what} {name!r} is not a dtype rltrace knows; use one of "
                         f"{', '.join(sorted(set(_CANONICAL.get(k, k) for k in DTYPE_BITS)))}")
    return _CANONICAL.get(key, key)


def _served(engines: str | None) -> str:
    """Whose dtype `auto` serves a float32 checkpoint in 16 bits, as the report says it."""
    who = [ENGINES[e] for e in (engines or "").split("+") if e in ENGINES] or list(ENGINES.values())
    return f"{' and '.join(n + chr(39) + 's' for n in who)} dtype auto serve{'s' if len(who) == 1 else ''} a float32 checkpoint in 16 bits"


def _known(engine: str | None, engine_from: str | None) -> str:
    return f"; engine from {engine_from}" if engine and engine_from else ""


def geometry(config: dict, *, kv_dtype: str | None = None, ssm_dtype: str | None = None,
             source: str | None = None, engine: str | None = None, engine_from: str | None = None) -> dict:
    """Bytes per token and per state slot of the model described by `config` (a config.json as a dict).

    `kv_dtype` overrides the attention cache's dtype (default: the served dtype, see the module
    doc), `ssm_dtype` the recurrent state's (default: the config's `mamba_ssm_dtype`, else the
    served dtype); both by name (`bf16`, `fp8_e4m3`, ...: `DTYPE_BITS`), a wrong name raises
    `DtypeError`. `dtype_from` says where the KV dtype came from; `engine` (`vllm`, `sglang`, or
    both joined by `+`) is whose dtype defaults apply, `engine_from` how it is known (`--engine`,
    the engine spans); both stay in the result (`defaults_of`, `defaults_from`).

    Returns a dict: source, model_type, kind (`mha` / `gqa` / `hybrid`, None when refused),
    kv_dtype, ssm_dtype, conv_dtype, c_A (bytes per token), c_R (bytes per state slot; None
    without linear-attention layers), layers (one dict per layer type: layer_type, layers, per
    (`token` / `state slot`), bytes (all layers of the type), bytes_per_layer, and the formula's
    inputs), refused (None, or why the formulas do not apply: c_A and c_R are then None).
    """
    kv = dtype_name(kv_dtype, "--kv-dtype")
    ssm = dtype_name(ssm_dtype, "--ssm-dtype")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    cfg = {**config, **text} if text and not any(k in config for k in _LAYERS) else config
    out = {"source": source, "model_type": cfg.get("model_type"), "kind": None, "kv_dtype": kv, "ssm_dtype": ssm,
           "conv_dtype": None, "dtype_from": "--kv-dtype" if kv else None, "c_A": None, "c_R": None, "layers": [],
           "refused": None, "defaults_of": engine, "defaults_from": engine_from if engine else None}
    why = _refusal(cfg)
    model = None
    if why is None:
        try:
            model = dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
                               or config.get("dtype"), "the config's dtype")
            if ssm is None and cfg.get("mamba_ssm_dtype") is not None:
                out["ssm_dtype"] = dtype_name(cfg["mamba_ssm_dtype"], "the config's mamba_ssm_dtype")
        except DtypeError as exc:
            model, why = None, f"{exc}: give --kv-dtype"
    if model is None and why is None:  # transformers reads no torch_dtype as float32, and so do the engines
        model = SERVED_FOR_FP32
        out["dtype_from"] = out["dtype_from"] or (f"no torch_dtype: read as float32 and served in bf16 "
                                                  f"({_served(engine)}{_known(engine, engine_from)})")
    elif model == "fp32":
        model = SERVED_FOR_FP32
        out["dtype_from"] = out["dtype_from"] or (f"torch_dtype float32, served in bf16 "
                                                  f"({_served(engine)}{_known(engine, engine_from)})")
    elif model is not None:
        out["dtype_from"] = out["dtype_from"] or "the config's torch_dtype"
    if why is None:
        why = _fill(out, cfg, model)
    if why is not None:
        out.update(kind=None, c_A=None, c_R=None, layers=[], refused=why)
    return out


def _refusal(cfg: dict) -> str | None:
    """Why the formulas do not describe this model's cache, or None."""
    model_type = str(cfg.get("model_type") or "")
    if "index_topk" in cfg or "index_n_heads" in cfg or model_type == "deepseek_v32":
        return ("DSA (DeepSeek sparse attention): measure the cache tensor (MLA latents plus the indexer's keys), "
                "the GQA formula does not apply")
    if "kv_lora_rank" in cfg or model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        return "MLA: measure the cache tensor, the GQA formula does not apply"
    windowed = _windowed(cfg)
    if windowed:
        return windowed
    other = [k for k in _OTHER_STATE_KEYS if k in cfg] + (["model_type " + model_type] if "mamba" in model_type else [])
    if other:
        return (f"state-space layers of another family ({', '.join(other)}): measure the cache tensor, "
                "the formulas here cover attention and gated delta-net layers only")
    return None


def _windowed(cfg: dict) -> str | None:
    """Why a model with sliding-window or chunked attention layers is refused, or None. A window at
    least max_position_embeddings long holds every token (as full attention); Qwen2's
    `use_sliding_window: false` turns its window off."""
    kinds = cfg.get("layer_types")
    if isinstance(kinds, list) and len(kinds) <= MAX_SIZE:
        names = Counter(str(k) for k in kinds)
        windowed = {k: n for k, n in names.items() if "sliding" in k or "chunk" in k}
        if windowed:
            listed = ", ".join(f"{n} {k}" for k, n in sorted(windowed.items()))
            window = cfg.get("sliding_window") or cfg.get("attention_chunk_size")
            return (f"sliding-window or chunked attention layers ({listed} of {len(kinds)}"
                    f"{'' if window is None else f'; window {window}'}): their KV per request is "
                    "min(tokens, window) per layer, not a per-token figure; not modelled, measure the cache tensor")
        return None
    chunk = cfg.get("attention_chunk_size")
    if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0:
        return (f"chunked attention (attention_chunk_size {chunk}, Llama-4): the chunked layers keep KV for "
                "min(tokens, chunk) per request, not a per-token figure; not modelled, measure the cache tensor")
    window = cfg.get("sliding_window")
    if not (isinstance(window, int) and not isinstance(window, bool) and window > 0) or cfg.get("use_sliding_window") is False:
        return None
    longest = cfg.get("max_position_embeddings")
    if isinstance(longest, int) and window >= longest:
        return None  # every request fits the window
    model_type = str(cfg.get("model_type") or "")
    pattern = cfg.get("sliding_window_pattern", 6)
    which = ("every other layer" if model_type.startswith("gemma2") else
             f"{pattern - 1} of every {pattern} layers" if model_type.startswith("gemma3") and _int(pattern) else
             "some layers" if model_type.startswith("gemma") else "every layer")
    return (f"sliding-window attention (sliding_window {window} on {which}, no layer_types): its KV per request is "
            "min(tokens, window) per layer, not a per-token figure; not modelled, measure the cache tensor")


def _fields(cfg: dict) -> tuple[object, object, object]:
    """(attention heads, KV heads, head size) as vLLM's ModelConfig reads them (the module doc)."""
    heads = _first(cfg, "num_attention_heads", "n_head", "n_heads", "num_heads")
    model_type = str(cfg.get("model_type") or "")
    attn = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), dict) else {}
    new_falcon = model_type in FALCON and (cfg.get("new_decoder_architecture") or model_type == "RefinedWeb")
    if not new_falcon and cfg.get("multi_query") is True:
        kv_heads = 1  # Falcon-7B, GPTBigCode
    elif model_type in ("mpt", "dbrx"):
        kv_heads = attn.get("kv_n_heads", heads)
    elif model_type == "chatglm" and cfg.get("multi_query_attention") is False:
        kv_heads = heads
    else:
        kv_heads = _first(cfg, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
        kv_heads = heads if kv_heads is None else kv_heads
    head_dim = _first(cfg, "head_dim", "kv_channels")
    hidden = _first(cfg, "hidden_size", "n_embd", "n_embed", "d_model")
    if head_dim is None and _int(hidden) and _int(heads) and hidden % heads == 0:
        head_dim = hidden // heads
    return heads, kv_heads, head_dim


def _first(cfg: dict, *keys: str):
    return next((cfg[k] for k in keys if cfg.get(k) is not None), None)


def _fill(out: dict, cfg: dict, model: str | None) -> str | None:
    """Fill c_A, c_R and the per-layer-type rows; returns a refusal instead when the config lacks what they need."""
    kinds = _layer_kinds(cfg)
    if isinstance(kinds, str):
        return kinds
    kv = out["kv_dtype"] or model  # the served dtype: never None here (geometry)
    out["kv_dtype"] = kv
    counts = Counter(kinds)
    rows, c_a, c_r = [], 0, None
    if counts[FULL]:
        heads, kv_heads, head_dim = _fields(cfg)
        hidden = _first(cfg, "hidden_size", "n_embd", "n_embed", "d_model")
        if head_dim is None and _int(hidden) and _int(heads) and hidden % heads:
            return f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}: give head_dim"
        missing = [k for k, v in (("num_key_value_heads", kv_heads), ("head_dim", head_dim)) if not _int(v)]
        if missing:
            return (f"config.json lacks {' and '.join(missing)} for its attention layers (positive integers up to "
                    f"{MAX_SIZE:,})")
        per_layer = 2 * kv_heads * head_dim * DTYPE_BITS[kv] // 8
        c_a = per_layer * counts[FULL]
        rows.append({"layer_type": FULL, "layers": counts[FULL], "per": "token", "bytes": c_a, "bytes_per_layer": per_layer,
                     "kv_heads": kv_heads, "head_dim": head_dim, "dtype": kv})
        out["kind"] = "mha" if kv_heads == heads else "gqa"
    if counts[LINEAR]:
        missing = [k for k in GATED_DELTA_NET if not _int(cfg.get(k))]
        if missing:
            return (f"linear_attention layers without the gated delta-net sizes ({', '.join(missing)}): "
                    "measure the state tensor")
        ssm = out["ssm_dtype"] or model
        nv, kd, vd = cfg["linear_num_value_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        p_ssm = nv * kd * vd
        p_conv = (cfg["linear_conv_kernel_dim"] - 1) * (2 * cfg["linear_num_key_heads"] * kd + nv * vd)
        ssm_bytes, conv_bytes = p_ssm * DTYPE_BITS[ssm] // 8, p_conv * DTYPE_BITS[model] // 8
        c_r = (ssm_bytes + conv_bytes) * counts[LINEAR]
        rows.append({"layer_type": LINEAR, "layers": counts[LINEAR], "per": "state slot", "bytes": c_r,
                     "bytes_per_layer": ssm_bytes + conv_bytes, "P_SSM": p_ssm, "P_conv": p_conv,
                     "ssm_bytes_per_layer": ssm_bytes, "conv_bytes_per_layer": conv_bytes, "dtype": ssm})
        out.update(kind="hybrid", ssm_dtype=ssm, conv_dtype=model)
    out.update(c_A=c_a, c_R=c_r, layers=rows)
    return None


def _layer_kinds(cfg: dict) -> list[str] | str:
    """Each layer's type (`full_attention` / `linear_attention`), or why they cannot be known."""
    n = _first(cfg, *_LAYERS)
    if n is None:
        kind = cfg.get("model_type")
        return ("config.json lacks num_hidden_layers (a positive integer)" + (
            f": its {str(kind)[:40]} sizes left to transformers' defaults, which rltrace does not assume; give a "
            "config.json that lists them" if isinstance(kind, str) and kind else ""))
    if not _int(n):
        return f"num_hidden_layers {str(n)[:40]} is not a positive integer up to {MAX_SIZE:,}"
    kinds = cfg.get("layer_types")
    if kinds is None and str(cfg.get("model_type")) == "qwen3_next":  # its config class's own rule
        every = cfg.get("full_attention_interval", 4)
        if not _int(every):
            return f"full_attention_interval {every!r} is not a positive integer"
        kinds = [LINEAR if (i + 1) % every else FULL for i in range(n)]
    if kinds is None:
        return [FULL] * n
    if not isinstance(kinds, list) or len(kinds) != n:
        return f"layer_types does not list num_hidden_layers ({n}) layers"
    unknown = sorted({str(k) for k in kinds} - {FULL, LINEAR})
    if unknown:
        return (f"layer type {', '.join(unknown)}: not modelled (only full_attention and linear_attention are); "
                "measure the cache tensor")
    return kinds


_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")  # Llama; GPT-2, Falcon, Bloom; ChatGLM; MPT
MAX_SIZE = 2**20  # a layer count or size beyond this is no model's: refused before anything is allocated


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SIZE
