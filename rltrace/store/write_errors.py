"""Errors of the write path, said once per kind and counted: shared by the writer and its merger
(a full or read-only disk fails both at once), below both so neither imports the other."""

from __future__ import annotations

import collections
import logging
import threading
import time

logger = logging.getLogger("rltrace")


class WriteErrors:
    """Errors of the write path (a full or read-only disk fails every write at once): each kind
    (what failed, the error's type) said in one line, no traceback, and again at most every
    `every` seconds with how many there were since; all of them counted in `counts`."""

    def __init__(self, every: float = 60.0):
        self.every = every
        self.counts: collections.Counter = collections.Counter()
        self._said: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (said at, count then)
        self._lock = threading.Lock()

    def __call__(self, what: str, exc: BaseException, detail: str = "") -> None:
        key = (what, type(exc).__name__)
        now = time.monotonic()
        with self._lock:
            self.counts[key] += 1
            said = self._said.get(key)
            if said is not None and now - said[0] < self.every:
                return
            since = self.counts[key] - (said[1] if said else 0) - 1
            self._said[key] = (now, self.counts[key])
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        more = f" ({since} more like it since)" if since > 0 else ""
        logger.warning("rltrace: %s failed (%s%s)%s%s; rltrace goes on, the same error is counted, not repeated",
                       what, type(exc).__name__, f": {text}" if text else "", f"; {detail}" if detail else "", more)

    def records(self) -> list[dict]:
        """The counts as `drop_reasons` records (table "write errors"): `rltrace info` lists them."""
        with self._lock:
            return [{"table": "write errors", "column": None, "reason": f"{what} failed ({kind})", "count": n}
                    for (what, kind), n in self.counts.items()]

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self._said.clear()


errors = WriteErrors()  # this process's: every writer of the process says each kind once
