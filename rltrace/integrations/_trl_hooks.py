"""The wrappers `rltrace.integrations.trl.instrument` puts on one TRL trainer, and the state they share.

Imported only when a trainer is instrumented (it needs torch and transformers); see trl.py for
what is recorded and docs/integrations.md for the details.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

import rltrace
from rltrace import _names
from rltrace._config import resolve
from rltrace.integrations import _trl_batch as tb
from rltrace.integrations._trl_faults import fault as _fault
from rltrace.integrations._trl_faults import warn_once as _warn_once
from rltrace.integrations._trl_ledger import Ledger


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback

class Hooks(Ledger):
    """The wrappers of one trainer and the state they share (what they record: `Ledger`)."""

    def __init__(self, trainer, cls: str, version: str, freeze, hook_points: tuple[tuple[str, str], ...]):
        self.trainer, self.cls, self.version, self.hook_points = trainer, cls, version, hook_points
        self._restore: list[tuple[Any, str, bool, Any]] = []  # (object, attribute, had own attr, old value)
        Ledger.__init__(self)
        self.gen: tb.Generation | None = None
        self.missing_logprobs: str | None = None  # why no rollout log-probs can be recorded, found at install
        self.in_loss = False
        self.loss_logps = None
        self.train_phase = None
        self.recorder: tb.LogprobRecorder | None = None
        self.freezing = None
        self._added_hf = None
        self._module_hooks: list = []  # forward hooks on reward models, removed by uninstall
        if freeze is not None or resolve("freeze_every", None):
            from rltrace.integrations.trl_replay import FreezeHook

            self.freezing = FreezeHook(self, freeze)

    # --- patching -----------------------------------------------------------------------------
    def _patch(self, obj, name: str, make) -> bool:
        original = getattr(obj, name, None)
        if original is None:
            return False
        had_own = name in getattr(obj, "__dict__", {})
        self._restore.append((obj, name, had_own, obj.__dict__.get(name) if had_own else None))
        setattr(obj, name, make(original))
        return True

    def install(self) -> None:
        t = self.trainer
        wrappers = {
            "_generate_and_score_completions": self._rollout,
            "_generate": self._generate,
            "_calculate_rewards": self._rewards,
            "_get_per_token_logps_and_entropies": self._logps,
            "compute_loss": self._loss,
        }
        for name, what in self.hook_points:
            if not self._patch(t, name, wrappers.get(name, lambda orig: orig)):
                _warn_once(f"missing:{name}", f"rltrace: trl {self.version} {self.cls} has no method {name}; "
                                              f"not recorded: {what}")
        if not self._patch(t.accelerator, "backward", self._backward):
            _warn_once("missing:backward", f"rltrace: trl {self.version}: accelerator.backward not found; "
                                           "backward is not recorded")
        self._wrap_reward_funcs()
        if getattr(t, "use_vllm", False):
            self._wrap_vllm()
        elif getattr(t, "use_transformers_continuous_batching", False):
            model = t.accelerator.unwrap_model(t.model)
            self._patch(model, "generate_batch", lambda orig: self._engine(orig, record=False))
            self._no_logprobs("transformers continuous batching (generate_batch) returns no sampling log-probs")
        else:
            model = t.accelerator.unwrap_model(t.model)
            generate = getattr(model, "generate", None)
            if generate is None:
                _warn_once("missing:generate", "rltrace: the model has no generate(); generate spans are not recorded")
            else:
                why = _no_processor_seam(generate)
                if why:
                    self._no_logprobs(why)
                self._patch(model, "generate", lambda orig: self._engine(orig, record=not why))
        if getattr(t, "rollout_func", None) is not None:
            self._patch(t, "rollout_func", lambda orig: self._engine(orig, record=False))
        if hasattr(t, "evaluate"):
            self._patch(t, "evaluate", lambda orig: rltrace.phase("eval")(orig))
        self._patch(t, "train", self._train)
        t.add_callback(_make_callback(self))
        self._hf_callback()

    def _no_logprobs(self, why: str) -> None:
        """No rollout log-probs can be recorded on this trainer, so no mismatch: say what was found, once,
        and mark every rollout span with it (`rl.mismatch_missing`) so the report says so too."""
        self.missing_logprobs = why
        _warn_once(f"no-logprobs:{why}", f"rltrace: {why}; mismatch ({', '.join(_names.MISMATCH_METRICS)}) is not recorded "
                                         "for any step of this trainer, and the report says so")

    def _hf_callback(self) -> None:
        """`step`/`optimizer`/`log`/`save` spans and TRL's logs come from
        rltrace.integrations.hf.RltraceCallback (added unless `rltrace run` already did); TRL's names
        are mapped to rltrace's on the way."""
        from rltrace.integrations.hf import RltraceCallback

        t = self.trainer
        callback = next((cb for cb in t.callback_handler.callbacks if isinstance(cb, RltraceCallback)), None)
        if callback is None:
            callback = RltraceCallback()
            t.add_callback(callback)
            self._added_hf = callback
        # TRL's own train spans (each micro-batch's loss forward and backward) and its evaluate
        # wrapper say more than the callback's step-long ones would: the callback leaves those out
        self._restore.append((callback, "records", True, set(callback.records)))
        callback.records -= {"train", "eval"}
        original = callback.metrics

        def metrics(logs):
            return self.rename(original(logs))

        self._patch(callback, "metrics", lambda orig: metrics)

    def uninstall(self) -> None:
        for obj, name, had_own, old in reversed(self._restore):
            if had_own:
                setattr(obj, name, old)
            else:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
        self._restore.clear()
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks.clear()
        for cb in list(self.trainer.callback_handler.callbacks):
            if getattr(cb, "_rltrace_hooks", None) is self or cb is self._added_hf:
                self.trainer.remove_callback(cb)

    def _wrap_reward_funcs(self) -> None:
        """One child span per reward function, named by TRL's name for it."""
        t = self.trainer
        funcs, names = getattr(t, "reward_funcs", None), getattr(t, "reward_func_names", None)
        if not funcs or not names:
            _warn_once("missing:reward_funcs", f"rltrace: trl {self.version}: no reward_funcs/reward_func_names; "
                                               "per-function reward spans are not recorded")
            return
        wrapped = []
        for func, name in zip(funcs, names):
            span_name = name if name not in _names.PHASES else f"reward:{name}"
            if isinstance(func, torch.nn.Module):
                self._module_hooks.extend(_module_phase(func, span_name, name))
                wrapped.append(func)
            else:
                wrapped.append(_func_phase(func, span_name, name, self))
        self._restore.append((t, "reward_funcs", True, funcs))
        t.reward_funcs = wrapped

    def _wrap_vllm(self) -> None:
        """vLLM paths (server and colocate): untested here (no GPU engine on CPU)."""
        t = self.trainer
        vg = getattr(t, "vllm_generation", None)
        if vg is None:
            _warn_once("missing:vllm", f"rltrace: trl {self.version}: vllm_generation not found; vLLM generate "
                                       "and weight_sync are not recorded")
            return
        self._patch(vg, "generate", lambda orig: self._engine(orig, record=False))
        method = f"vllm_{getattr(t.args, 'vllm_mode', 'server')}"

        def make(orig):
            @functools.wraps(orig)
            def sync_weights(*args, **kwargs):
                step = t.state.global_step
                with rltrace.phase("weight_sync", step=step, weight_version=step, method=method,
                                   bytes=self._model_bytes()) as phase, _flush_recorded(vg, phase):
                    return orig(*args, **kwargs)

            return sync_weights

        if not self._patch(vg, "sync_weights", make):
            _warn_once("missing:sync_weights", f"rltrace: trl {self.version}: vllm_generation.sync_weights not "
                                               "found; weight_sync is not recorded")

    def _model_bytes(self) -> int:
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        return int(sum(p.numel() * p.element_size() for p in model.parameters()))

    # --- wrappers -----------------------------------------------------------------------------
    def _training(self) -> bool:
        return bool(getattr(self.trainer.model, "training", False))

    def _train(self, orig):
        """When training raises, the phases TRL's callbacks left open end with its error."""

        @functools.wraps(orig)
        def train(*args, **kwargs):
            try:
                return orig(*args, **kwargs)
            except BaseException as exc:
                try:
                    self._close_train(exc)
                    for cb in self.trainer.callback_handler.callbacks:
                        if callable(getattr(cb, "fail", None)):
                            cb.fail(exc)
                except Exception:
                    _fault("closing phases after a TRL error")
                raise

        return train

    def _rollout(self, orig):
        @functools.wraps(orig)
        def rollout(inputs, *args, **kwargs):
            if not self._training():
                return orig(inputs, *args, **kwargs)
            self._close_train(None)
            step = self.trainer.state.global_step
            self.gen = tb.Generation(step=step)
            try:
                with rltrace.phase("rollout", step=step, weight_version=step, samples=len(inputs)) as phase:
                    output = orig(inputs, *args, **kwargs)
                    if self.gen.rollout_logps is None:
                        phase.set(**{_names.MISMATCH_MISSING: self.gen.missing_logprobs or self.missing_logprobs
                                     or "the generation returned no sampling log-probs"})
                try:
                    self._finish_generation(output)
                except Exception:
                    _fault("recording a TRL generation")
                return output
            finally:
                self.gen = None

        return rollout

    def _generate(self, orig):
        @functools.wraps(orig)
        def generate(prompts, *args, **kwargs):
            out = orig(prompts, *args, **kwargs)
            gen = self.gen
            if gen is not None:
                try:
                    gen.prompt_ids, gen.completion_ids = out[0], out[1]
                    if len(out) > 4 and out[4] is not None:  # GRPO with vLLM (or a rollout_func): sampling log-probs
                        gen.rollout_logps = out[4]
                except Exception:
                    _fault("reading TRL's generation output")
            return out

        return generate

    def _engine(self, orig, record: bool):
        """`generate` around the engine call; on the transformers path, log q from the sampling scores."""

        @functools.wraps(orig)
        def engine(*args, **kwargs):
            gen = self.gen
            if gen is None:
                return orig(*args, **kwargs)
            recorder = tb.LogprobRecorder() if record else None
            model = getattr(orig, "__self__", None)
            model = getattr(model, "get_base_model", lambda: model)()  # PEFT: the model whose generate samples
            patched = recorder is not None and self._add_recorder(model, recorder)
            gen.gen_start = tb.now()
            try:
                with rltrace.phase("generate", step=gen.step, weight_version=gen.step):
                    out = orig(*args, **kwargs)
            finally:
                gen.gen_end = tb.now()
                if patched:
                    del model._get_logits_processor
            if patched:
                try:
                    sequences = out if isinstance(out, torch.Tensor) else out.sequences
                    gen.rollout_logps = recorder.finish(sequences)
                    if gen.rollout_logps is None:
                        gen.missing_logprobs = ("generate() did not call rltrace's logits processor (a custom "
                                                "generation path?), so no rollout log-probs were recorded")
                        _warn_once("recorder", f"rltrace: {gen.missing_logprobs}; mismatch is not recorded for the "
                                               "steps this happens in, and the report says so")
                except Exception:
                    _fault("reading rollout log-probs")
            return out

        return engine

    def _add_recorder(self, model, recorder) -> bool:
        original = getattr(model, "_get_logits_processor", None)
        if original is None:  # checked at install (_no_processor_seam); a model swapped since then
            self.gen.missing_logprobs = (f"{type(model).__name__} has no _get_logits_processor; the rollout "
                                         "log-prob processor cannot be attached")
            return False

        def with_recorder(*args, **kwargs):
            processors = original(*args, **kwargs)
            processors.append(recorder)
            return processors

        model._get_logits_processor = with_recorder
        return True

    def _rewards(self, orig):
        @functools.wraps(orig)
        def rewards(*args, **kwargs):
            gen = self.gen
            if gen is None:
                return orig(*args, **kwargs)
            if self.freezing is not None and len(args) >= 3:
                gen.reward_inputs = args[:3]  # (inputs, prompts, completions), for replaying the rewards
            with rltrace.phase("reward", step=gen.step, weight_version=gen.step):
                out = orig(*args, **kwargs)
            gen.rewards_per_func = out
            return out

        return rewards

    def _logps(self, orig):
        @functools.wraps(orig)
        def logps(model, *args, **kwargs):
            if self.in_loss:
                out = orig(model, *args, **kwargs)
                if self.loss_logps is None:
                    self.loss_logps = out[0]
                return out
            gen = self.gen
            if gen is None:
                return orig(model, *args, **kwargs)
            which = "reference" if model is getattr(self.trainer, "ref_model", None) else "policy"
            with rltrace.phase("train", step=gen.step, weight_version=gen.step, logprobs_of=which):
                return orig(model, *args, **kwargs)

        return logps

    def _loss(self, orig):
        """`train` opens with the loss forward and closes after `accelerator.backward`: one span per
        micro-batch for TRL's forward and backward, opened and closed from two calls (start_phase)."""

        @functools.wraps(orig)
        def compute_loss(model, inputs, *args, **kwargs):
            if not self._training() or not torch.is_grad_enabled():
                return orig(model, _strip(inputs), *args, **kwargs)
            self._close_train(None)
            step = self.trainer.state.global_step
            self.train_phase = rltrace.start_phase("train", step=step, weight_version=step)
            self.in_loss, self.loss_logps = True, None
            try:
                loss = orig(model, _strip(inputs), *args, **kwargs)
            except BaseException as exc:
                self._close_train(exc)
                raise
            finally:
                self.in_loss = False
            try:
                self._after_loss(step, inputs)
            except Exception:
                _fault("recording TRL train log-probs")
            return loss

        return compute_loss

    def _backward(self, orig):
        @functools.wraps(orig)
        def backward(*args, **kwargs):
            if self.train_phase is None:
                return orig(*args, **kwargs)
            try:
                out = orig(*args, **kwargs)
            except BaseException as exc:
                self._close_train(exc)
                raise
            self._close_train(None)
            return out

        return backward

    def _close_train(self, exc: BaseException | None) -> None:
        handle, self.train_phase = self.train_phase, None
        if handle is not None and not handle.ended:
            handle.end(error=exc)


