"""Hugging Face `Trainer`: `RltraceCallback` records every optimizer step, and `HFInstrumentor`
adds that callback to every `Trainer` a program makes (what `rltrace run` loads).

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[RltraceCallback("runs/sft")])

Records `step` spans (on_step_begin/on_step_end) around each optimizer step and its gradient
accumulation, `optimizer` spans (on_pre_optimizer_step/on_optimizer_step) inside them, and the
numbers of `on_log` as metrics. Steps are rltrace's: the optimizer step index, from 0 (HF's
`global_step` has already advanced when on_step_end and on_log run); `weight_version` is the
number of optimizer steps taken before the step. Rank is the trainer's process index (its
accelerate state); the world size is an attribute of each step span.

This module does not import transformers until `RltraceCallback` is used, so the launcher can
load `HFInstrumentor` in every process for free.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import TYPE_CHECKING, Any

import rltrace
from rltrace.integrations._base import BaseInstrumentor

if TYPE_CHECKING:
    from transformers import TrainerCallback

    class RltraceCallback(TrainerCallback):  # the class built by _define_callback
        def __init__(self, run_dir: str | None = None, *, role: str = "trainer", **init_kwargs: Any): ...

ROLE = "trainer"
_NOT_ENDED = "training stopped before this phase ended"


class _Callback:
    """`transformers.TrainerCallback` that records rltrace phases and metrics for any HF Trainer.

    Args:
        run_dir: where to record; default `RLTRACE_RUN_DIR` (or a run already started with
            `rltrace.init`, which is then used as is).
        role: the process's role (default "trainer").
        **init_kwargs: passed to `rltrace.init` (run_name, config, ...).
    """

    def __init__(self, run_dir: str | None = None, *, role: str = ROLE, **init_kwargs: Any):
        self.run_dir = run_dir
        self.role = role
        self.init_kwargs = init_kwargs
        self._step = None  # PhaseHandle of the running optimizer step
        self._optimizer = None
        self._world_size = None

    # --- lifecycle -------------------------------------------------------------------------
    def _ensure_run(self, args) -> None:
        if self.run_dir is None and (rltrace.current_run() is not None or not _env_run_dir()):
            return  # a run started by the program itself is used as is; no run dir: record nothing
        rltrace.init(self.run_dir, role=self.role, rank=getattr(args, "process_index", None), **self.init_kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        self._close(_NOT_ENDED)  # a previous train() that raised and was caught
        self._world_size = getattr(args, "world_size", None)
        self._ensure_run(args)

    def on_train_end(self, args, state, control, **kwargs):
        self._close(_NOT_ENDED)
        rltrace.flush()

    def fail(self, error: BaseException | str) -> None:
        """End the open phases as failed (the instrumentor calls this when `train()` raises)."""
        self._close(error)

    def _close(self, error) -> None:
        for handle in (self._optimizer, self._step):
            if handle is not None and not handle.ended:
                handle.end(error=error)
        self._optimizer = self._step = None

    # --- steps -----------------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self._close("the next step began before this one ended")
        taken = int(state.global_step)  # optimizer steps taken so far = this step's index
        self._step = rltrace.start_phase("step", step=taken, weight_version=taken, world_size=self._world_size)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._optimizer is not None and not self._optimizer.ended:
            self._optimizer.end(error="the next optimizer step began before this one ended")
        self._optimizer = rltrace.start_phase("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._optimizer is not None and not self._optimizer.ended:
            self._optimizer.end()
        self._optimizer = None

    def on_step_end(self, args, state, control, **kwargs):
        if self._optimizer is not None and not self._optimizer.ended:
            self._optimizer.end()
        if self._step is not None and not self._step.ended:
            self._step.end()
        self._optimizer = self._step = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        step = max(int(state.global_step) - 1, 0)  # the step just finished: global_step has advanced
        values = self.metrics(logs)
        if values:
            rltrace.log_metrics(step, **values)

    def metrics(self, logs: dict) -> dict[str, float]:
        """The metrics to store from one `on_log` call: every finite number, under its own name.
        Subclasses rename here (e.g. a framework's `reward` to rltrace's `reward_mean`)."""
        return {
            name: float(value)
            for name, value in logs.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
        }


def _env_run_dir() -> bool:
    from rltrace._config import resolve

    return bool(resolve("run_dir"))


@functools.lru_cache(maxsize=None)
def _define_callback() -> type:
    from transformers import TrainerCallback

    cls = type("RltraceCallback", (_Callback, TrainerCallback), {"__doc__": _Callback.__doc__, "__module__": __name__})
    cls.__qualname__ = "RltraceCallback"
    return cls


def __getattr__(name: str):
    if name == "RltraceCallback":
        return _define_callback()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class HFInstrumentor(BaseInstrumentor):
    """Adds `RltraceCallback` to every `transformers.Trainer` (and subclasses: TRL's trainers)
    when it is created, and closes its open phases with the error when `train()` raises."""

    target = "transformers.trainer"  # patched when the program imports it

    def instrumentation_dependencies(self):
        return ("transformers >= 4.46",)

    def _instrument(self, **kwargs: Any) -> None:
        import sys

        trainer_cls = sys.modules[self.target].Trainer
        original_init, original_train = trainer_cls.__init__, trainer_cls.train

        @functools.wraps(original_init)
        def __init__(trainer, *args, **kwargs):
            original_init(trainer, *args, **kwargs)
            callback_cls = _define_callback()
            if not any(isinstance(cb, callback_cls) for cb in trainer.callback_handler.callbacks):
                trainer.add_callback(callback_cls())

        @functools.wraps(original_train)
        def train(trainer, *args, **kwargs):
            try:
                return original_train(trainer, *args, **kwargs)
            except BaseException as exc:
                for cb in trainer.callback_handler.callbacks:
                    if isinstance(cb, _Callback):
                        cb.fail(exc)
                raise

        __init__._rltrace_original = original_init
        train._rltrace_original = original_train
        trainer_cls.__init__, trainer_cls.train = __init__, train
        self._trainer_cls = trainer_cls

    def _uninstrument(self, **kwargs: Any) -> None:
        trainer_cls = self._trainer_cls
        for name in ("__init__", "train"):
            original = getattr(getattr(trainer_cls, name), "_rltrace_original", None)
            if original is not None:
                setattr(trainer_cls, name, original)
