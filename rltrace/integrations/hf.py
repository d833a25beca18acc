"""Hugging Face `Trainer`: `RltraceCallback` records every optimizer step, and `HFInstrumentor`
adds that callback to every `Trainer` a program makes (what `rltrace run` loads).

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[RltraceCallback("runs/sft")])

What the Trainer's callback events let it see (transformers 5.24, `Trainer._inner_training_loop`):

- `step` (on_step_begin to on_step_end): one optimizer step with its gradient accumulation;
- inside it `train` (on_step_begin to on_pre_optimizer_step: forward and backward of every
  micro-batch, `rl.micro_batches` of them, and gradient clipping) and `optimizer`
  (on_pre_optimizer_step to on_optimizer_step); what follows (learning-rate scheduler, zeroing
  the gradients) is the step's own time;
- after the step, as the Trainer runs them, `log` (on_step_end to on_log: gathering the loss),
  `eval` (to on_evaluate; a later `trainer.evaluate()` from its first prediction step) and
  `save` (to on_save), each tagged with the step just ended; which of them follow is what the
  Trainer's control flags say at on_step_end;
- the numbers of `on_log` as metrics.

The data loading of the next step happens before on_step_begin: no event covers it. Steps are
rltrace's: the optimizer step index, from 0 (HF's `global_step` has already advanced when
on_step_end and on_log run); `weight_version` is the number of optimizer steps taken before the
step (for `eval`, the weights it evaluates). Rank is the trainer's process index (its accelerate
state); the world size is an attribute of each step span. Integrations that record their own
train or eval phases inside a Trainer (TRL's hooks) turn those off in `records`.

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

    #: The phases it records besides `step` and `optimizer`; `records` may leave some out.
    RECORDS = frozenset(("train", "eval", "log", "save"))

    def __init__(self, run_dir: str | None = None, *, role: str = ROLE, **init_kwargs: Any):
        self.run_dir = run_dir
        self.role = role
        self.init_kwargs = init_kwargs
        self.records = set(self.RECORDS)
        self._step = None  # PhaseHandle of the running optimizer step
        self._train = None  # its forward and backward, up to the optimizer
        self._optimizer = None
        self._after = None  # the log, eval or save phase running after the step
        self._micro_batches = 0
        self._last_step: int | None = None  # the step just ended: what log, eval and save follow
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
        self._last_step = None
        rltrace.flush()

    def fail(self, error: BaseException | str) -> None:
        """End the open phases as failed (the instrumentor calls this when `train()` raises)."""
        self._close(error)

    def _close(self, error) -> None:
        for handle in (self._after, self._optimizer, self._train, self._step):  # innermost first
            if handle is not None and not handle.ended:
                handle.end(error=error)
        self._after = self._optimizer = self._train = self._step = None

    @staticmethod
    def _end(handle, error=None) -> None:
        if handle is not None and not handle.ended:
            handle.end(error=error)

    # --- steps -----------------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self._close("the next step began before this one ended")
        taken = int(state.global_step)  # optimizer steps taken so far = this step's index
        self._step = rltrace.start_phase("step", step=taken, weight_version=taken, world_size=self._world_size)
        if "train" in self.records:
            self._train = rltrace.start_phase("train")
        self._micro_batches = 1

    def on_substep_end(self, args, state, control, **kwargs):
        self._micro_batches += 1  # a micro-batch of gradient accumulation ended; the next one runs

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._train is not None and not self._train.ended:
            self._train.set(micro_batches=self._micro_batches)
            self._train.end()
        self._train = None
        if self._optimizer is not None and not self._optimizer.ended:
            self._optimizer.end(error="the next optimizer step began before this one ended")
        self._optimizer = rltrace.start_phase("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._end(self._optimizer)
        self._optimizer = None

    def on_step_end(self, args, state, control, **kwargs):
        for handle in (self._optimizer, self._train, self._step):
            self._end(handle)
        self._optimizer = self._train = self._step = None
        self._last_step = max(int(state.global_step) - 1, 0)  # HF has counted the step already
        self._then(control, ("log", "eval", "save"), state)

    def _then(self, control, phases: tuple[str, ...], state) -> None:
        """Open the first of `phases` the Trainer runs next (its control flags say which), if recorded."""
        flags = {"log": "should_log", "eval": "should_evaluate", "save": "should_save"}
        nxt = next((p for p in phases if getattr(control, flags[p], False)), None)
        if nxt is not None and nxt in self.records and self._last_step is not None:
            self._after = rltrace.start_phase(nxt, step=self._last_step, weight_version=int(state.global_step))

    def _after_is(self, name: str) -> bool:
        return self._after is not None and not self._after.ended and self._after.name == name

    def on_prediction_step(self, args, state, control, **kwargs):
        if self._after_is("eval") or "eval" not in self.records:
            return
        self._end(self._after)  # a log phase the Trainer did not end with on_log
        # evaluation the control flags did not announce (your own `trainer.evaluate()` or `predict()`):
        # from its first prediction step
        self._after = rltrace.start_phase("eval", step=self._last_step, weight_version=int(state.global_step))

    def on_evaluate(self, args, state, control, **kwargs):
        if self._after_is("eval"):
            self._end(self._after)
        if self._after is None or self._after.ended:
            self._after = None
            self._then(control, ("save",), state)

    def on_predict(self, args, state, control, **kwargs):
        if self._after_is("eval"):
            self._end(self._after)
            self._after = None

    def on_save(self, args, state, control, **kwargs):
        if self._after_is("save"):
            self._end(self._after)
            self._after = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._after_is("log"):  # the training log; an evaluation's own log stays inside `eval`
            self._end(self._after)
            self._after = None
            self._then(control, ("eval", "save"), state)
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
