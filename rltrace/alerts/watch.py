"""The watcher: evaluate the rules on a fresh snapshot of the run, store and send what is new.

An alert is raised once per key: keys already in the run's `alerts` table are not raised
again, so a watcher restarted (or run from cron with `--once`) does not repeat itself.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import socket
import time
import uuid
from pathlib import Path

import pyarrow as pa

from rltrace import _names, store
from rltrace.alerts.deliver import Delivery
from rltrace.alerts.rules import Alert, Settings, evaluate
from rltrace._names import safe_name
from rltrace.store.parts import write_part

logger = logging.getLogger("rltrace")


def as_row(alert: Alert, time_ns: int) -> dict:
    row = {f.name: getattr(alert, f.name) for f in dataclasses.fields(alert) if f.name != "extra"}
    return {**row, "alert_id": uuid.uuid4().hex[:16], "time_ns": time_ns}


class Watcher:
    """Checks one run; `check()` returns (every alert holding now, the ones raised for the first time)."""

    def __init__(self, run_dir: str | Path, settings: Settings = Settings(), delivery: Delivery | None = None, *,
                 skip_corrupt: bool = False, stacks_wait: float = 5.0):
        self.run_dir = Path(run_dir)
        self.skip_corrupt = skip_corrupt  # else a damaged part is a CorruptPartError naming it
        self.stacks_wait = stacks_wait  # on a new hang: ask every live process for its stacks, wait this long (0: never)
        self.settings = settings
        self.delivery = delivery or Delivery()
        self.store_failures = 0
        self._known: set[str] = set()
        self.last_firing: list[Alert] = []
        self.run_ended = False  # every process that wrote has ended cleanly
        self._seq = itertools.count()
        self._name = f"watch-{safe_name(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def check(self, now_ns: int | None = None) -> tuple[list[Alert], list[dict]]:
        now_ns = time.time_ns() if now_ns is None else now_ns
        firing = store.skipping_damaged(self.run_dir, self.skip_corrupt, lambda: self._evaluate(now_ns))
        if self.stacks_wait > 0 and any(a.rule == "hang" and a.key not in self._known and "edge" not in a.extra
                                        for a in firing):
            if self._ask_stacks():  # the edge of each hang, named from the stacks the processes wrote
                firing = store.skipping_damaged(self.run_dir, self.skip_corrupt, lambda: self._evaluate(now_ns))
        self.last_firing = firing
        new = [as_row(a, now_ns) for a in firing if a.key not in self._known]
        if new:
            self._store(new)
            self._known.update(r["key"] for r in new)
            for row in new:
                self.delivery.send(row)
        return firing, new

    def _ask_stacks(self) -> bool:
        """Ask the run's live processes for their stacks (`rltrace.stacks`); False if it could not."""
        from rltrace.stacks import capture

        try:
            _, answered, _ = capture.ask_and_wait(self.run_dir, timeout=self.stacks_wait)
        except Exception as exc:  # a read-only run dir: the alert goes out without the edge
            logger.warning("rltrace watch: could not ask the processes for their stacks: %s", exc)
            return False
        return bool(answered)

    def _evaluate(self, now_ns: int) -> list[Alert]:
        con = store.open(self.run_dir, skip_corrupt=self.skip_corrupt)
        try:
            self._known.update(k for (k,) in con.execute("SELECT DISTINCT key FROM alerts").fetchall())
            firing = evaluate(con, self.settings, now_ns)
            ended = con.execute("SELECT count(*), count(*) FILTER (ended) FROM (SELECT bool_or(ended_ns IS NOT NULL) AS "
                                "ended FROM processes GROUP BY process_id)").fetchall()[0]
            self.run_ended = bool(ended[0]) and ended[0] == ended[1]
        finally:
            con.close()
        return firing

    def _store(self, rows: list[dict]) -> None:
        try:
            table = pa.Table.from_pylist(rows, schema=_names.ALERTS_SCHEMA)
            write_part(self.run_dir / _names.ALERTS.folder, f"{self._name}-{next(self._seq):08d}.parquet", table,
                       _names.ALERTS)
        except Exception as exc:  # a read-only run dir: the alerts still print and go out
            self.store_failures += len(rows)
            logger.warning("rltrace watch: could not store %d alert(s): %s", len(rows), exc)
