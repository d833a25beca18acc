"""rltrace: observability for RL post-training.

Record every rollout, reward, train and weight-sync phase of every process as an OpenTelemetry
span, with step metrics and per-sample facts, into one local Parquet store that DuckDB reads:

    import rltrace
    rltrace.init("runs/exp1", role="trainer", config=cfg)
    with rltrace.phase("rollout", step=step, weight_version=version):
        ...
    rltrace.log_metrics(step, reward_mean=r, loss=loss)

Then `rltrace info runs/exp1`, `rltrace.store.open("runs/exp1")` for SQL, and the docs/ folder.
"""

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

import importlib  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

# The API loads on first use (PEP 562), so `import rltrace.integrations` stays cheap: `rltrace run`
# imports it at the start of every Python process of a command, most of which record nothing.
_API = ("Phase", "PhaseHandle", "attach", "current_run", "flush", "init", "inject", "log_metrics", "log_samples",
        "phase", "shutdown", "start_phase")

if TYPE_CHECKING:
    from rltrace.api import (
        Phase,
        PhaseHandle,
        attach,
        current_run,
        flush,
        init,
        inject,
        log_metrics,
        log_samples,
        phase,
        shutdown,
        start_phase,
    )
    from rltrace.run import Run

__all__ = [
    "Run",
    "Phase",
    "PhaseHandle",
    "init",
    "phase",
    "start_phase",
    "log_metrics",
    "log_samples",
    "inject",
    "attach",
    "flush",
    "shutdown",
    "current_run",
]


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module("rltrace.api"), name)
    elif name == "Run":
        value = importlib.import_module("rltrace.run").Run
    else:
        try:
            value = importlib.import_module(f"rltrace.{name}")  # rltrace.store etc. without importing it first
        except ModuleNotFoundError as exc:
            if exc.name != f"rltrace.{name}":
                raise
            raise AttributeError(f"module 'rltrace' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
