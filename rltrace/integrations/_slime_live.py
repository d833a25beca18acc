"""slime's per-sample trace events, as slime appends them, into the rows `rltrace import slime` writes.

The importer (rltrace.replay.slime_trace) reads a whole rollout's traces after the fact; here each
span becomes its `spans` row the moment slime appends its `span_end` event, built by the importer's
own functions (`started`, `ended`, `unmatched_end`, `point`, `version_of`, `lane`, `finish`), so
both ways give the same row. What the importer learns from the whole dump is kept as it happens:

- **Step**: the rollout in progress when the span ended (the importer: the rollout whose own work
  had started by then); a span that began before the previous steps' work ended is cut at those
  ends (`cut_at_windows`, with the ends of the spans recorded so far per step), as the importer
  cuts it with the ends it reads from the dumps.
- **Weight version** of an engine call: the `weight_version` of SGLang's answer, seen when slime
  turns it into trace attributes (`build_sglang_meta_trace_attrs`); other spans use the calls
  already ended, like the importer.
- **Group spans**: slime writes one copy per sample of the group, in the group's order; the first
  copy is recorded, the others' children point to it. The order also gives each sample its lane.

Samples are recorded when the rollout function returns, by the importer's `rollout_rows` on
`Sample.to_dict()`, the dict slime dumps. Everything here runs on slime's event loop: it builds
dicts and queues them; the run's writer thread makes the Parquet parts.
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from typing import Any

from rltrace import _names
from rltrace.replay import slime_trace as st

logger = logging.getLogger("rltrace")
IDLE_ROLLOUTS = 8  # a trace with no event for this many rollouts is forgotten (a sample slime dropped)


class _Trace:
    """What is known so far of one sample's trace carrier."""

    __slots__ = ("spans", "dated", "first", "place", "pending", "orphans", "unmatched", "seen")

    def __init__(self, rollout: int | None):
        self.spans: dict[str, dict] = {}  # rltrace span id -> the importer's span dict
        self.dated: list[tuple[int, int, int]] = []  # (start, end, version) of the engine calls ended
        self.first: str | None = None  # the first span: where events of unknown parent go
        self.place = 0  # place in its group
        self.pending: dict[str, list[dict]] = {}  # point events waiting for their span to end
        self.orphans: list[dict] = []
        self.unmatched = 0
        self.seen = rollout