def _no_processor_seam(generate) -> str | None:
    """Why rltrace's logits processor cannot ride on `generate` (a plain text for the user), or None.

    The processor is added through `GenerationMixin._get_logits_processor` of the model that
    `generate` is bound to (the base model under PEFT); a plain function around `model.generate`
    hides which model samples, and a model that is no `GenerationMixin` has no such seam."""
    owner = getattr(generate, "__self__", None)
    if owner is None:
        name = getattr(generate, "__qualname__", None) or type(generate).__name__
        return (f"`model.generate` is wrapped by a plain function ({name}); the rollout log-prob processor "
                "cannot be attached")
    owner = getattr(owner, "get_base_model", lambda: owner)()
    if getattr(owner, "_get_logits_processor", None) is not None:
        return None
    from transformers import GenerationMixin

    if isinstance(owner, GenerationMixin):
        import transformers

        return (f"transformers {transformers.__version__} has no GenerationMixin._get_logits_processor; the rollout "
                "log-prob processor cannot be attached")
    return (f"`model.generate` belongs to {type(owner).__name__}, which is no transformers GenerationMixin; the "
            "rollout log-prob processor cannot be attached")


def _strip(inputs):
    """The batch without our riders, so TRL sees exactly what it built."""
    if isinstance(inputs, dict) and tb.SAMPLE_ID in inputs:
        return {k: v for k, v in inputs.items() if k not in tb.KEYS}
    return inputs


