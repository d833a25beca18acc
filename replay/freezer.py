"""Freezing a batch from a training loop: `freeze` (now) and `Freezer` (when a `FreezePolicy` says).

    rltrace.init("runs/exp1")
    freezer = rltrace.replay.Freezer(rltrace.replay.FreezePolicy(every=50, reward_drop=0.2, bad_text=True))
    for step in ...:
        freezer.step(step, samples, metrics={"reward_mean": r}, batch_meta={"weight_version": v})

The caller pays for a shallow snapshot only (about a microsecond per sample): the arrays are
referenced, not copied, and written by a background thread (see `rltrace.replay.writer`). So
do not modify them in place after the call; pass `copy=True` to clone them instead. CUDA
tensors are copied to host on that thread (on the default stream); if they were made on a
side stream, synchronise it first or pass `copy=True`.
"""

from __future__ import annotations

import collections
import json
import operator
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rltrace import _names
from rltrace.api import recording_run
from rltrace.replay import codec, flags
from rltrace.replay.batch import check_columns, new_batch_id
from rltrace.replay.writer import Job, writer_for

REQUEST_FILE = "replay_request.json"  # written by `rltrace replay request RUN_DIR`


def _step(value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"freeze: step must be an integer, got {value!r}") from None


def _clone(value: Any) -> Any:
    """A copy the caller cannot change: tensors and arrays cloned, containers copied (`copy=True`)."""
    kind = codec.kind_of(value)
    if kind == "torch":
        return value.detach().clone()
    if kind == "numpy":
        return np.array(value, copy=True)
    if isinstance(value, (list, tuple)):
        return [_clone(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _is_scalar(value: Any, kind: str) -> bool:
    if kind == "torch":
        return value.dim() == 0
    if kind == "numpy":
        return np.ndim(value) == 0
    return kind == "scalar"


def check_canonical(name: str, value: Any) -> None:
    """Cheap check, on the caller's thread, that a column with a fixed meaning holds the right thing."""
    kind = codec.kind_of(value)
    if kind is None or name not in _names.BATCH_SAMPLE_COLUMNS:
        return
    if name == "weight_version" and not _is_scalar(value, kind):
        raise ValueError("weight_version holds one version per sample (v_s); pass several as weight_versions=[...]")
    if name == "reward" and not _is_scalar(value, kind):
        raise ValueError("reward holds one number per sample; put reward parts in reward_components={...}")
    if name in ("finish_reason", "prompt_text", "response_text") and not isinstance(value, str):
        raise ValueError(f"{name} must be a str per sample, got {type(value).__name__}")


def snapshot(samples: Any, copy: bool = False) -> tuple[str, Any, int]:
    """(form, data, n): what the writer thread will convert. Cheap unless `copy`.

    `samples` is a list of dicts (one per sample; "rows") or a dict of columns ("columns"):
    each column a tensor/array whose first dimension is the sample, or a list with one value
    per sample.
    """
    if isinstance(samples, Mapping):
        check_columns(list(samples))
        data, n = {}, None
        for name, column in samples.items():
            kind = codec.kind_of(column)
            if kind in codec.ARRAY_KINDS and np.ndim(column) >= 1:
                rows = column.shape[0]
            elif isinstance(column, (list, tuple)):
                rows = len(column)
            else:
                raise TypeError(
                    f"freeze: column {name!r} must be a tensor/array with one row per sample or a list, "
                    f"got {type(column).__name__}"
                )
            if n is not None and rows != n:
                raise ValueError(f"freeze: column {name!r} has {rows} rows, other columns have {n}")
            if rows:
                check_canonical(name, column[0])  # a view of a tensor: no copy, no device sync
            n = rows
            data[name] = _clone(column) if copy else (list(column) if isinstance(column, (list, tuple)) else column)
        return "columns", data, n or 0
    if isinstance(samples, (list, tuple)):
        if samples and not all(isinstance(s, Mapping) for s in samples[:1]):
            raise TypeError(f"freeze: samples must be dicts (one per sample), got {type(samples[0]).__name__}")
        check_columns(list(set().union(*samples)) if samples else [])
        if samples:
            for name, value in samples[0].items():
                check_canonical(name, value)
        if copy:
            return "rows", [{k: _clone(v) for k, v in s.items()} for s in samples], len(samples)
        return "rows", [dict(s) for s in samples], len(samples)
    raise TypeError(f"freeze: samples must be a list of dicts or a dict of columns, got {type(samples).__name__}")


def freeze(
    step: int,
    samples: Any,
    *,
    batch_meta: Mapping[str, Any] | None = None,
    trigger: str = "on_demand",
    reason: str | None = None,
    copy: bool = False,
) -> bool:
    """Freeze `samples` as the batch of `step`; True if queued for writing (False: skipped and
    counted, or no run). See docs/replay.md for the columns and `batch_meta` keys.

    It never raises into the training loop: samples it cannot take (a column with a fixed meaning
    holding the wrong thing, columns of different lengths) are logged and counted as
    `replay_failed`; a column named like one rltrace sets is dropped, logged and counted as
    `replay_columns_dropped` (a `train_version` column that agrees with the batch's v_t is kept
    as the batch's own).

    Example:
        >>> rltrace.replay.freeze(step, [{"prompt_tokens": p, "response_tokens": r, "reward": 1.0}],
        ...                       batch_meta={"weight_version": v, "tokenizer": tok})
    """
    run = recording_run()
    if run is None:
        return False
    try:
        step = _step(step)
        form, data, n = snapshot(samples, copy)
    except (TypeError, ValueError) as exc:  # a debugging aid never raises into the loop: counted as failed
        writer_for(run).reject(step if isinstance(step, int) else None, str(exc))
        return False
    job = Job(step, new_batch_id(), form, data, n, dict(batch_meta or {}), trigger, reason, time.time_ns())
    return writer_for(run).submit(job)


def flush() -> None:
    """Wait until every queued freeze of this process is written (not for the hot path)."""
    from rltrace.replay.writer import flush_all

    flush_all()


@dataclass
class FreezePolicy:
    """When `Freezer.step` freezes. Every trigger is optional; all can be combined."""

    every: int | None = None  # freeze steps divisible by this
    reward_drop: float | None = None  # anomaly: reward_mean this far below the mean of the last `window` steps
    window: int = 5
    mismatch_threshold: float | None = None  # anomaly: metrics[mismatch_metric] above this
    mismatch_metric: str = "train_rollout_logprob_abs_diff"
    bad_text: bool = False  # anomaly: a probe of `probe_samples` samples shows a flags.BAD_TEXT flag
    probe_samples: int = 8
    cooldown: int = 10  # steps after an anomaly freeze before the next anomaly freeze
    watch_requests: bool = True  # freeze when `rltrace replay request RUN_DIR` asks

    def __post_init__(self):
        if self.every is not None and self.every < 1:
            raise ValueError(f"FreezePolicy.every must be >= 1, got {self.every}")
        if self.window < 1:
            raise ValueError(f"FreezePolicy.window must be >= 1, got {self.window}")


class Freezer:
    """Calls `freeze` on the steps its policy picks; `request()` freezes the next step."""

    def __init__(self, policy: FreezePolicy | None = None, *, copy: bool = False):
        self.policy = policy or FreezePolicy()
        self.copy = copy
        self._rewards: collections.deque[float] = collections.deque(maxlen=self.policy.window)
        self._requested: str | None = None
        self._last_anomaly_step: int | None = None
        self._request_seen: tuple[int, int] | None = None
        self._request_path: Path | None = None

    def request(self, reason: str = "requested in code") -> None:
        """Freeze the next step given to `step()`."""
        self._requested = reason

    def step(
        self,
        step: int,
        samples: Any,
        *,
        metrics: Mapping[str, float] | None = None,
        batch_meta: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Freeze this step's batch if the policy says so; returns the trigger, or None. Never raises
        into the loop: samples it cannot read are counted as `replay_failed` (see `freeze`)."""
        try:
            decision = self.decide(step, samples, metrics, batch_meta)
        except Exception as exc:
            run = recording_run()
            if run is not None:
                writer_for(run).reject(step if isinstance(step, int) else None, f"{type(exc).__name__}: {exc}")
            return None
        if decision is None:
            return None
        trigger, reason = decision
        if trigger == "anomaly":
            self._last_anomaly_step = step
        queued = freeze(step, samples, batch_meta=batch_meta, trigger=trigger, reason=reason, copy=self.copy)
        return trigger if queued else None

    def decide(
        self,
        step: int,
        samples: Any = None,
        metrics: Mapping[str, float] | None = None,
        batch_meta: Mapping[str, Any] | None = None,
    ) -> tuple[str, str] | None:
        """(trigger, reason) if `step` should be frozen, else None. Cheap: no device syncs, no disk writes."""
        if recording_run() is None:  # not recording (no init, or RLTRACE_DISABLED=1): nothing to decide
            return None
        p = self.policy
        metrics = metrics or {}
        anomaly = self._anomaly(step, samples, metrics, batch_meta)
        reward = metrics.get("reward_mean")
        if reward is not None:
            self._rewards.append(float(reward))
        if self._requested is not None:
            reason, self._requested = self._requested, None
            return "on_demand", reason
        requested = self._file_request()
        if requested is not None:
            return "request", requested
        if anomaly is not None:
            return "anomaly", anomaly
        if p.every is not None and step % p.every == 0:
            return "every_n", f"every {p.every} steps"
        return None

    def _anomaly(self, step: int, samples: Any, metrics: Mapping[str, float], batch_meta: Mapping[str, Any] | None) -> str | None:
        p = self.policy
        if self._last_anomaly_step is not None and step - self._last_anomaly_step <= p.cooldown:
            return None
        reward = metrics.get("reward_mean")
        if p.reward_drop is not None and reward is not None and len(self._rewards) == p.window:
            baseline = sum(self._rewards) / len(self._rewards)
            if float(reward) < baseline - p.reward_drop:
                return f"reward drop: reward_mean {float(reward):.4g} < {baseline:.4g} (mean of last {p.window}) - {p.reward_drop}"
        mismatch = metrics.get(p.mismatch_metric)
        if p.mismatch_threshold is not None and mismatch is not None and float(mismatch) > p.mismatch_threshold:
            return f"mismatch spike: {p.mismatch_metric} {float(mismatch):.4g} > {p.mismatch_threshold}"
        if p.bad_text and samples is not None:
            return self._probe(samples, flags.TextRules.from_meta(batch_meta))
        return None

    def _probe(self, samples: Any, rules: flags.TextRules) -> str | None:
        keys = ("response_tokens", "response_text", "prompt_text", "finish_reason")
        if isinstance(samples, Mapping):
            columns = {k: samples[k] for k in keys if hasattr(samples.get(k), "__len__")}
            n = min((len(c) for c in columns.values()), default=0)
            rows = [{k: c[i] for k, c in columns.items()} for i in range(min(n, self.policy.probe_samples))]
        elif isinstance(samples, (list, tuple)):  # anything else is reported by `freeze`, if a trigger fires
            rows = [r for r in samples[: self.policy.probe_samples] if isinstance(r, Mapping)]
        else:
            return None
        for i, row in enumerate(rows):
            found = flags.sample_flags(row, rules, only=flags.BAD_TEXT)
            if found:
                name, why = next(iter(found.items()))
                return f"bad text in sample {i}: {name} ({why})"
        return None

    def _file_request(self) -> str | None:
        if not self.policy.watch_requests:
            return None
        run = recording_run()
        if run is None:
            return None
        path = Path(run.run_dir) / REQUEST_FILE
        if self._request_path != path:  # first look (or a new run): requests made before now do not count
            self._request_path, self._request_seen = path, _stamp(path)
            return None
        stamp = _stamp(path)
        if stamp is None or stamp == self._request_seen:
            return None
        self._request_seen = stamp
        try:
            return str(json.loads(path.read_text()).get("reason") or "requested from the command line")
        except (OSError, ValueError, AttributeError):
            return "requested from the command line"


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_ino


def write_request(run_dir: str | Path, reason: str | None = None) -> Path:
    """Ask every `Freezer` of a running job to freeze its next step (what `rltrace replay request` does)."""
    path = Path(run_dir) / REQUEST_FILE
    tmp = path.with_name(f".{REQUEST_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"reason": reason or "requested from the command line", "time_ns": time.time_ns()}))
    os.replace(tmp, path)
    return path
