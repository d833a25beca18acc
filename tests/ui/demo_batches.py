"""Debug replay on a finished demo run, the way a user adds it afterwards.

    python tests/ui/demo_batches.py RUN_DIR STEP [STEP ...]

Joins the run (`rltrace.init` on its dir) and freezes, for each STEP, the batch the demo logged:
prompt and response tokens, the engine's per-token log-probs (log q), rewards and texts, with the
tokenizer's special tokens so the bad-text flags can spot template leaks. `train_logprobs` is the
replay entry (`rltrace replay run RUN_DIR --step S --entry tests/ui/demo_batches.py:train_logprobs`):
the trainer's forward again, with the run's final checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import rltrace
import rltrace.replay
from rltrace import store

SAMPLE_COLUMNS = ("sample_id", "group_id", "reward", "weight_version", "finish_reason", "prompt_text", "response_text",
                  "prompt_tokens", "response_tokens", "rollout_logprobs")


def freeze(run_dir: Path, steps: list[int]) -> None:
    from examples.tiny_grpo.tokenizer import SPECIAL_TOKENS, Tokenizer

    con = store.open(run_dir)
    checkpoint = str(run_dir / "checkpoints" / "policy_final.pt")
    rltrace.init(run_dir, role="replay-freezer")
    for step in steps:
        rows = con.execute(f"SELECT {', '.join(SAMPLE_COLUMNS)} FROM samples WHERE step = ? ORDER BY sample_id", [step]).df()
        samples = [
            {
                **{k: r[k] for k in SAMPLE_COLUMNS if k not in ("prompt_tokens", "response_tokens", "rollout_logprobs")},
                "prompt_tokens": np.asarray(r["prompt_tokens"], np.int64),
                "response_tokens": np.asarray(r["response_tokens"], np.int64),
                "rollout_log_probs": np.asarray(r["rollout_logprobs"], np.float32),
                "loss_mask": np.ones(len(r["response_tokens"]), np.int8),
            }
            for _, r in rows.iterrows()
        ]
        rltrace.replay.freeze(step, samples, trigger="on_demand", reason="frozen after the run for the dashboard tests",
                              batch_meta={"checkpoint": checkpoint, "special_tokens": list(SPECIAL_TOKENS),
                                          "eos_token_id": Tokenizer().eos_id, "max_response_len": 12})
    rltrace.replay.flush()
    rltrace.shutdown()


def train_logprobs(batch) -> dict:
    """Replay entry: the trainer's fp32 log-probs of each sampled response (log p)."""
    from examples.tiny_grpo import load_checkpoint, response_logprobs

    policy, tok = load_checkpoint(batch.meta["checkpoint"])
    prompts = [list(map(int, p)) for p in batch["prompt_tokens"]]
    responses = [list(map(int, r)) for r in batch["response_tokens"]]
    logp = response_logprobs(policy, prompts, responses, pad_id=tok.pad_id)
    return {"log_probs": [np.asarray(lp, np.float32) for lp in logp]}


if __name__ == "__main__":
    freeze(Path(sys.argv[1]), [int(s) for s in sys.argv[2:]])
