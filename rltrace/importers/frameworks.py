"""How each RL framework names its per-step stage timings: the one stage map. Step scalars
(`critic/rewards/mean` -> `reward_mean`) live in the one metric alias table,
`rltrace._names.METRIC_ALIASES`, which the report and the dashboard read too.

`rltrace import metrics` and the verl live hook (`rltrace.integrations.verl`) both read this table;
docs/integrations.md prints it. Names were read from the frameworks' own sources:

- verl 0.9.1: `verl/trainer/ppo/ray_trainer.py` (`marked_timer(name, timing_raw)` blocks in `fit`),
  `verl/trainer/ppo/metric_utils.py` (`compute_timing_metrics`: `timing_s/<name>`;
  `compute_data_metrics`: `critic/rewards/mean`, `response_length/mean`),
  `verl/trainer/ppo/rollout_corr_helper.py` (`rollout_corr/*`), `verl/checkpoint_engine/*.py`
  (`checkpoint_engine/payload_mbytes`), `verl/utils/tracking.py` (TensorBoard and JSONL loggers).
  `global_steps` start at 1.
- slime (THUDM/slime 624b824a): `slime/observability/train_metric_utils.py` (`log_perf_data`:
  `perf/<timer>_time` from `slime/observability/timer.py`; `perf/step_time` = train_wait + train),
  `slime/backends/megatron_utils/actor.py` (timers `train`, `log_probs`, `ref_log_probs`,
  `actor_train`, `data_preprocess` all nested in `train`; `update_weights`),
  `slime/observability/rollout_metrics.py` (`perf/rollout_time`, `rollout/response_len/mean`),
  `slime/backends/megatron_utils/loss.py` (`train/train_rollout_logprob_abs_diff`, `train/tis`,
  `train/tis_clipfrac`), `slime/backends/megatron_utils/update_weight/update_weight_from_disk_delta.py`
  (`perf/update_weights_wire_bytes`). Steps are rollout ids (`rollout/step`), from 0.
- OpenRLHF (3c3be623): `openrlhf/trainer/ppo_trainer.py` (`timing/generation`,
  `timing/make_experience`, `timing/ppo_train`, `timing/broadcast`, `timing/step_total`,
  `rollout/reward_mean`, `rollout/response_length_mean`), `openrlhf/utils/logging_utils.py`
  (TensorBoard tags `train/<key>`); the first logged `global_step` is 1.
- TRL 1.16: `trl/trainer/grpo_trainer.py` (`reward`, `reward_std`, `completions/mean_length`,
  `sampling/sampling_logp_difference/mean`, `sampling/importance_sampling_ratio/mean`, `step_time`;
  `@profiling_decorator` / `profiling_context` timings), `trl/extras/profiling.py`
  (`profiling/Time taken: <Trainer>.<name>`, logged to W&B / MLflow / Trackio only); HF logs
  TensorBoard tags as `train/<key>` at `state.global_step`, which is 1 at the first step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    """A stage timing: the span name it becomes and its rltrace phase."""

    name: str
    phase: str


@dataclass(frozen=True)
class Framework:
    """One framework's names. Keys are metric names after `strip` is removed from their front."""

    name: str
    step_offset: int  # the framework's first step number (rltrace steps start at 0)
    stages: dict[str, Stage]  # timing metric (seconds) -> span; laid out in this order within a step
    wall: str | None  # the step's wall time (seconds)
    bytes: dict[str, tuple[str, float]] = field(default_factory=dict)  # metric -> (stage metric, bytes per unit)
    strip: str = ""  # a prefix the framework's loggers put in front of every key
    markers: tuple[str, ...] = ()  # regexes on (stripped) names that identify the framework
    rename: tuple[str, str] | None = None  # (regex, replacement) applied after `strip`, before the maps


def _verl_stage(name: str) -> Stage:
    return Stage(name, VERL_PHASES.get(name, name))