def _func_phase(func, span_name: str, name: str, hooks: Hooks):
    """A reward function recorded as a child span; async stays async (TRL awaits those)."""
    from trl.trainer.utils import is_async_callable

    if is_async_callable(func):

        async def async_reward(*args, **kwargs):
            with rltrace.phase(span_name, reward_function=name):
                return await func(*args, **kwargs)

        async_reward.__name__ = getattr(func, "__name__", name)
        async_reward._rltrace_original = func
        return async_reward

    def reward(*args, **kwargs):
        with rltrace.phase(span_name, reward_function=name):
            return func(*args, **kwargs)

    reward.__name__ = getattr(func, "__name__", name)
    reward._rltrace_original = func
    return reward


def _module_phase(module, span_name: str, name: str) -> list:
    """A reward model (nn.Module) recorded from forward hooks (TRL checks isinstance(nn.Module),
    so it is not wrapped); returns the hook handles."""
    open_phases: list = []

    def pre(mod, args):
        open_phases.append(rltrace.start_phase(span_name, reward_function=name))

    def post(mod, args, output):
        if open_phases:
            open_phases.pop().end()

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post, always_call=True)]


def _make_callback(hooks: Hooks):
    """A TrainerCallback that ends each step's bookkeeping (mismatch metrics, samples, frozen batches)."""
    base = _callback_base()

    class _TrlCallback(base):
        _rltrace_hooks = hooks

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if hooks.freezing is not None:
                try:
                    hooks.freezing.before_update(state.global_step)
                except Exception:
                    _fault("freezing a TRL batch")

        def on_step_end(self, args, state, control, **kwargs):
            try:
                hooks.last_step = state.global_step - 1  # HF has already counted the finished step
                hooks.end_step(hooks.last_step)
            except Exception:
                _fault("ending a TRL step")

        def on_train_end(self, args, state, control, **kwargs):
            try:
                hooks.end_training()
            except Exception:
                _fault("ending a TRL run")

    return _TrlCallback()


@contextlib.contextmanager
def _flush_recorded(vg, phase):
    """While TRL syncs weights: its `reset_prefix_cache()` (the server's client, or the colocated
    engine) marks the weight_sync span `rl.cache_flushed` true when it returns; a process that does
    not flush (not the main one) records nothing: the report then says its hits may be stale."""
    targets = [t for t in (getattr(vg, "vllm_client", None), getattr(vg, "llm", None))
               if t is not None and callable(getattr(t, "reset_prefix_cache", None))]
    saved = [(t, t.__dict__.get("reset_prefix_cache", _UNSET)) for t in targets if hasattr(t, "__dict__")]
    for target, _ in saved:
        original = target.reset_prefix_cache

        def reset(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            phase.set(cache_flushed=True)
            return out

        target.reset_prefix_cache = reset
    try:
        yield
    finally:
        for target, before in saved:
            if before is _UNSET:
                target.__dict__.pop("reset_prefix_cache", None)
            else:
                target.reset_prefix_cache = before


_UNSET = object()
