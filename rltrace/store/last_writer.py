"""The last writer of a local run to exit hands the run to a process that stores what the run's
first report computes (`rltrace.analysis.stored`), so reports on any machine start from it.

Only where it pays: a run of at least `MIN_BYTES` of spans (below that a report computes it in well
under a second). "Last" is decided under one lock, `.writers/report_cache.mutex`: a writer that
finds another writer's lock held leaves it to that one. The lock goes to the storing process, which
runs on after the writer exits (its exit is not delayed) and holds it until it is done (`wait`).
Whatever fails costs only the stored files: the first report then computes them, as before.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from rltrace import _names

logger = logging.getLogger("rltrace")
MIN_BYTES = 4 << 20  # spans/ this large or more (~100k-400k spans as writers leave them)
MUTEX = "report_cache.mutex"
_TRY_S = 2.0  # another leaving writer holds the mutex while it checks (ms); a storing process, for long


def _others_alive(run_dir: Path) -> bool:
    from rltrace.store.merge import lock_state

    return any(lock_state(run_dir, p.name[: -len(".lock")]) == "held" for p in (run_dir / _names.WRITERS).glob("*.lock"))


def _span_bytes(run_dir: Path) -> int:
    try:
        with os.scandir(run_dir / _names.SPANS.folder) as entries:
            return sum(e.stat().st_size for e in entries if e.name.endswith(".parquet") and not e.name.startswith("."))
    except OSError:
        return 0


def _take(handle, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def at_exit(run_dir: Path) -> subprocess.Popen | None:
    """If this is the last writer of a large enough run, start the process that stores the report's
    summaries in it (returned); None otherwise. Never raises."""
    from rltrace._config import resolve

    run_dir = Path(run_dir)
    try:
        if not resolve("store_summaries") or _span_bytes(run_dir) < MIN_BYTES:
            return None
        (run_dir / _names.WRITERS).mkdir(parents=True, exist_ok=True)
        with open(run_dir / _names.WRITERS / MUTEX, "a") as handle:
            # held by a storing process: it started after every other writer had left, so it has
            # this writer's spans too
            if not _take(handle, _TRY_S) or _others_alive(run_dir):
                return None
            return subprocess.Popen([sys.executable, "-m", "rltrace.analysis.stored", str(run_dir), str(handle.fileno())],
                                    pass_fds=(handle.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    start_new_session=True)  # the lock goes with it; ours closes here
    except Exception as exc:  # never into the exit path
        logger.warning("rltrace: the run's summaries were not stored (%s: %s); the first report computes them",
                       type(exc).__name__, exc)
        return None


def wait(run_dir: Path, timeout: float = 600.0) -> bool:
    """Wait until no process is storing the run's summaries; False on timeout."""
    try:
        handle = open(Path(run_dir) / _names.WRITERS / MUTEX, "a")
    except OSError:
        return True
    with handle:
        return _take(handle, timeout)
