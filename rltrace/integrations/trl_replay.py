"""Debug replay for TRL runs: freezing trained batches, and entry points that recompute them.

`instrument(trainer, run_dir, freeze=FreezePolicy(every=50))` (or `RLTRACE_FREEZE_EVERY=50`
with `rltrace run`) freezes, on the steps the policy picks, every sample trained on in that
step, with the tokenizer and a checkpoint of the weights that step trained from
(`RUN_DIR/checkpoints/trl/step_<N>`, saved by a thread). Then:

    rltrace replay run RUN_DIR --step N --entry rltrace.integrations.trl_replay:rewards
    rltrace replay run RUN_DIR --step N --entry rltrace.integrations.trl_replay:logprobs
    rltrace replay diff RUN_DIR --step N --pair log_probs=train_log_probs

`rewards` calls the run's reward functions again (imported by module, or by file for a script
run as `__main__`) and combines them with TRL's weights; `logprobs` loads the checkpoint and
scores each response with TRL's own fused log-prob head at the run's temperature, padding
samples as TRL's batch did.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from pathlib import Path
from typing import Any

import torch

import rltrace.replay
from rltrace._config import resolve
from rltrace.integrations import _trl_batch as tb

CHECKPOINTS = Path("checkpoints") / "trl"


def _policy(freeze) -> rltrace.replay.Freezer:
    if isinstance(freeze, rltrace.replay.Freezer):
        return freeze
    if isinstance(freeze, rltrace.replay.FreezePolicy):
        return rltrace.replay.Freezer(freeze)
    if freeze is None:
        return rltrace.replay.Freezer(rltrace.replay.FreezePolicy(every=resolve("freeze_every", None)))
    raise TypeError(f"freeze must be a rltrace.replay.FreezePolicy or Freezer, got {type(freeze).__name__}")


def _function_ref(func) -> dict:
    """Where a reward function can be imported from again: module:name, or file.py:name for a script."""
    func = getattr(func, "_rltrace_original", func)
    name = getattr(func, "__name__", None)
    module = getattr(func, "__module__", None)
    ref = {"name": name, "module": module, "spec": None}
    if name and module and module != "__main__" and "<locals>" not in getattr(func, "__qualname__", ""):
        from rltrace.replay.rerun import portable_spec

        ref["spec"] = portable_spec(f"{module}:{name}")  # its file, when found through sys.path only
    elif name:
        try:
            ref["spec"] = f"{inspect.getsourcefile(func)}:{name}"
        except TypeError:
            pass
    return ref


class FreezeHook:
    """Collects what a frozen step needs while TRL runs; freezes it just before the optimizer update."""

    def __init__(self, hooks, freeze):
        self.hooks = hooks
        self.freezer = _policy(freeze)
        self.samples: dict[int, dict] = {}  # sample id -> what the rollout knew
        self.batches: dict[int, list] = {}  # step -> [(inputs, train log-probs)] trained on in it
        self.threads: list[threading.Thread] = []

    def remember(self, gen: tb.Generation, rows: list[dict]) -> None:
        """At the end of a generation: token ids, texts, reward inputs and rollout log-probs per sample."""
        inputs, prompts, completions = gen.reward_inputs or (None, None, None)
        self.samples.clear()  # every sample of the previous generation has been trained on by now
        tok = self.hooks.trainer.processing_class
        for i, row in enumerate(rows):
            sample = {
                "prompt_tokens": list(gen.prompt_ids[i]),
                "response_tokens": list(gen.completion_ids[i]),
                "row": row,
            }
            if prompts is not None:
                sample["prompt"], sample["completion"] = prompts[i], completions[i]
                columns = {k: v for k, v in inputs[i].items() if k not in ("prompt", "completion", "completion_ids")}
                sample["columns"] = _jsonable(columns)
            sample["prompt_text"] = prompts[i] if prompts is not None and isinstance(prompts[i], str) else \
                tok.decode(gen.prompt_ids[i])
            sample["response_text"] = completions[i] if completions is not None and isinstance(completions[i], str) \
                else tok.decode(gen.completion_ids[i], skip_special_tokens=True)
            self.samples[row["sample_id"]] = sample

    def trained(self, step: int, inputs: dict, train_logps: torch.Tensor) -> None:
        self.batches.setdefault(step, []).append((inputs, train_logps.detach()))

    def before_update(self, step: int) -> None:
        """Weights are still those the step trained from: freeze if the policy says so."""
        batches = self.batches.pop(step, [])
        for old in [s for s in self.batches if s < step]:
            self.batches.pop(old)
        if not batches:
            return
        rewards = [self.samples[sid]["row"]["reward"] for inputs, _ in batches for sid in inputs[tb.SAMPLE_ID].tolist()
                   if sid in self.samples and self.samples[sid]["row"]["reward"] is not None]
        metrics = {"reward_mean": sum(rewards) / len(rewards)} if rewards else {}
        policy = self.freezer.policy
        rows = self._rows(batches) if policy.bad_text else None
        decision = self.freezer.decide(step, rows, metrics, None)
        if decision is None:
            return
        trigger, reason = decision
        if trigger == "anomaly":
            self.freezer._last_anomaly_step = step  # what Freezer.step does after deciding
        rows = rows if rows is not None else self._rows(batches)
        checkpoint = self._save_checkpoint(step)
        rltrace.replay.freeze(step, rows, batch_meta=self._meta(step, checkpoint), trigger=trigger, reason=reason)

    def _rows(self, batches) -> list[dict]:
        rows = []
        for inputs, train in batches:
            ids = inputs[tb.SAMPLE_ID].tolist()
            prompt_width, completion_width = inputs["prompt_ids"].shape[1], inputs["completion_ids"].shape[1]
            rollout = inputs.get(tb.ROLLOUT_LOGPS)
            for i, sid in enumerate(ids):
                sample = self.samples.get(sid)
                if sample is None:
                    continue
                n = len(sample["response_tokens"])
                row = sample["row"]
                funcs = {k[len("reward_"):]: v for k, v in row.items() if k.startswith("reward_")}
                out = {
                    "sample_id": sid,
                    "group_id": row["group_id"],
                    "prompt_tokens": sample["prompt_tokens"],
                    "response_tokens": sample["response_tokens"],
                    "train_log_probs": train[i, :n].float().cpu(),
                    "loss_mask": inputs["completion_mask"][i, :n].cpu(),
                    "advantages": float(inputs["advantages"][i]),
                    "reward": row["reward"],
                    "reward_components": funcs,
                    "weight_version": row["weight_version"],
                    "finish_reason": row["finish_reason"],
                    "prompt_text": sample["prompt_text"],
                    "response_text": sample["response_text"],
                    "metadata": {"columns": sample.get("columns", {}), "prompt": _jsonable(sample.get("prompt")),
                                 "completion": _jsonable(sample.get("completion")),
                                 "prompt_width": prompt_width, "completion_width": completion_width},
                }
                if rollout is not None:
                    out["rollout_log_probs"] = rollout[i, :n].float().cpu()
                rows.append(out)
        return rows

    def _save_checkpoint(self, step: int) -> str:
        """A copy of the weights now (before the update), written by a thread; returns its folder."""
        t = self.hooks.trainer
        run = rltrace.current_run()
        path = Path(run.run_dir) / CHECKPOINTS / f"step_{step:06d}"
        model = t.accelerator.unwrap_model(t.model)
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

        def save():
            path.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(path, state_dict=state)
            t.processing_class.save_pretrained(path)

        thread = threading.Thread(target=save, name="rltrace-trl-checkpoint", daemon=False)
        thread.start()
        self.threads.append(thread)
        return str(path)

    def _meta(self, step: int, checkpoint: str) -> dict:
        t = self.hooks.trainer
        tok = t.processing_class
        return {
            "weight_version": step,
            "tokenizer": tok,
            "checkpoint": checkpoint,
            "temperature": float(getattr(t, "temperature", 1.0)),
            "max_response_len": getattr(t, "max_completion_length", None),
            "eos_token_ids": list(getattr(t, "eos_token_ids", []) or []),
            "pad_token_id": tok.pad_token_id,
            "reward_functions": [_function_ref(f) for f in t.reward_funcs],
            "reward_func_names": list(t.reward_func_names),
            "reward_weights": [float(w) for w in t.reward_weights],
            "trainer": self.hooks.cls,
            "trl_version": self.hooks.version,
        }

    def close(self) -> None:
        for thread in self.threads:
            thread.join()
        self.threads.clear()
        rltrace.replay.flush()


def _jsonable(value: Any) -> Any:
    """Dataset columns and prompts as JSON (what cannot be is kept as its repr, and replay will say so)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)


