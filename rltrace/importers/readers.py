"""Scalar logs into one long table (step, name, value, logged time): which reader reads which file.

TensorBoard event files: `rltrace.importers.events`; JSONL and CSV: `rltrace.importers.textlogs`;
the table they return: `rltrace.importers.scalars.Scalars`. Every reader keeps what it can read
and counts what it cannot (a line, record or value) in `Scalars.refused`, with file, position and
reason; a file that is not a metric log at all is a `MetricsImportError` naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rltrace import _paths
from rltrace.importers import events, textlogs
from rltrace.importers.scalars import MetricsImportError, Scalars

__all__ = ["MetricsImportError", "Scalars", "find_logs", "read"]


def find_logs(paths) -> list[Path]:
    """Event files (searched recursively in folders), .jsonl/.json and .csv files named or found."""
    # in a folder, a .json is more often a config than a log: name it to import it
    return _paths.expand(paths, lambda x: bool(_kind(x)) and x.suffix != ".json", MetricsImportError,
                         "no TensorBoard event files (*tfevents*), .jsonl or .csv files")


def _kind(path: Path) -> str | None:
    if "tfevents" in path.name:
        return "tensorboard"
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if path.suffix == ".csv":
        return "csv"
    return None


def read(path: Path, progress: Callable[[int], None] | None = None) -> Scalars:
    """The scalars of one log file (its kind from its name, else from its first bytes)."""
    kind = _kind(path)
    if kind is None:
        kind = "tensorboard" if events.looks_like_tfrecord(path) else None
    if kind == "tensorboard":
        return events.read_events(path, progress)
    if kind == "jsonl":
        return textlogs.read_jsonl(path, progress)
    if kind == "csv":
        return textlogs.read_csv(path, progress)
    raise MetricsImportError(f"{path}: not a TensorBoard event file, .jsonl or .csv metrics log")