class Live:
    """The state of the live hook in one process: the rollout in progress and the open traces."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rollout: int | None = None  # the rollout in progress
        self.last: int | None = None  # the latest rollout id seen (timers after a rollout)
        self.starts: dict[int, int | None] = {}  # when each rollout's own work began (importer's `own_start`)
        self.ends: dict[int, int] = {}  # when each step's recorded work ended so far (importer's `step_ends`)
        self.traces: dict[str, _Trace] = {}
        # group span (name, group, start) -> (first copy, copies, the other copies' ids, rollout opened in)
        self.groups: dict[tuple, tuple[str, int, list[str], int | None]] = {}
        self.alias: dict[str, str] = {}  # other copies of a group span -> the first
        self.evaluating = False  # an evaluation rollout is running: its traces are not recorded
        self.faults = 0
        self.run = None  # the run the spans go to, and its span writer (set by the instrumentor)
        self.emit = None

    # --- trace events ------------------------------------------------------------------------
    def on_event(self, carrier: dict, event: dict) -> None:
        """One event slime appended to a sample's trace carrier (`trace_utils._append_event`)."""
        kind = event.get("type")
        if kind not in ("span_start", "span_end", "event") or st.ns(event.get("ts")) is None:
            raise ValueError(f"slime trace event of type {kind!r} at {event.get('ts')!r} is not a timed span or event")
        key = str(carrier.get("trace_id"))
        with self.lock:
            trace = self.traces.get(key)
            if trace is None:
                trace = self.traces[key] = _Trace(self.rollout)
            trace.seen = self.rollout if self.rollout is not None else trace.seen
            span_id = st.span_id(event.get("span_id"))
            if kind == "span_start" and span_id:
                span = trace.spans[span_id] = st.started(carrier, event)
                self._first(trace, span_id)
                if span["name"] in st.GROUP_SPANS:
                    self._group_copy(trace, span, carrier)
            elif kind == "span_end" and span_id in trace.spans and trace.spans[span_id]["end_ns"] is None:
                span = trace.spans[span_id]
                st.ended(span, event)
                self._emit(trace, span, carrier)
            elif kind == "span_end":
                trace.unmatched += 1
                span = st.unmatched_end(carrier, event, trace.unmatched)
                trace.spans[span["span_id"]] = span
                self._first(trace, span["span_id"])
                self._emit(trace, span, carrier)
            else:
                self._point(trace, event)

    @staticmethod
    def _first(trace: _Trace, span_id: str) -> None:
        if trace.first is None:
            trace.first = span_id
            if trace.orphans:
                trace.pending[span_id] = trace.orphans
                trace.orphans = []

    def _point(self, trace: _Trace, event: dict) -> None:
        """A point event joins its span when that ends; one whose span is not in this trace joins the first span."""
        parent = st.span_id(event.get("parent_span_id"))
        if parent not in trace.spans:
            parent = None
            if trace.first is None:
                trace.orphans.append(st.point(event))
                return
        target = parent or trace.first
        if trace.spans[target]["end_ns"] is not None:
            raise ValueError(f"a slime trace event came after the span it belongs to had ended ({event.get('name')!r})")
        trace.pending.setdefault(target, []).append(st.point(event))

    def _group_copy(self, trace: _Trace, span: dict, carrier: dict) -> None:
        """slime opens a group span once per sample of the group, in the group's order, at one time."""
        key = (span["name"], carrier.get("group_id"), span["start_ns"])
        first = self.groups.get(key)
        if first is None:
            self.groups[key] = (span["span_id"], 1, [], self.rollout)
            place = 0
        else:
            self.alias[span["span_id"]] = first[0]
            first[2].append(span["span_id"])
            self.groups[key] = (first[0], first[1] + 1, first[2], first[3])
            place = first[1]
        if span["name"] == "generate_and_rm_group":
            trace.place = place

    def request_version(self, trace_id: str, raw_span_id: str, version: Any) -> None:
        """SGLang answered the engine call `raw_span_id` of trace `trace_id` under weight `version`."""
        try:
            value = int(version)
        except (TypeError, ValueError):
            return
        with self.lock:
            trace = self.traces.get(str(trace_id))
            span = trace.spans.get(st.span_id(raw_span_id)) if trace else None
            if span is not None and span["name"] == st.REQUEST_SPAN and span["end_ns"] is None:
                span["weight_version"] = value

    def _emit(self, trace: _Trace, span: dict, carrier: dict) -> None:
        span["step"] = self.rollout if self.rollout is not None else self.last
        if span["name"] == st.REQUEST_SPAN:
            if "finish_reason" not in span["attrs"]:
                span["weight_version"] = None  # a call that did not return: the importer dates only those that did
            elif span["weight_version"] is not None:
                trace.dated.append((span["start_ns"], span["end_ns"], span["weight_version"]))
        else:
            span["weight_version"] = st.version_of(span, trace.spans, trace.dated, None)
        span["events"] = trace.pending.pop(span["span_id"], [])
        if span["span_id"] in self.alias:
            return  # another sample's copy of a group span: recorded once, with the first sample's
        group = carrier.get("group_id")
        group = group if isinstance(group, int) and not isinstance(group, bool) and group >= 0 else 0
        span["thread_id"], span["thread_name"] = st.lane(group, trace.place, carrier.get("sample_id"),
                                                         span["name"] in st.GROUP_SPANS)
        parent = trace.spans.get(span["parent_span_id"])
        row = dict(span, parent_span_id=self.alias.get(span["parent_span_id"], span["parent_span_id"]))
        pieces = st.cut_at_windows(row, self.ends, parent["start_ns"] if parent is not None else None)
        for piece in pieces:
            if piece["step"] is not None and (piece["step"] not in self.ends or piece["end_ns"] > self.ends[piece["step"]]):
                self.ends[piece["step"]] = piece["end_ns"]
        self.emit(pieces)

    # --- rollouts ----------------------------------------------------------------------------
    def begin(self, rollout_id: int) -> None:
        with self.lock:
            self.rollout = self.last = rollout_id

    def end(self, rollout_id: int, samples: list) -> dict[int, list[dict]]:
        """The rollout returned `samples` (slime `Sample`s): their `samples` rows by step, as the importer
        writes them for the dump of these samples; their traces are done and forgotten."""
        dicts = [s.to_dict() if hasattr(s, "to_dict") else s for s in samples]
        with self.lock:
            self.rollout = None
            # a group may still run (slime's fully-async rollout keeps groups going across rollouts):
            # its copies are forgotten only with the traces of the same age
            for key in [k for k, g in self.groups.items() if g[3] is not None and g[3] < rollout_id - IDLE_ROLLOUTS]:
                for copy in self.groups.pop(key)[2]:
                    self.alias.pop(copy, None)
            self.starts[rollout_id] = st.own_start(dicts, rollout_id)
            for d in dicts:
                trace = d.get("trace") if isinstance(d, dict) else None
                if isinstance(trace, dict):
                    self.traces.pop(str(trace.get("trace_id")), None)
            for key in [k for k, t in self.traces.items() if t.seen is not None and t.seen < rollout_id - IDLE_ROLLOUTS]:
                del self.traces[key]
            for step in [k for k in self.ends if k < rollout_id - IDLE_ROLLOUTS]:
                del self.ends[step]
            starts = dict(self.starts)
        _, rows, _ = st.rollout_rows(rollout_id, dicts, starts)
        by_step: dict[int, list[dict]] = {}
        for row in rows:
            by_step.setdefault(row["step"], []).append({k: v for k, v in row.items() if k != "step"})
        return by_step


