"""Tiny GRPO: a real RL post-training loop small enough for 2 CPU cores, instrumented with rltrace.

Run it: `python -m examples.tiny_grpo --out runs/demo` (see train.py and docs/demo.md).

Pieces other tools reuse (replay, tests):

    from examples.tiny_grpo import Tokenizer, load_checkpoint, response_logprobs, reward, Problem
    policy, tok = load_checkpoint("runs/demo/checkpoints/policy_v000012.pt")
    logp = response_logprobs(policy, [prompt_tokens], [response_tokens], pad_id=tok.pad_id)

The loop a reader learns from: train.py (the loop, its four phases), policy.py (model, trainer
log-probs, checkpoints), task.py (problems, reward) and grpo.py (the loss formulas). replay.py
holds what debug replay freezes and the entry points `rltrace replay run` calls. system/ holds
the rest: flags, tokenizer, rollout engine and workers, placement (thread or Ray actors), weight
transfer paths, fault injection, display.
"""

from examples.tiny_grpo.policy import (
    CheckpointError,
    Policy,
    PolicyConfig,
    load_checkpoint,
    read_model_config,
    response_logprobs,
)
from examples.tiny_grpo.system.engine import Completion, RolloutEngine, SamplingParams
from examples.tiny_grpo.system.faults import slow_verifier
from examples.tiny_grpo.system.tokenizer import Tokenizer, TokenizerError
from examples.tiny_grpo.task import Problem, ProblemSource, reward

__all__ = [
    "CheckpointError",
    "Completion",
    "Policy",
    "PolicyConfig",
    "Problem",
    "ProblemSource",
    "RolloutEngine",
    "SamplingParams",
    "Tokenizer",
    "TokenizerError",
    "load_checkpoint",
    "read_model_config",
    "response_logprobs",
    "reward",
    "slow_verifier",
]
