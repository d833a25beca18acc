"""How many bytes a model's serving cache holds per token and per request slot, from its config.json.

Two caches (docs/analysis.md, "Serving capacity"):
- attention layers keep K and V for every token: c_A = Σ over attention layers of 2 · H_KV · d · b_KV / 8
  bytes per token (GQA and MHA alike; unsharded, the whole model);
- linear-attention layers (Qwen3-Next's gated delta-net) keep a fixed state per request slot:
  c_R = Σ over those layers of P_SSM · b_SSM / 8 + P_conv · b_conv / 8, with
  P_SSM = linear_num_value_heads · linear_key_head_dim · linear_value_head_dim and
  P_conv = (linear_conv_kernel_dim − 1) · (2 · linear_num_key_heads · linear_key_head_dim
  + linear_num_value_heads · linear_value_head_dim); the SSM state is fp32 unless set, the conv
  state in the model's dtype.

Anything these formulas do not describe (MLA and DSA latent caches, sliding-window layers, other
state-space families, a layer type not named here) is refused with the reason, never estimated.
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
SSM_DEFAULT = "fp32"  # Qwen3-Next's recurrent state (vLLM's mamba_ssm_cache_dtype "auto" keeps float32)
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


def geometry(config: dict, *, kv_dtype: str | None = None, ssm_dtype: str | None = None,
             source: str | None = None) -> dict:
    """Bytes per token and per state slot of the model described by `config` (a config.json as a dict).

    `kv_dtype` overrides the attention cache's dtype (default: the model's, `torch_dtype`/`dtype`),
    `ssm_dtype` the recurrent state's (default fp32); both by name (`bf16`, `fp8_e4m3`, ...:
    `DTYPE_BITS`), a wrong name raises `DtypeError`.

    Returns a dict: source, model_type, kind (`mha` / `gqa` / `hybrid`, None when refused),
    kv_dtype, ssm_dtype, conv_dtype, c_A (bytes per token), c_R (bytes per state slot; None
    without linear-attention layers), layers (one dict per layer type: layer_type, layers, per
    (`token` / `state slot`), bytes (all layers of the type), bytes_per_layer, and the formula's
    inputs), refused (None, or why the formulas do not apply: c_A and c_R are then None).
    """
    kv = dtype_name(kv_dtype, "--kv-dtype")
    ssm = dtype_name(ssm_dtype, "--ssm-dtype")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    cfg = {**config, **text} if text and "num_hidden_layers" not in config else config
    out = {"source": source, "model_type": cfg.get("model_type"), "kind": None, "kv_dtype": kv, "ssm_dtype": ssm,
           "conv_dtype": None, "c_A": None, "c_R": None, "layers": [], "refused": None}
    why = _refusal(cfg)
    if why is None:
        try:
            model = dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
                               or config.get("dtype"), "the config's dtype")
        except DtypeError as exc:
            model, why = None, f"{exc}: give --kv-dtype"
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
    other = [k for k in _OTHER_STATE_KEYS if k in cfg] + (["model_type " + model_type] if "mamba" in model_type else [])
    if other:
        return (f"state-space layers of another family ({', '.join(other)}): measure the cache tensor, "
                "the formulas here cover attention and gated delta-net layers only")
    return None


def _fill(out: dict, cfg: dict, model: str | None) -> str | None:
    """Fill c_A, c_R and the per-layer-type rows; returns a refusal instead when the config lacks what they need."""
    kinds = _layer_kinds(cfg)
    if isinstance(kinds, str):
        return kinds
    kv = out["kv_dtype"] or model
    if kv is None:
        return "config.json names no dtype (torch_dtype): give --kv-dtype"
    out["kv_dtype"] = kv
    counts = Counter(kinds)
    rows, c_a, c_r = [], 0, None
    if counts[FULL]:
        heads = cfg.get("num_attention_heads")
        kv_heads = cfg.get("num_key_value_heads", heads)
        head_dim = cfg.get("head_dim")
        if head_dim is None and _int(cfg.get("hidden_size")) and _int(heads):
            if cfg["hidden_size"] % heads:
                return f"hidden_size {cfg['hidden_size']} is not a multiple of num_attention_heads {heads}: give head_dim"
            head_dim = cfg["hidden_size"] // heads
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
        if model is None:
            return "config.json names no dtype (torch_dtype), which the conv state is kept in"
        ssm = out["ssm_dtype"] or SSM_DEFAULT
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
    n = cfg.get("num_hidden_layers")
    if n is None:
        return "config.json lacks num_hidden_layers (a positive integer)"
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


MAX_SIZE = 2**20  # a layer count or size beyond this is no model's: refused before anything is allocated


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SIZE
