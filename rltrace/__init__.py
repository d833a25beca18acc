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

from rltrace.api import (  # noqa: E402
    Phase,
    attach,
    current_run,
    flush,
    init,
    inject,
    log_metrics,
    log_samples,
    phase,
    shutdown,
)
from rltrace.run import Run  # noqa: E402

__all__ = [
    "Run",
    "Phase",
    "init",
    "phase",
    "log_metrics",
    "log_samples",
    "inject",
    "attach",
    "flush",
    "shutdown",
    "current_run",
]