# --- entry points for `rltrace replay run` ----------------------------------------------------
def rewards(batch) -> dict:
    """The run's reward functions on the frozen completions, combined with TRL's weights (nansum, float32)."""
    from rltrace.replay.rerun import load_object

    meta = batch.extra
    funcs = []
    for ref in meta["reward_functions"]:
        if not ref.get("spec"):
            raise ValueError(f"reward function {ref.get('name')!r} cannot be imported again (a lambda or a "
                             "nested function); define it at module level to replay it")
        funcs.append(load_object(ref["spec"], "reward function"))
    metadata = batch["metadata"]
    prompts = [m["prompt"] if m.get("prompt") is not None else p for m, p in zip(metadata, batch["prompt_text"])]
    completions = [m["completion"] if m.get("completion") is not None else c
                   for m, c in zip(metadata, batch["response_text"])]
    completion_ids = [list(map(int, ids)) for ids in batch["response_tokens"]]
    columns: dict[str, list] = {}
    for m in metadata:
        for key, value in m.get("columns", {}).items():
            columns.setdefault(key, []).append(value)
    kwargs = {**columns, "trainer_state": None, "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}
    per_func = torch.zeros(len(prompts), len(funcs))
    for j, func in enumerate(funcs):
        out = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
        if inspect.isawaitable(out):
            out = asyncio.run(out)
        per_func[:, j] = torch.tensor([torch.nan if r is None else r for r in out], dtype=torch.float32)
    weights = torch.tensor(meta["reward_weights"], dtype=torch.float32)
    total = (per_func * weights.unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(per_func).all(dim=1)] = torch.nan
    return {"reward": [float(r) for r in total]}


def logprobs(batch, checkpoint: str | None = None) -> dict:
    """log p of each response token under the checkpoint of the frozen step, as TRL's trainer computes it.

    Samples are padded as in the trained batch (prompts left-padded to `prompt_width`,
    responses right-padded to `completion_width`), so positions match TRL's forward.
    """
    from transformers import AutoModelForCausalLM

    path = checkpoint or batch.meta["checkpoint"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    temperature = float(batch.extra.get("temperature", 1.0))
    try:
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, temperature=temperature, outputs=("log_probs",))
        fused = True
    except ImportError:
        fused = False
    pad = int(batch.extra["pad_token_id"])
    metadata = batch["metadata"]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(metadata):
        groups.setdefault((m["prompt_width"], m["completion_width"]), []).append(i)
    out: list = [None] * len(metadata)
    for (pw, cw), members in groups.items():
        ids, mask = [], []
        for i in members:
            p, r = [int(x) for x in batch["prompt_tokens"][i]], [int(x) for x in batch["response_tokens"][i]]
            ids.append([pad] * (pw - len(p)) + p + r + [pad] * (cw - len(r)))
            mask.append([0] * (pw - len(p)) + [1] * (len(p) + len(r)) + [0] * (cw - len(r)))
        input_ids, attention_mask = torch.tensor(ids), torch.tensor(mask)
        with torch.no_grad():
            if fused:
                labels = input_ids.masked_fill(attention_mask == 0, -100)
                labels[:, :-cw] = -100
                logp = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                             fused_lm_head=True).log_probs[:, -cw:]
            else:
                logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -cw - 1 : -1]
                logp = torch.log_softmax(logits.float() / temperature, -1).gather(
                    -1, input_ids[:, -cw:].unsqueeze(-1)).squeeze(-1)
        for row, i in enumerate(members):
            out[i] = logp[row, : len(batch["response_tokens"][i])].float()
    return {"log_probs": out}