class SpanWriter:
    """Queues ended spans and writes them as one part per writer cycle, on the run's writer thread
    (rows are built there too: slime's event loop only appends a dict).

    The run's row writer names its parts like the span exporter does (`<process>-<seq>`), so these
    parts get their own names (`<process>-slime-<seq>`) rather than going through it.
    """

    def __init__(self, run):
        self.run = run
        self.rows: list[dict] = []
        self.lock = threading.Lock()
        self.queued = False
        self.seq = itertools.count()

    def __call__(self, rows: list[dict]) -> None:
        with self.lock:
            self.rows.extend(r for r in rows if r["end_ns"] is not None)
            if self.queued or not self.rows:
                return
            self.queued = True
        if not self.run.submit_task(self.write):
            with self.lock:
                lost, self.rows, self.queued = len(self.rows), [], False
            self.run.drops.add("spans", lost, "recorded after the run was shut down")

    def write(self) -> None:
        from rltrace.store import rows as store_rows
        from rltrace.store.parts import write_part

        with self.lock:
            rows, self.rows, self.queued = self.rows, [], False
        run = self.run
        try:
            table = store_rows.span_rows_table([st.finish(r) for r in rows], run.process, run.service_name, drops=run.drops)
            if table is not None and table.num_rows:
                write_part(Path(run.run_dir) / _names.SPANS.folder,
                           f"{run.process.process_id}-slime-{next(self.seq):08d}.parquet", table, _names.SPANS)
        except Exception as exc:  # a part that cannot be written costs its rows, counted
            run.drops.add("spans", len(rows), f"part could not be written ({type(exc).__name__}: {str(exc)[:160]})")
