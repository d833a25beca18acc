"""Tiny GRPO: a real RL post-training loop small enough for 2 CPU cores, instrumented with rltrace.

Run it: `python -m examples.tiny_grpo --out runs/demo` (see train.py and docs/demo.md).

Pieces other tools reuse (replay, tests):

    from examples.tiny_grpo import Tokenizer, load_checkpoint, response_logprobs, reward, Problem
    policy, tok = load_checkpoint("runs/demo/checkpoints/policy_v000012.pt")
    logp = response_logprobs(policy, [prompt_tokens], [response_tokens], pad_id=tok.pad_id)

Files, one idea each: tokenizer.py (vocabulary, chat template), policy.py (model, trainer
log-probs, checkpoints), task.py (problems, reward), engine.py (KV-cached rollout engine),
grpo.py (loss and mismatch formulas), worker.py (the rollout side), weight_sync.py (transfer
paths), placement.py (colocated thread or Ray actors), ray_actors.py, display.py, train.py (the loop).
"""

from examples.tiny_grpo.engine import Completion, RolloutEngine, SamplingParams
from examples.tiny_grpo.policy import (
    CheckpointError,
    Policy,
    PolicyConfig,
    load_checkpoint,
    read_model_config,
    response_logprobs,
)
from examples.tiny_grpo.task import Problem, ProblemSource, reward, slow_verifier
from examples.tiny_grpo.tokenizer import Tokenizer, TokenizerError

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
