"""What the TRL hooks record from what they see: samples, mismatch metrics, TRL's logs (the recording
half of `_trl_hooks.Hooks`, which owns the trainer, the current generation and the freeze hook).
"""

from __future__ import annotations

import torch

import rltrace
from rltrace import _names
from rltrace.integrations import _trl_batch as tb

#: TRL's logged names -> rltrace's (`reward` -> `reward_mean`, `sampling/...` -> the mismatch names):
#: the aliases every reader of a run already accepts, applied once when TRL's logs are stored.
METRIC_NAMES = {alias: name for name, aliases in _names.METRIC_ALIASES.items() for alias in aliases}


class Ledger:
    """Per-run bookkeeping between TRL's calls; mixed into Hooks (needs `trainer`, `gen`, `freezing`,
    `loss_logps` and `_close_train` from it)."""

    def __init__(self):
        self.generations = 0
        self.pending_rows: dict[int, dict] = {}  # sample id -> row of the current generation (no train_version)
        self.used: set[int] = set()  # sample ids of pending_rows trained on at least once
        self.sums: dict[int, tb.StepSums] = {}  # step -> mismatch sums
        self.trained: dict[int, list[int]] = {}  # step -> sample ids trained on in it
        self.own_metrics: dict[int, set[str]] = {}  # step -> mismatch metrics measured by us
        self.last_step = -1  # the last optimizer step ended (TRL's logs are stored at it)

    def _finish_generation(self, output: dict) -> None:
        """Samples of this generation, and the ids and rollout log-probs that ride along in the batch."""
        gen, t = self.gen, self.trainer
        if gen.completion_ids is None or not isinstance(output, dict):
            return
        n_local = len(gen.completion_ids)
        index = t.accelerator.process_index
        n_all = n_local * t.accelerator.num_processes
        base = self.generations * n_all
        self.generations += 1
        group = getattr(t, "num_generations", None) or 1
        eos = set(getattr(t, "eos_token_ids", None) or []) | {t._tokenizer.pad_token_id}
        names = list(getattr(t, "reward_func_names", []) or [])
        weights = getattr(t, "reward_weights", None)
        if weights is None:
            weights = torch.ones(len(names))
        rows = tb.sample_rows(gen, first_id=base + index * n_local, first_group=base // group, group_size=group,
                              process_slice=slice(index * n_local, (index + 1) * n_local), func_names=names,
                              weights=weights, eos_ids=eos)
        self._log_unused()  # every sample of the previous generation has had its steps by now
        for row in rows:
            self.pending_rows[row["sample_id"]] = row
        device = output["completion_ids"].device
        output[tb.SAMPLE_ID] = torch.arange(base + index * n_local, base + (index + 1) * n_local, device=device)
        logps = tb.padded(gen.rollout_logps, output["completion_ids"].shape[1], device)
        if logps is not None:
            output[tb.ROLLOUT_LOGPS] = logps
        if self.freezing is not None:
            self.freezing.remember(gen, rows)

    def _after_loss(self, step: int, inputs: dict) -> None:
        ids = inputs.get(tb.SAMPLE_ID)
        if ids is not None:
            first = self.trained.setdefault(step, [])
            first.extend(ids.tolist())  # a (B,) CPU copy of ints; on GPU a small sync
        rollout = inputs.get(tb.ROLLOUT_LOGPS)
        if rollout is None:
            rollout = inputs.get("sampling_per_token_logps")  # vLLM's, as TRL keeps them
        train = self.loss_logps
        if rollout is None or train is None:
            return
        # Mismatch is the engine gap: log p of the trainer at the generation's weights. TRL computes
        # those (old_per_token_logps) when a generation feeds later steps; else the loss's are them.
        # Staleness is measured apart (samples' train_version - weight_version).
        old = inputs.get("old_per_token_logps")
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        cap = getattr(self.trainer, "vllm_importance_sampling_clip_max", None) or 2.0
        self.sums.setdefault(step, tb.StepSums()).add(train if old is None else old, rollout, mask, cap, ids)
        if self.freezing is not None:
            self.freezing.trained(step, inputs, train)  # log p at v_t: what a replay at this step's checkpoint gives

    def end_step(self, step: int) -> None:
        """The optimizer step `step` is done: its mismatch metrics and a row per sample trained on in it
        (a sample reused by later steps, with `num_iterations` > 1, gets a row at each of them)."""
        sums = self.sums.pop(step, None)
        per_sample = {}
        if sums is not None:
            metrics = sums.metrics()
            if metrics:
                rltrace.log_metrics(step, **metrics)
            self.own_metrics = {step: set(metrics)}
            per_sample = sums.per_sample()
        rows = []
        for sid in dict.fromkeys(self.trained.pop(step, [])):  # once per step, in order
            row = self.pending_rows.get(sid)
            if row is None:
                continue
            self.used.add(sid)
            row = {**row, "train_version": step}
            if sid in per_sample:
                row["logprob_abs_diff"] = per_sample[sid]
            rows.append(row)
        if rows:
            rltrace.log_samples(step, rows)

    def _log_unused(self) -> None:
        """Samples generated but never trained on (the run stopped first): stored at their generation
        step without train_version; then the generation is forgotten."""
        by_step: dict[int, list[dict]] = {}
        for sid, row in self.pending_rows.items():
            if sid not in self.used:
                by_step.setdefault(row["weight_version"], []).append(row)
        self.pending_rows.clear()
        self.used.clear()
        for step, rows in by_step.items():
            rltrace.log_samples(step, rows)

    def end_training(self) -> None:
        self._close_train(None)
        for step in sorted(set(self.sums) | set(self.trained)):
            self.end_step(step)
        self._log_unused()
        if self.freezing is not None:
            self.freezing.close()
        rltrace.flush()

    def rename(self, values: dict) -> dict:
        """TRL's logged numbers under rltrace's names where one exists (METRIC_NAMES)."""
        own = self.own_metrics.get(self.last_step, set())
        out = {}
        for key, value in values.items():
            name = METRIC_NAMES.get(key, key)
            if name in own and name != key:
                name = key  # we measured it ourselves this step: keep TRL's figure under TRL's name
            out[name] = value
        return out
