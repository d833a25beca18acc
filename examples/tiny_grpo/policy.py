"""The policy: a small GPT (nanoGPT's shape) with a KV cache, and the trainer's log-prob forward.

Two ways to run the same weights, as in every RL post-training stack:
- the trainer's full-sequence forward (`response_logprobs`, fp32, right-padded batches), and
- the rollout engine's incremental decoding (`engine.py`: left-padded prompts, a KV cache,
  optionally bf16). Their log-probs differ slightly: that gap is `train_rollout_logprob_abs_diff`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.tiny_grpo.system.tokenizer import Tokenizer


class CheckpointError(RuntimeError):
    """A checkpoint or its model_config.json is missing or unreadable; the message names the file."""


@dataclass
class PolicyConfig:
    vocab_size: int = 43
    block_size: int = 128  # longest prompt + response, in tokens
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 160  # 2 layers x 160 wide: 0.65M parameters, 2.6 MB in fp32


def policy_config(cfg) -> PolicyConfig:
    """The model shape the demo's flags ask for (`--n-layer`, `--n-embd`): the trainer and every engine use it."""
    return PolicyConfig(vocab_size=Tokenizer().vocab_size, n_layer=cfg.n_layer, n_embd=cfg.n_embd)


class KVCache:
    """Keys and values of every layer for a batch being decoded: (B, n_head, max_len, head_dim) each."""

    def __init__(self, config: PolicyConfig, batch: int, max_len: int, dtype: torch.dtype):
        shape = (batch, config.n_head, max_len, config.n_embd // config.n_head)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(config.n_layer)]
        self.length = 0  # positions filled; the engine advances it after each forward

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: PolicyConfig, layer: int):
        super().__init__()
        self.layer, self.n_head = layer, config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, attn_mask=None, cache: KVCache | None = None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, nh, S, hs), S = cached + T
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, config: PolicyConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(), nn.Linear(4 * config.n_embd, config.n_embd)
        )

    def forward(self, x, attn_mask=None, cache=None):
        x = x + self.attn(self.ln_1(x), attn_mask, cache)
        return x + self.mlp(self.ln_2(x))


class Policy(nn.Module):
    """A decoder-only transformer with learned positions and tied input/output embeddings."""

    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):  # GPT-2's scaled residual init
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, positions=None, attn_mask=None, cache: KVCache | None = None):
        """Logits (B, T, vocab) for tokens `idx` (B, T). Without a mask the attention is causal."""
        if positions is None:
            positions = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x, attn_mask, cache)
        return self.lm_head(self.ln_f(x))


# --- the trainer's log-probs ---------------------------------------------------------------------
def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int):
    """Right-padded (prompt + response) tokens (B, L) and a mask (B, L-1) of the response targets:
    position t predicts token t+1, so the response tokens are predicted from positions P-1 .. P+R-2."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    tokens = torch.full((len(prompts), max(lengths)), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), max(lengths) - 1), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        mask[i, len(p) - 1 : len(p) + len(r) - 1] = True
    return tokens, mask


def token_logprobs(model: Policy, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for every position: (B, L-1). One full causal forward."""
    logits = model(tokens[:, :-1]).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


@torch.no_grad()
def response_logprobs(
    model: Policy, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int = 0, temperature: float = 1.0
) -> list[torch.Tensor]:
    """Per-token log-probs of each response given its prompt, with the trainer's full fp32 forward.

    Sequences are right-padded and attention is causal, so `pad_id` never changes the result.
    `temperature` must be the run's (`model_config.json`) to compare with its rollout log-probs.

    Example:
        >>> lp = response_logprobs(policy, [tok.encode(prompt)], [tok.encode("1413<|eos|>")], pad_id=tok.pad_id)
        >>> lp[0].shape   # torch.Size([5])
    """
    tokens, mask = pack(prompts, responses, pad_id)
    logp = token_logprobs(model, tokens, temperature)
    return [logp[i][mask[i]] for i in range(len(prompts))]


# --- checkpoints ---------------------------------------------------------------------------------
def write_model_config(folder: Path, config: PolicyConfig, tokenizer: Tokenizer, **extra) -> Path:
    """`model_config.json` beside the checkpoints: the architecture, the tokenizer and `extra` facts."""
    path = Path(folder) / "model_config.json"
    path.write_text(json.dumps({"policy": asdict(config), "tokenizer": tokenizer.to_json(), **extra}, indent=2) + "\n")
    return path


def read_model_config(folder: Path) -> tuple[PolicyConfig, Tokenizer, dict]:
    """The architecture, tokenizer and extra facts stored by `write_model_config`."""
    path = Path(folder) / "model_config.json"
    try:
        data = json.loads(path.read_text())
        config = PolicyConfig(**data["policy"])
        tokenizer = Tokenizer.from_json(data["tokenizer"])
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: checkpoints are read from a run's checkpoints/ folder") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is not a readable model config ({type(exc).__name__}: {exc})") from None
    return config, tokenizer, data


def load_checkpoint(path: str | Path) -> tuple[Policy, Tokenizer]:
    """The policy saved at `path` (a `policy_v000012.pt` or `policy_final.pt`) and its tokenizer.

    Reads `model_config.json` from the same folder; the weights load with `weights_only=True`,
    so a checkpoint can never run code.
    """
    path = Path(path)
    config, tokenizer, _ = read_model_config(path.parent)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as exc:  # torch raises many types for a bad file (UnpicklingError, RuntimeError, ...)
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc})") from None
    policy = Policy(config)
    try:
        policy.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {path} does not match its model_config.json: {exc}") from None
    return policy.eval(), tokenizer


def save_checkpoint(policy: Policy, path: Path) -> int:
    """Write the state dict atomically (temp file + rename); returns its size in bytes."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(policy.state_dict(), tmp)
    tmp.replace(path)
    return path.stat().st_size


def save_version(policy: Policy, folder: Path, version: int, keep: int) -> int:
    """`policy_v{version:06d}.pt`, keeping the newest `keep` of them (for replay); returns bytes written."""
    size = save_checkpoint(policy, folder / f"policy_v{version:06d}.pt")
    for old in sorted(folder.glob("policy_v*.pt"))[:-keep]:
        old.unlink()
    return size
