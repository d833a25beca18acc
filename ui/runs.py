"""Which runs the dashboard shows, and one shared read-only connection per snapshot of each.

A run is identified to the caches by `RunRef(path, version)`: `version` is a fingerprint of the
run's files (part names, sizes, modification times). A session pins the version it shows, so
widgets stay fast; the sidebar's live watcher (or the Reload button) moves it forward when the
files change, which gives new cache keys and a fresh connection.

Connections are DuckDB in-memory databases over the Parquet parts (`rltrace.store.connect`):
nothing is ever written to the run dir. The analyses keep per-connection caches in temporary
tables, which a cursor would not share, so each connection is used by one query at a time under
its own lock instead of one cursor per query.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import duckdb
import streamlit as st

from rltrace import _names, store
from rltrace.store import objstore
from rltrace._config import resolve

CONNECTIONS_KEPT = 16  # snapshots held open at once (old versions of live runs fall out first)


@dataclass(frozen=True)
class RunRef:
    """A run at one version of its files: the key of every cached query."""

    path: str
    version: str

    @property
    def name(self) -> str:
        return Path(self.path).name


def run_dirs() -> list[str]:
    """The run directories given to `rltrace ui` (RLTRACE_UI_RUNS), else RLTRACE_RUN_DIR."""
    listed = resolve("ui_runs")
    if listed:
        return list(listed)
    single = resolve("run_dir")
    return [single] if single else []


def fingerprint(path: str) -> str:
    """Changes whenever a part is added, replaced or removed, or the manifest changes."""
    h = hashlib.blake2b(digest_size=8)
    root = objstore.mirror(path) if objstore.is_uri(path) else Path(path)
    folders = sorted({t.folder for t in _names.TABLES.values()})
    for folder in ["."] + folders:
        try:
            entries = sorted(os.scandir(root / folder), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            h.update(f"{folder}/{entry.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()


@dataclass
class _Handle:
    con: duckdb.DuckDBPyConnection
    lock: threading.Lock
    skipped: list[str]


@st.cache_resource(max_entries=CONNECTIONS_KEPT, show_spinner=False)
def _handle(path: str, version: str, skip: bool) -> _Handle:
    snap = store.scan(path, skip_corrupt=skip)
    return _Handle(store.connect(snap), threading.Lock(), list(snap.skipped))


def skip_corrupt() -> bool:
    """`rltrace ui --skip-corrupt`: damaged parts are left out and named; else each is an error."""
    return bool(resolve("ui_skip_corrupt"))


@contextlib.contextmanager
def connection(run: RunRef) -> Iterator[duckdb.DuckDBPyConnection]:
    """The run's snapshot connection, held for one query (or one analysis) at a time."""
    handle = _handle(run.path, run.version, skip_corrupt())
    with handle.lock:
        yield handle.con


def skipped_parts(run: RunRef) -> list[str]:
    """Parts of this snapshot left out as unreadable ("path: why")."""
    return _handle(run.path, run.version, skip_corrupt()).skipped


def forget(run: RunRef) -> None:
    """Drop a snapshot whose files vanished (a compaction removed replaced parts)."""
    _handle.clear(run.path, run.version, skip_corrupt())
