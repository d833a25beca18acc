"""Every setting of `rltrace.init`, declared once: its environment variables, type, default and meaning.

A value resolves as: keyword argument > first environment variable set > default. A malformed
value raises `RltraceConfigError` naming the variable, so a typo in a launch script fails at
start instead of silently recording nothing. Imports nothing from rltrace.
"""

from __future__ import annotations

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


def _parse_positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {text!r}")
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
            _parse_positive_float,
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
        Param(
            "ui_runs",
            ("RLTRACE_UI_RUNS",),
            str,
            None,
            "Run directories the dashboard shows, separated by os.pathsep (set by `rltrace ui`).",
        ),
    )
}


def resolve(name: str, value: Any = None) -> Any:
    """The value of setting `name`: `value` if given, else its environment variable, else its default."""
    param = PARAMS[name]
    if value is not None:
        return value
    for var in param.env:
        text = os.environ.get(var)
        if text is None or (text == "" and param.parse is not _parse_bool):
            continue
        try:
            return param.parse(text)
        except ValueError as exc:
            raise RltraceConfigError(f"environment variable {var}={text!r} is invalid: {exc} ({param.doc})") from None
    return param.default


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a backend address: `/v1/traces` is appended unless present."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
