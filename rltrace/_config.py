"""Every setting of `rltrace.init`, declared once: its environment variables, type, default and meaning.

A value resolves as: keyword argument > first environment variable set > default. A malformed
value raises `RltraceConfigError` naming the variable, so a typo in a launch script fails at
start instead of silently recording nothing. Imports nothing from rltrace.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable


class RltraceError(Exception):
    """Base class of rltrace errors that the CLI prints as one line, without a traceback."""


class RltraceConfigError(RltraceError, ValueError):
    """A setting of `rltrace.init` (argument or environment variable) has an impossible value."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {text!r}")


_MAX_FLOAT = 1e9  # seconds, MB, factors: anything larger is a typo (and overflows thread timeouts)
_MAX_INT = 2**40


def _parse_positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value <= _MAX_FLOAT:  # also refuses nan and inf
        raise ValueError(f"must be a finite number > 0 (at most {_MAX_FLOAT:g}), got {text!r}")
    return value


def _parse_seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= _MAX_FLOAT:  # also refuses nan and inf
        raise ValueError(f"must be a finite number of seconds >= 0 (at most {_MAX_FLOAT:g}), got {text!r}")
    return value


def _parse_interval(text: str) -> float:
    value = _parse_positive_float(text)
    if value > 3600:
        raise ValueError(f"must be at most 3600 seconds (a killed process loses about this much), got {text!r}")
    return value


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if not 0 < value <= _MAX_INT:
        raise ValueError(f"must be a positive integer (at most 2**40), got {text!r}")
    return value


def _parse_names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError("expected a comma-separated list of names")
    return names


def _parse_thresholds(text: str) -> dict[str, float]:
    """`"5"` (every phase) or `"reward=2,train=30"` (seconds per phase) -> {phase or "*": seconds}."""
    out = {}
    for part in text.split(","):
        phase, sep, seconds = part.strip().rpartition("=")
        phase = phase.strip() if sep else "*"
        if not phase:
            raise ValueError(f"{part.strip()!r} names no phase: write PHASE=SECONDS")
        out[phase] = _parse_positive_float(seconds.strip())
    return out


def _parse_windows(text: str) -> tuple[tuple[str, int, int], ...]:
    """`"train:5-7,rollout:3"` -> ((phase, first_step, last_step), ...)."""
    out = []
    for part in text.split(","):
        phase, sep, steps = part.strip().rpartition(":")
        first, dash, last = steps.partition("-")
        try:
            window = (phase.strip(), int(first), int(last) if dash else int(first))
        except ValueError:
            window = None
        if not sep or not phase.strip() or window is None or not 0 <= window[1] <= window[2]:
            raise ValueError(f"{part.strip()!r} is not PHASE:STEP or PHASE:FIRST-LAST (e.g. train:5-7)")
        out.append(window)
    return tuple(out)


def paths_value(paths: list[str]) -> str:
    """An environment value holding several paths: a JSON list (any separator can occur in a path)."""
    return json.dumps([str(p) for p in paths])


def _parse_paths(text: str) -> tuple[str, ...]:
    """A JSON list of paths (`paths_value`), or one plain path."""
    if text.lstrip().startswith("["):
        try:
            return tuple(str(p) for p in json.loads(text) if p)
        except (ValueError, TypeError):
            pass
    return (text,) if text else ()


