"""Hand-built runs with exact timestamps, written through the real store writer.

For tests of analyses (rltrace's and yours): every span, sample and metric lands in real Parquet
parts in the store schemas, so `rltrace.store.open` reads them like a recorded run.

    run = RunBuilder(tmp_path / "run")
    trainer = run.process("trainer")
    root = trainer.span("train", 2.0, 5.0, step=1)
    trainer.span("forward", 2.0, 3.0, step=1, parent=root)
    trainer.span("wait", 5.0, None, step=2)            # end=None: an open span (a hang)
    run.samples(1, [{"sample_id": 0, "gen_start": 0.0, "gen_end": 1.5}])
    run.metric(1, "reward_mean", 0.4)
    run.write()

Times are seconds after `t0` (default 1.7e9 Unix seconds); they become exact nanoseconds, and
`gen_start`/`gen_end` become Unix seconds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rltrace import _names
from rltrace.store import layout
from rltrace.store import rows as store_rows
from rltrace._names import safe_name
from rltrace.store.parts import write_part

T0_NS = 1_700_000_000 * 10**9


@dataclass
class Span:
    span_id: str
    trace_id: str
    process: "Process"


def _ns(t0_ns: int, seconds: float | None) -> int | None:
    return None if seconds is None else t0_ns + round(seconds * 1e9)


@dataclass
class Process:
    """One process of a hand-built run; `span()` records a span on it."""

    run: "RunBuilder"
    process_id: str
    role: str
    rank: int | None
    host: str
    pid: int
    spans: list[dict] = field(default_factory=list)
    dropped: int = 0
    started: float = 0.0
    ended: float | None = None

    def span(
        self,
        phase: str,
        start: float,
        end: float | None,
        *,
        step: int | None = None,
        parent: Span | None = None,
        thread: int = 1,
        name: str | None = None,
        weight_version: int | None = None,
        status: str = "UNSET",
        **attrs: Any,
    ) -> Span:
        """A span from `start` to `end` seconds (`end=None`: still open). `attrs` become `rl.<key>`."""
        run = self.run
        span_id = f"{next(run._ids):016x}"
        trace_id = parent.trace_id if parent is not None else f"{next(run._ids):032x}"
        self.spans.append(
            store_rows.span_row(
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=parent.span_id if parent is not None else None,
                name=name or phase,
                phase=phase,
                step=step,
                weight_version=weight_version,
                start_ns=_ns(run.t0_ns, start),
                end_ns=_ns(run.t0_ns, end),
                status=status,
                thread_id=thread,
                thread_name="MainThread" if thread == 1 else f"worker-{thread}",
                attributes={_names.attr_key(k): v for k, v in attrs.items()},
            )
        )
        return Span(span_id, trace_id, self)


class RunBuilder:
    """Builds a run directory: `process()`, spans on processes, `samples()`, `metric()`, `write()`."""

    def __init__(self, run_dir: str | Path, *, t0_ns: int = T0_NS, name: str = "handbuilt"):
        self.run_dir = Path(run_dir)
        self.t0_ns = t0_ns
        self.manifest = layout.create_or_join(self.run_dir, run_name=name, config={})
        self.processes: list[Process] = []
        self._samples: list[pa.Table] = []
        self._metrics: list[pa.Table] = []
        self._resources: list[dict] = []
        self._ids = itertools.count(1)
        self._parts = itertools.count()

    def process(self, role: str, rank: int | None = 0, *, host: str = "node0", dropped: int = 0,
                started: float = 0.0, ended: float | None = None) -> Process:
        """A process of the run; `started`/`ended`: seconds after t0 its `rltrace.init` ran and it
        shut down (None: still running, or killed)."""
        pid = 1000 + len(self.processes)
        process_id = f"{safe_name(role)}{'' if rank is None else rank}-{safe_name(host)}-{pid}"
        proc = Process(self, process_id, role, rank, host, pid, dropped=dropped, started=started, ended=ended)
        self.processes.append(proc)
        return proc

    def samples(self, step: int, rows: list[dict], *, process: Process | None = None) -> None:
        """Per-sample rows; `gen_start`/`gen_end` are seconds after t0 here, Unix seconds once stored."""
        proc = process or self.processes[0]
        shifted = []
        for row in rows:
            row = dict(row)
            for key in ("gen_start", "gen_end"):
                if row.get(key) is not None:
                    row[key] = self.t0_ns / 1e9 + row[key]
            shifted.append(row)
        table = store_rows.samples_table(step, shifted, self.t0_ns, proc)
        if table is not None:
            self._samples.append(table)

    def metric(self, step: int, name: str, value: float, *, time: float = 0.0, process: Process | None = None) -> None:
        proc = process or self.processes[0]
        self._metrics.append(store_rows.metrics_table(step, {name: float(value)}, _ns(self.t0_ns, time), proc))

    def resource(self, time: float, process: Process, *, kind: str = "gpu", interval: float = 1.0, **values: Any) -> None:
        """A `resources` row sampled at `time` seconds over the `interval` before it (util_pct, device, ...)."""
        self._resources.append({"time_ns": _ns(self.t0_ns, time), "interval_s": interval, "kind": kind, **values,
                                **store_rows.who(process)})

    def write(self, *, parts_per_process: int = 1) -> Path:
        """Write everything recorded since the last `write()` as parts; returns the run dir."""
        for proc in self.processes:
            finished = [s for s in proc.spans if s["end_ns"] is not None]
            still_open = [s for s in proc.spans if s["end_ns"] is None]
            chunk = max(1, -(-len(finished) // parts_per_process))
            service = f"rltrace-{proc.role}"
            for i in range(0, len(finished), chunk):
                table = store_rows.span_rows_table(finished[i : i + chunk], proc, service)
                write_part(self.run_dir / _names.SPANS.folder, self._name(proc), table, _names.SPANS)
            if still_open:
                table = store_rows.span_rows_table(still_open, proc, service)
                write_part(self.run_dir / _names.OPEN_SPANS.folder, f"{proc.process_id}.parquet", table, _names.OPEN_SPANS)
            self._write_process_row(proc)
            proc.spans = []
        if self._samples:
            table = store_rows.concat(self._samples)
            write_part(self.run_dir / _names.SAMPLES.folder, self._name(self.processes[0]), table, _names.SAMPLES)
            self._samples = []
        if self._metrics:
            table = store_rows.concat(self._metrics)
            write_part(self.run_dir / _names.METRICS_TABLE.folder, self._name(self.processes[0]), table, _names.METRICS_TABLE)
            self._metrics = []
        if self._resources:
            table = pa.Table.from_pylist(self._resources, schema=_names.RESOURCES_SCHEMA)
            write_part(self.run_dir / _names.RESOURCES.folder, self._name(self.processes[0]), table, _names.RESOURCES)
            self._resources = []
        return self.run_dir

    def _name(self, proc: Process) -> str:
        return f"{proc.process_id}-{next(self._parts):08d}.parquet"

    def _write_process_row(self, proc: Process) -> None:
        table = store_rows.process_table(
            proc,
            run_id=self.manifest["run_id"],
            service_name=f"rltrace-{proc.role}",
            started_ns=_ns(self.t0_ns, proc.started),
            heartbeat_ns=_ns(self.t0_ns, proc.started if proc.ended is None else proc.ended),
            ended_ns=_ns(self.t0_ns, proc.ended),
            spans_written=len(proc.spans),
            spans_dropped=proc.dropped,
            rltrace_version="test",
            resource={"service.name": f"rltrace-{proc.role}", _names.ROLE: proc.role},
        )
        write_part(self.run_dir / _names.PROCESSES.folder, f"{proc.process_id}.parquet", table, _names.PROCESSES)
