"""TRL's `GRPOTrainer` and `RLOOTrainer` traced with one line: `instrument(trainer, "runs/x")`.

    from rltrace.integrations.trl import instrument
    trainer = GRPOTrainer(model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...)
    instrument(trainer, "runs/grpo")          # or: rltrace run -- python train_grpo.py
    trainer.train()

TRL generates, scores and trains inside one `Trainer.training_step`, so the hooks sit on the
trainer's own methods (this instance only; `uninstrument` puts them back), never around
`training_step` as a whole. What each hook records, the metric names and the tested TRL range:
docs/integrations.md. A hook point missing from the installed TRL is one warning naming the
version and the method; the rest still records. Faults of ours never stop training.
"""

from __future__ import annotations

import os
from typing import Any

import rltrace
from rltrace.integrations import BaseInstrumentor, when_imported
from rltrace.integrations._trl_faults import fault as _fault
from rltrace.integrations._trl_faults import warn_once as _warn_once

SUPPORTED = ("GRPOTrainer", "RLOOTrainer")
TESTED_VERSIONS = ">=1.16,<1.17"  # the `trl` extra pins this range
#: Methods of the trainer that are wrapped: (name, what is lost without it).
HOOK_POINTS = (
    ("_generate_and_score_completions", "rollout spans, samples and rollout log-probs"),
    ("_generate", "sample lengths and finish reasons"),
    ("_calculate_rewards", "reward spans and per-sample rewards"),
    ("_get_per_token_logps_and_entropies", "reference/old log-prob train spans and mismatch metrics"),
    ("compute_loss", "train spans and mismatch metrics"),
)
_STATE = "_rltrace_trl"


def _trl_version() -> str:
    try:
        import trl

        return trl.__version__
    except Exception:  # noqa: BLE001 - only used in messages
        return "unknown"


def supported_class(trainer: Any) -> str:
    """The supported TRL class `trainer` is (or subclasses); a clear TypeError otherwise."""
    for klass in type(trainer).__mro__:
        if klass.__name__ in SUPPORTED and klass.__module__.startswith("trl."):
            return klass.__name__
    raise TypeError(
        f"rltrace.integrations.trl.instrument supports {', '.join(SUPPORTED)} (trl {TESTED_VERSIONS}), "
        f"got {type(trainer).__module__}.{type(trainer).__qualname__}; for any other Hugging Face Trainer use "
        "rltrace.integrations.hf"
    )


def instrument(trainer: Any, run_dir: str | os.PathLike | None = None, *, freeze: Any = None, **init_kwargs: Any) -> Any:
    """Record `trainer`'s rollout, generate, reward, train (and vLLM weight_sync) phases; returns `trainer`.

    Starts rltrace in this process (`rltrace.init(run_dir, rank=<process index>, **init_kwargs)`;
    run_dir defaults to RLTRACE_RUN_DIR) unless a run is already recording and no argument asks
    for another. With RLTRACE_DISABLED=1 the trainer is left untouched.
    `freeze` (a `rltrace.replay.FreezePolicy` or `Freezer`; default from `RLTRACE_FREEZE_EVERY`)
    freezes trained batches with a checkpoint for `rltrace replay run` (see
    `rltrace.integrations.trl_replay`). Calling it twice is harmless.
    """
    cls = supported_class(trainer)
    if getattr(trainer, _STATE, None) is not None:
        return trainer
    from rltrace import api
    from rltrace._config import resolve

    if resolve("disabled", init_kwargs.get("disabled")):
        return trainer  # RLTRACE_DISABLED=1: not a single wrapper
    if run_dir is not None or init_kwargs or api._run is None:  # not current_run(): it would start one from the env with no rank
        if resolve("rank", init_kwargs.get("rank")) is None:
            init_kwargs["rank"] = getattr(getattr(trainer, "accelerator", None), "process_index", None)
        rltrace.init(run_dir, **init_kwargs)
    version = _trl_version()
    if not _in_tested_range(version):
        _warn_once("version", f"rltrace: trl {version} is outside the tested range {TESTED_VERSIONS}; "
                              "hooks that still match will record, missing ones are reported")
    from rltrace.integrations._trl_hooks import Hooks  # torch and transformers: only now

    hooks = Hooks(trainer, cls, version, freeze, HOOK_POINTS)  # read now: tests stand in for a later TRL
    setattr(trainer, _STATE, hooks)
    hooks.install()
    return trainer


def uninstrument(trainer: Any) -> None:
    """Undo `instrument`: the trainer's own methods come back; the run keeps recording other things."""
    hooks = getattr(trainer, _STATE, None)
    if hooks is not None:
        hooks.uninstall()
        delattr(trainer, _STATE)


def _in_tested_range(version: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet

        return version in SpecifierSet(TESTED_VERSIONS)
    except Exception:  # noqa: BLE001 - unparsable version: say so
        return False




# --- zero-code: `rltrace run -- python train_grpo.py` --------------------------------------------
_MODULES = {"GRPOTrainer": "trl.trainer.grpo_trainer", "RLOOTrainer": "trl.trainer.rloo_trainer"}


def _patch_train(cls) -> None:
    """`cls.train` instruments its trainer first (into RLTRACE_RUN_DIR), then trains."""
    if getattr(cls.__dict__.get("train"), "_rltrace_trl", False):
        return
    original = cls.train

    def train(self, *args, **kwargs):
        try:
            instrument(self)
        except Exception:
            _fault("instrumenting a TRL trainer")
        return original(self, *args, **kwargs)

    train.__doc__, train.__name__, train._rltrace_original, train._rltrace_trl = original.__doc__, "train", original, True
    cls.train = train


class TRLInstrumentor(BaseInstrumentor):
    """Registered under the `rltrace.instrumentors` entry point: every GRPOTrainer/RLOOTrainer of a
    program started by `rltrace run` is instrumented when its `train()` starts.

    Any installed TRL qualifies: outside the tested range `instrument` warns once and records what
    still matches (a partial trace), rather than nothing."""

    target = "trl.trainer"  # checked and patched once the program imports TRL's trainers

    def instrumentation_dependencies(self):
        return ("trl",)

    def _instrument(self, **kwargs):
        for name, module in _MODULES.items():
            when_imported(module, lambda mod, name=name: _patch_train(getattr(mod, name)))

    def _uninstrument(self, **kwargs):
        import sys

        for name, module in _MODULES.items():
            cls = getattr(sys.modules.get(module), name, None)
            train = cls.__dict__.get("train") if cls is not None else None
            if getattr(train, "_rltrace_trl", False):
                if train._rltrace_original is getattr(super(cls, cls), "train", None):
                    delattr(cls, "train")  # it was inherited
                else:
                    cls.train = train._rltrace_original