#: verl `marked_timer` block name -> rltrace phase (also used by the live hook; other names keep their own).
VERL_PHASES = {
    "gen": "rollout",
    "reward": "reward",
    "old_log_prob": "train",
    "ref": "train",
    "values": "train",
    "adv": "train",
    "update_critic": "train",
    "update_actor": "train",
    "update_weights": "weight_sync",
    "testing": "eval",
    "step": "step",
}
#: slime `Timer` names (slime/observability/timer.py; timers of slime/backends/megatron_utils/actor.py)
#: -> rltrace phase, for the live hook (rltrace.integrations.slime); other names keep their own.
#: `log_probs`, `ref_log_probs` and `actor_train` run inside `train`; `train_wait` is the trainer
#: waiting for the next rollout (slime's `perf/train_wait_time`), with `update_weights` inside it.
SLIME_PHASES = {
    "train": "train",
    "actor_train": "train",
    "log_probs": "forward",
    "ref_log_probs": "forward",
    "update_weights": "weight_sync",
    "train_wait": "wait",
}
#: verl blocks outside the four stages that still become spans on import (they run on the driver, in the step)
_VERL_OTHER = ("save_checkpoint", "testing")

_TRL_TIMER = "profiling/Time taken: GRPOTrainer."

FRAMEWORKS: dict[str, Framework] = {
    "verl": Framework(
        name="verl",
        step_offset=1,
        stages={f"timing_s/{n}": _verl_stage(n) for n in
                ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
                 "update_weights", *_VERL_OTHER)},
        wall="timing_s/step",
        bytes={"checkpoint_engine/payload_mbytes": ("timing_s/update_weights", 2.0**20)},
        markers=(r"^timing_s/", r"^timing_per_token_ms/", r"^critic/rewards/"),
    ),
    "slime": Framework(
        name="slime",
        step_offset=0,
        # perf/log_probs_time, ref_log_probs_time, actor_train_time, data_preprocess_time run inside
        # perf/train_time: kept as metrics, not spans, so train is not counted twice.
        stages={
            "perf/rollout_time": Stage("rollout", "rollout"),
            "perf/train_time": Stage("train", "train"),
            "perf/update_weights_time": Stage("update_weights", "weight_sync"),
            "perf/save_model_time": Stage("save_model", "save_model"),
        },
        wall="perf/step_time",
        bytes={"perf/update_weights_wire_bytes": ("perf/update_weights_time", 1.0)},
        markers=(r"^perf/\w+_time$", r"^rollout/step$", r"^train/train_rollout_logprob_abs_diff$"),
    ),
    "openrlhf": Framework(
        name="openrlhf",
        step_offset=1,
        stages={
            "timing/generation": Stage("generation", "rollout"),
            # make_experience: old/ref log-probs, values and reward-model scores of the batch
            "timing/make_experience": Stage("make_experience", "train"),
            "timing/ppo_train": Stage("ppo_train", "train"),
            "timing/broadcast": Stage("broadcast", "weight_sync"),
        },
        wall="timing/step_total",
        strip="train/",
        markers=(r"^timing/(make_experience|ppo_train|broadcast|step_total)$",),
    ),
    "trl": Framework(
        name="trl",
        step_offset=1,
        stages={
            _TRL_TIMER + "vLLM.generate": Stage("vLLM.generate", "generate"),
            _TRL_TIMER + "transformers.generate": Stage("transformers.generate", "generate"),
            _TRL_TIMER + "transformers.generate_batch": Stage("transformers.generate_batch", "generate"),
            _TRL_TIMER + "_calculate_rewards": Stage("_calculate_rewards", "reward"),
            _TRL_TIMER + "compute_loss": Stage("compute_loss", "train"),
            _TRL_TIMER + "sync_weights": Stage("sync_weights", "weight_sync"),
        },
        wall="step_time",
        strip="train/",
        rename=(r"^profiling/Time taken: \w+\.", _TRL_TIMER),  # any trainer class: GRPOTrainer, a subclass, ...
        markers=(r"^profiling/Time taken: ", r"^completions/mean_length$", r"^frac_reward_zero_std$"),
    ),
}


def strip(fw: Framework, name: str) -> str:
    """`name` as the maps spell it: the logger's prefix removed, `rename` applied."""
    if fw.strip and name.startswith(fw.strip):
        name = name[len(fw.strip):]
    return re.sub(fw.rename[0], fw.rename[1], name) if fw.rename else name


def detect(names) -> str | None:
    """The framework whose marker names appear most among `names`; None when none does."""
    names = list(names)
    scores = {}
    for key, fw in FRAMEWORKS.items():
        patterns = [re.compile(p) for p in fw.markers]
        scores[key] = sum(1 for n in names if any(p.search(strip(fw, n)) for p in patterns))
    best = max(scores, key=scores.get)
    return best if scores[best] else None
