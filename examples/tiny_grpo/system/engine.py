"""The rollout engine: its own copy of the weights, KV-cached batched decoding, per-token log-probs.

A miniature of what vLLM / SGLang do inside an RL loop: prompts are left-padded into one batch,
prefilled once, then decoded one token per forward with a KV cache. Each sample stops on its own
(`stop` at `<|eos|>`, `length` at its token budget); the batch runs until its longest sample is
done, so one long sample holds up all the others (the `--straggler` fault).

The engine can hold its weights in bf16 (`precision="bf16"`): its log-probs then drift further
from the trainer's fp32 ones, which is what `train_rollout_logprob_abs_diff` measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from examples.tiny_grpo.policy import KVCache, Policy, PolicyConfig

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class SamplingParams:
    """Per-sample sampling settings (the names follow vLLM's SamplingParams)."""

    max_new_tokens: int = 12
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False  # keep generating past <|eos|> until max_new_tokens


@dataclass
class Completion:
    tokens: list[int]  # response token ids, <|eos|> included when finish_reason == "stop"
    logprobs: list[float]  # the engine's log q(token) at temperature, one per response token
    finish_reason: str  # "stop" or "length"
    gen_start: float  # Unix seconds
    gen_end: float


class RolloutEngine:
    """Generates with its own weights; `load_weights` is how a weight sync lands here."""

    def __init__(self, config: PolicyConfig, *, eos_id: int, pad_id: int, precision: str = "fp32", seed: int = 0):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        self.config, self.eos_id, self.pad_id, self.precision = config, eos_id, pad_id, precision
        self.dtype = PRECISIONS[precision]
        self.model = Policy(config).to(self.dtype).eval().requires_grad_(False)
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> int:
        """Copy weights into the engine's own tensors (casting to its precision); returns bytes read."""
        params = dict(self.model.named_parameters())
        unknown = set(named_tensors) - set(params)
        if unknown:
            raise KeyError(f"weights for unknown parameters {sorted(unknown)}")
        nbytes = 0
        for name, tensor in named_tensors.items():
            params[name].copy_(tensor)
            nbytes += tensor.numel() * tensor.element_size()
        return nbytes

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        """Sample a response for each prompt. All samples start together; each ends on its own."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        B, P = len(prompts), max(len(p) for p in prompts)
        budget = max(p.max_new_tokens for p in params)
        if P + budget > self.config.block_size:
            raise ValueError(f"prompt ({P}) + max_new_tokens ({budget}) exceeds block_size {self.config.block_size}")
        start = time.time()

        tokens = torch.full((B, P), self.pad_id, dtype=torch.long)  # left-padded prompts
        valid = torch.zeros((B, P + budget), dtype=torch.bool)  # which cache slots hold real tokens
        for i, p in enumerate(prompts):
            tokens[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            valid[i, P - len(p) : P] = True
        positions = (valid[:, :P].cumsum(1) - 1).clamp(min=0)  # each prompt starts at position 0

        cache = KVCache(self.config, B, P + budget, self.dtype)
        causal = torch.ones((P, P), dtype=torch.bool).tril()
        # pad queries attend to themselves only, so no softmax row is all -inf
        mask = (causal & valid[:, None, :P]) | torch.eye(P, dtype=torch.bool)  # (B, P, P)
        logits = self.model(tokens, positions, mask[:, None], cache)[:, -1]  # prefill, (B, vocab)
        cache.length = P
        next_pos = positions[:, -1] + 1

        temperature = torch.tensor([p.temperature for p in params])[:, None]
        top_p = torch.tensor([p.top_p for p in params])[:, None]
        limits = torch.tensor([p.max_new_tokens for p in params])
        ignore_eos = torch.tensor([p.ignore_eos for p in params])
        out_tokens = torch.full((B, budget), self.pad_id, dtype=torch.long)
        out_logprobs = torch.zeros((B, budget))
        lengths = torch.zeros(B, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        reasons, ends = ["length"] * B, [start] * B

        for t in range(budget):
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            token = self._sample(logp, top_p)
            active = ~done
            out_tokens[active, t] = token[active]
            out_logprobs[active, t] = logp.gather(1, token[:, None]).squeeze(1)[active]
            lengths += active.long()
            stopped = active & (token == self.eos_id) & ~ignore_eos
            finished = active & (stopped | (lengths >= limits))
            if finished.any():  # sync point (in "generate"), once per token, as in any engine's stop check
                now = time.time()
                for i in finished.nonzero().flatten().tolist():
                    reasons[i], ends[i] = ("stop" if stopped[i] else "length"), now
                done |= finished
            if done.all():  # sync point (in "generate")
                break
            valid[:, P + t] = True
            step_mask = valid[:, None, None, : P + t + 1]  # (B, 1, 1, S): attend to every real token so far
            fed = token.masked_fill(done, self.pad_id)[:, None]  # finished rows decode padding, ignored
            logits = self.model(fed, next_pos[:, None], step_mask, cache)[:, -1]
            cache.length += 1
            next_pos += 1

        return [  # sync point (in "generate"): .tolist() copies the results to the host
            Completion(
                tokens=out_tokens[i, : lengths[i]].tolist(),
                logprobs=out_logprobs[i, : lengths[i]].tolist(),
                finish_reason=reasons[i],
                gen_start=start,
                gen_end=ends[i],
            )
            for i in range(B)
        ]

    def _sample(self, logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
        probs = logp.exp()
        if bool((top_p < 1.0).any()):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # the first token is always kept
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