def _parse_object(text: str) -> dict:
    """A JSON object (`rltrace ui` writes it)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


def _parse_rank(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Param:
    name: str
    env: tuple[str, ...]
    parse: Callable[[str], Any]
    default: Any
    doc: str


PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("run_dir", ("RLTRACE_RUN_DIR",), str, None, "Run directory that every process of the run writes to."),
        Param("run_name", ("RLTRACE_RUN_NAME",), str, None, "Human name of the run (default: the directory name)."),
        Param("role", ("RLTRACE_ROLE",), str, "trainer", "What this process does: trainer, rollout, reward, ..."),
        Param("rank", ("RLTRACE_RANK", "RANK"), _parse_rank, None, "Rank of this process within its role."),
        Param("disabled", ("RLTRACE_DISABLED",), _parse_bool, False, "Turn every rltrace call into a no-op."),
        Param(
            "flush_interval",
            ("RLTRACE_FLUSH_INTERVAL",),
            _parse_interval,
            1.0,
            "Seconds between writes to the store; a killed process loses at most about this much.",
        ),
        Param(
            "max_queue",
            ("RLTRACE_MAX_QUEUE",),
            _parse_positive_int,
            32768,
            "Spans held in memory awaiting export; beyond this new spans are dropped and counted.",
        ),
        Param(
            "max_pending_rows",
            ("RLTRACE_MAX_PENDING_ROWS",),
            _parse_positive_int,
            1_000_000,
            "Metric and sample rows held in memory awaiting write; beyond this rows are dropped and counted.",
        ),
        Param(
            "otlp_endpoint",
            ("RLTRACE_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
            str,
            None,
            "Also send spans to this OpenTelemetry backend (OTLP over HTTP).",
        ),
        Param("service_name", ("OTEL_SERVICE_NAME",), str, None, "OTel service.name (default: rltrace-<role>)."),
        Param("model", ("RLTRACE_MODEL",), str, None,
              "The model's Hugging Face config.json (or its directory), stored with the run for its cache geometry."),
        Param(
            "merge_parts",
            ("RLTRACE_MERGE_PARTS",),
            _parse_bool,
            True,
            "Each process merges its own small part files in the background and at exit (off: they stay "
            "as written until `rltrace compact`).",
        ),
        Param(
            "store_summaries",
            ("RLTRACE_STORE_SUMMARIES",),
            _parse_bool,
            True,
            "The last writer of a large local run has what the run's first report computes stored in the run "
            "as it exits (reports on any machine start from it).",
        ),
        Param(
            "merge_grace",
            ("RLTRACE_MERGE_GRACE",),
            _parse_seconds,
            5.0,
            "Seconds a part replaced by a merged one stays on disk for readers that listed it (at exit, at most 1).",
        ),
        # --- runs in object storage (rltrace.store.objstore; see docs/store.md) ----------------
        Param(
            "spool_dir",
            ("RLTRACE_SPOOL_DIR",),
            str,
            None,
            "Local folder keeping parts of an s3:// run until uploaded (default: ~/.cache/rltrace/spool).",
        ),
        Param(
            "spool_max_mb",
            ("RLTRACE_SPOOL_MAX_MB",),
            _parse_positive_float,
            4096.0,
            "Spool size (MB) while the object store is unreachable; beyond it the oldest parts are dropped and counted.",
        ),
        Param(
            "cache_dir",
            ("RLTRACE_CACHE_DIR",),
            str,
            None,
            "Local folder where readers keep copies of s3:// runs' parts (default: ~/.cache/rltrace/runs).",
        ),
        Param(
            "summary_cache_dir",
            ("RLTRACE_SUMMARY_CACHE_DIR",),
            str,
            None,
            "Local folder where reports keep the per-step summaries they computed, so the next report on "
            "the same run computes only new or changed steps (default: ~/.cache/rltrace/summaries).",
        ),
        Param(
            "replay_budget_mb",
            ("RLTRACE_REPLAY_BUDGET_MB",),
            _parse_positive_float,
            2048.0,
            "Disk for frozen batches per run (MB); beyond it freezes are skipped and counted.",
        ),
        Param(
            "replay_queue",
            ("RLTRACE_REPLAY_QUEUE",),
            _parse_positive_int,
            2,
            "Frozen batches waiting for the writer thread; beyond this new freezes are skipped and counted.",
        ),
        Param(
            "freeze_every",
            ("RLTRACE_FREEZE_EVERY",),
            _parse_positive_int,
            None,
            "Framework integrations (TRL) freeze the trained batch every N steps for debug replay.",
        ),
        # --- profiling (rltrace.profiling; see docs/profiling.md) --------------------------------
        Param(
            "profile_slow",
            ("RLTRACE_PROFILE_SLOW",),
            _parse_positive_float,
            None,
            "Record a py-spy profile of any phase running longer than this many times its rolling median.",
        ),
        Param(
            "profile_after",
            ("RLTRACE_PROFILE_AFTER",),
            _parse_thresholds,
            None,
            "Record a py-spy profile of any phase running longer than SECONDS, or per phase: 'reward=2,train=30'.",
        ),
        Param(
            "hang_timeout",
            ("RLTRACE_HANG_TIMEOUT",),
            _parse_positive_float,
            None,
            "Dump the stacks of this process and its children (py-spy dump) when a phase stays open this long (s).",
        ),
        Param(
            "stacks",
            ("RLTRACE_STACKS",),
            _parse_bool,
            True,
            "Answer `rltrace stacks` and dump every thread's Python stack when open work passes the hang limit.",
        ),
        Param(
            "stacks_after",
            ("RLTRACE_STACKS_AFTER",),
            _parse_positive_float,
            None,
            "Dump every thread's stack once when a thread's innermost phase stays open this long (s; default "
            "RLTRACE_HANG_TIMEOUT, else 300).",
        ),
        Param(
            "torch_profile",
            ("RLTRACE_TORCH_PROFILE",),
            _parse_windows,
            None,
            "torch.profiler windows: 'train:5-7' traces each train phase of steps 5..7; several separated by commas.",
        ),
        Param(
            "profile_phases",
            ("RLTRACE_PROFILE_PHASES",),
            _parse_names,
            None,
            "Only these phases (comma-separated) trigger the slow and absolute rules (default: every phase).",
        ),
        Param(
            "profile_min_samples",
            ("RLTRACE_PROFILE_MIN_SAMPLES",),
            _parse_positive_int,
            5,
            "Finished runs of a phase needed before its rolling median is trusted by RLTRACE_PROFILE_SLOW.",
        ),
        Param(
            "profile_min_seconds",
            ("RLTRACE_PROFILE_MIN_SECONDS",),
            _parse_positive_float,
            0.5,
            "A phase is never 'slow' before running this long (py-spy needs ~0.1 s to attach).",
        ),
        Param(
            "profile_max_seconds",
            ("RLTRACE_PROFILE_MAX_SECONDS",),
            _parse_positive_float,
            30.0,
            "Longest py-spy recording; it stops earlier when the phase ends.",
        ),
        Param(
            "profile_max_count",
            ("RLTRACE_PROFILE_MAX",),
            _parse_positive_int,
            20,
            "Most profiles (recordings, dumps, torch windows) one process takes; bounds disk use.",
        ),
        Param("pyspy", ("RLTRACE_PYSPY",), str, None, "The py-spy executable (default: on PATH, else beside python)."),
        Param("pyspy_rate", ("RLTRACE_PYSPY_RATE",), _parse_positive_int, 100, "py-spy samples per second."),
        Param(
            "pyspy_flags",
            ("RLTRACE_PYSPY_FLAGS",),
            _parse_names,
            (),
            "Extra py-spy record options, comma-separated: subprocesses, native (idle threads are always sampled).",
        ),
        Param(
            "torch_rank0_only",
            ("RLTRACE_TORCH_RANK0_ONLY",),
            _parse_bool,
            False,
            "Take torch.profiler windows on rank 0 only (traces are large; one rank is usually enough).",
        ),
        # --- resource sampling (rltrace.resources; see docs/store.md) --------------------------------
        Param(
            "resources",
            ("RLTRACE_RESOURCES",),
            _parse_bool,
            False,
            "Sample this process's CPU and memory, and its NVIDIA GPUs' utilisation, memory and power, into `resources`.",
        ),
        Param(
            "resources_interval",
            ("RLTRACE_RESOURCES_INTERVAL",),
            _parse_positive_float,
            1.0,
            "Seconds between resource samples (default 1: one sample per second).",
        ),
        # --- the dashboard (rltrace.ui; see docs/ui.md) ----------------------------------------------
        Param(
            "ui_runs",
            ("RLTRACE_UI_RUNS",),
            _parse_paths,
            None,
            "Run directories the dashboard shows, as a JSON list (set by `rltrace ui`); a plain value is one run dir.",
        ),
        Param(
            "ui_skip_corrupt",
            ("RLTRACE_UI_SKIP_CORRUPT",),
            _parse_bool,
            False,
            "Dashboard: skip damaged part files, naming each, instead of showing an error (`rltrace ui --skip-corrupt`).",
        ),
        Param(
            "ui_serving",
            ("RLTRACE_UI_SERVING",),
            _parse_object,
            None,
            "Dashboard: the serving options (`rltrace ui --model --kv-dtype --ssm-dtype --kv-bandwidth`), a JSON object "
            "set by `rltrace ui`; the Engine page starts from them.",
        ),
    )
}

#: Settings that arm the profiling watchdog; `init` imports rltrace.profiling only if one is set.
PROFILE_TRIGGERS = ("profile_slow", "profile_after", "hang_timeout", "torch_profile")


def env_sets_any(names: tuple[str, ...]) -> bool:
    """Whether an environment variable of one of these settings is set (to a non-empty value)."""
    return any(os.environ.get(var) for name in names for var in PARAMS[name].env)


def resolve(name: str, value: Any = None) -> Any:
    """The value of setting `name`: `value` if given, else its environment variable, else its default.

    A keyword value gets the same checks as its environment variable (`max_pending_rows=0` is
    an error, not a run that drops every row).
    """
    param = PARAMS[name]
    if value is not None:
        return _checked(name, param, value)
    for var in param.env:
        text = os.environ.get(var)
        if text is None or (text == "" and param.parse is not _parse_bool):
            continue
        try:
            return param.parse(text)
        except ValueError as exc:
            raise RltraceConfigError(f"environment variable {var}={text!r} is invalid: {exc} ({param.doc})") from None
    return param.default


_NUMERIC = (_parse_positive_float, _parse_seconds, _parse_interval, _parse_positive_int, _parse_rank, _parse_bool)


def _checked(name: str, param: Param, value: Any) -> Any:
    if param.parse not in _NUMERIC:
        return value
    if param.parse is _parse_bool:
        if isinstance(value, (bool, int)) and value in (0, 1):
            return bool(value)
        text = value if isinstance(value, str) else None
    elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
        item = getattr(value, "item", None)  # numpy scalars
        text = str(item()) if item is not None and not isinstance(value, bool) else None
    else:
        text = str(value)
    try:
        if text is None:
            raise ValueError(f"expected a number, got {type(value).__name__}")
        return param.parse(text)
    except ValueError as exc:
        raise RltraceConfigError(f"{name}={value!r} is invalid: {exc} ({param.doc})") from None


def is_set(name: str, value: Any = None) -> bool:
    """Whether setting `name` was chosen (passed, or set by its environment variable) rather than defaulted."""
    return value is not None or any(os.environ.get(var) for var in PARAMS[name].env)


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a backend address: `/v1/traces` is appended unless present."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
