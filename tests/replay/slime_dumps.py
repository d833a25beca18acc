"""slime debug dumps for tests, written the way slime writes them (torch.save of plain dicts).

`sample_dict` returns what `slime.utils.types.Sample.to_dict()` returns: every dataclass field in
declaration order, `status` as its string value, `spec_info` / `prefix_cache_info` as dicts, plus
the `trace` carrier that slime's trace_utils attaches. `rollout_dump` is
`save_debug_rollout_data`'s payload; `train_dump` is `save_debug_train_data`'s format_version 2
payload (one dict per trained sample, sorted by rollout position, `dp_shards`, `raw_reward`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import torch

STATUS = ["completed", "truncated", "aborted", "completed"]


def _trace(index: int, group: int, start: float) -> dict:
    trace_id, outer, inner = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex  # as slime makes them
    base = {"trace_id": trace_id, "sample_id": index, "group_id": group, "attempt": 0}
    return {
        "version": 1,
        **base,
        "events": [
            {"type": "span_start", "name": "generate_and_rm", "ts": start, **base, "span_id": outer},
            {"type": "span_start", "name": "sglang_generate", "ts": start + 0.01, **base, "span_id": inner,
             "parent_span_id": outer, "attrs": {"max_new_tokens": 16}},
            {"type": "event", "name": "sglang_pd_summary", "ts": start + 0.2, **base, "parent_span_id": inner,
             "attrs": {"pd_transfer_total_mb": 1.5}},
            {"type": "span_end", "name": "sglang_generate", "ts": start + 0.3, **base, "span_id": inner,
             "attrs": {"finish_reason": "stop", "completion_tokens": 4}},
            {"type": "span_end", "name": "generate_and_rm", "ts": start + 0.4, **base, "span_id": outer},
        ],
    }


def sample_dict(index: int, *, response_length: int = 4, prompt_length: int = 5, tensors: bool = False,
                start: float | None = None) -> dict:
    """`start`: when its trace begins (Unix seconds; default 1_790_000_000 + index)."""
    tokens = list(range(10 + index, 10 + index + prompt_length + response_length))
    logps = [-0.5 - 0.01 * k for k in range(response_length)]
    return {
        "group_index": index // 2,
        "index": index,
        "rollout_id": None,
        "prompt": f"prompt {index}",
        "tokens": torch.tensor(tokens) if tensors else tokens,
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {},
        "response": f"answer {index}",
        "response_length": response_length,
        "label": str(index % 3),
        "reward": 1.0 if index % 2 else 0.25,
        "loss_mask": [1] * response_length,
        "weight_versions": ["3", "4"] if index % 2 else ["4"],
        "rollout_log_probs": logps,
        "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None,
        "rollout_routed_experts": torch.zeros(response_length, 2, 2, dtype=torch.int32) if tensors else None,
        "remove_sample": False,
        "teacher_log_probs": None,
        "status": STATUS[index % len(STATUS)],
        "metadata": {"source": "math", "difficulty": index},
        "generate_function_path": None,
        "custom_rm_path": None,
        "train_metadata": None,
        "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0, "completion_token_num": 0},
        "prefix_cache_info": {"cached_tokens": 2, "total_prompt_tokens": prompt_length},
        "trace": _trace(index, index // 2, 1_790_000_000.0 + index if start is None else start),
    }


def rollout_dump(path: Path, rollout_id: int, n: int = 4, **kwargs) -> list[dict]:
    """Rollout `rollout_id`'s dump; its traces run 100 s after the previous rollout's, as successive
    rollouts do."""
    samples = [sample_dict(i, start=1_790_000_000.0 + 100 * rollout_id + i, **kwargs) for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
    return samples


def train_dump(path: Path, rollout_id: int, rollout: list[dict]) -> list[dict]:
    """The trainer's view of the same samples: recomputed log-probs, advantages, ..."""
    samples = []
    for position, s in enumerate(rollout):
        r = s["response_length"]
        samples.append(
            {
                "data_parallel_rank": 0,
                "sample_index": s["index"],
                "rollout_position": position,
                "tokens": torch.as_tensor(s["tokens"], dtype=torch.long),
                "response_lengths": r,
                "rewards": float(s["reward"]) - 0.5,
                "truncated": int(s["status"] == "truncated"),
                "loss_masks": torch.ones(r, dtype=torch.int32),
                "rollout_ids": position,
                "rollout_mask_sums": torch.tensor(float(r)),
                "rollout_log_probs": torch.tensor(s["rollout_log_probs"], dtype=torch.float32),
                "total_lengths": len(s["tokens"]),
                "log_probs": torch.tensor(s["rollout_log_probs"], dtype=torch.float32) - 0.001,
                "advantages": torch.full((r,), float(s["reward"]) - 0.5),
            }
        )
    payload = {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": samples,
        "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_indices": [s["index"] for s in rollout],
                       "partition": list(range(len(rollout))), "num_microbatches": [1], "global_batch_sizes": [len(rollout)]}],
        "raw_reward": [s["reward"] for s in rollout],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return samples
