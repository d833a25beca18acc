"""Per-part summaries of spans: what the per-step analysis reads of a span part, written next to it.

A report used to read every span of a run (ids, phase, process, thread, times) to compute its
per-step summaries. Most spans are leaves that the analysis uses only through unions and sums: a
`generate` span under a `rollout`, a `forward` under a `train`, a `score` under a `reward`. When a
writer merges its parts (`rltrace.store.merge`) it also writes, for the merged part, the part's
spans with those leaves merged: per (step, process, phase, parent, on the parent's thread or not),
each union of their intervals becomes one row carrying how many spans it holds (`count`) and their
summed durations (`total_ns`). Every other span stays a row of its own. The analysis computes from
these rows exactly what it computes from the spans (`rltrace.analysis._compute`; tested against the
spans on random runs), reading a few rows a step instead of thousands.

A span is merged only where the analysis provably treats it as part of such a union: it has a
parent in the same process whose phase is a stage phase (so it is never a critical-path link), of
its own stage or it has none (never nested in another stage), it lies inside that parent's time
(loaded whenever the parent is), it is not a `wait` or `weight_sync` span, it lasts, it has no
child that this process knows of (in the part, running, or seen earlier), and its same-thread
ancestors are known and of its stage. A child elsewhere that names a merged span as its parent (a
span in another process) is found by the reader, which then reads that union's spans instead.

Files: `span_digests/<part name>`, table `span_digest`; the footer key `rltrace.digest_of` names the
span part (name and rows). A reader uses a summary only while that part is in force.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rltrace import _names
from rltrace._phases import STAGE_OF, TERM_OF_STAGE, WAIT

_NEVER_MERGED = frozenset((WAIT, "weight_sync"))
_STAGE_CODE = {p: list(TERM_OF_STAGE).index(s) for p, s in STAGE_OF.items()}
_MAX_DEPTH = 64  # same-thread ancestors walked at most
_PENDING_MAX = 200_000  # parent ids remembered across merges (children seen, parent not yet)
_I64 = np.int64


@dataclass
class Live:
    """What the writing process knows of a span still running: a possible parent."""

    span_id: int
    phase: str
    thread_id: int
    start_ns: int
    parent_id: int | None
    parent_remote: bool


@dataclass
class Knowledge:
    """What a writer knows beyond the part it summarises: its running spans (possible parents, and
    parents of running children) and the parents of spans it summarised before whose own span it
    has not seen yet (so they are never taken for leaves)."""

    process_id: str | None = None
    live: list[Live] = field(default_factory=list)
    pending: OrderedDict = field(default_factory=OrderedDict)  # parent id -> None

    def remember(self, parent_ids: np.ndarray) -> None:
        for pid in parent_ids.tolist():
            self.pending[pid] = None
            self.pending.move_to_end(pid)
        while len(self.pending) > _PENDING_MAX:
            self.pending.popitem(last=False)

    def forget(self, span_ids: np.ndarray) -> None:
        for sid in span_ids.tolist():
            self.pending.pop(sid, None)


def live_of(spans) -> list[Live]:
    """`Live` records of running OTel spans (`rltrace.otel.live.LiveSpans.snapshot()`)."""
    out = []
    for s in spans:
        attrs = getattr(s, "attributes", None) or {}
        parent = s.parent
        thread = attrs.get(_names.THREAD_ID)
        out.append(Live(
            span_id=_signed(s.context.span_id),
            phase=str(attrs.get(_names.PHASE) or s.name or ""),
            thread_id=int(thread) if isinstance(thread, int) else -1,
            start_ns=int(s.start_time or 0),
            parent_id=None if parent is None else _signed(parent.span_id),
            parent_remote=bool(parent is not None and parent.is_remote),
        ))
    return out


def _signed(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


DIGEST = _names.SPAN_DIGEST
DIGEST_SCHEMA = _names.SPAN_DIGEST_SCHEMA


def _attr_column(attributes: pa.ChunkedArray, phase: pa.Array, which: str, key: str) -> pa.Array:
    """`attr(attributes, key)` for the rows of phase `which` (few: wait and weight_sync spans)."""
    rows = np.flatnonzero(pc.equal(phase, which).fill_null(False).to_numpy(zero_copy_only=False))
    out = [None] * len(phase)
    if len(rows):
        for i, text in zip(rows.tolist(), attributes.take(pa.array(rows)).to_pylist()):
            try:
                value = json.loads(text).get(key) if text else None
            except (ValueError, AttributeError):
                value = None
            out[i] = value
    return out


def _analysis_columns(spans: pa.Table) -> dict:
    """The columns the analysis loads (`rltrace.analysis.summary._load`), from finished span rows."""
    phase = pc.coalesce(spans["phase"], spans["name"], pa.scalar("")).combine_chunks()
    attributes, declared = spans["attributes"], spans["phase"].combine_chunks()  # as the analysis reads them: by rl.phase
    waiting = _attr_column(attributes, declared, WAIT, _names.WAITING_FOR)
    sync_bytes = _attr_column(attributes, declared, "weight_sync", _names.SYNC_BYTES)
    sync_method = _attr_column(attributes, declared, "weight_sync", _names.SYNC_METHOD)

    def as_float(v):
        try:
            return None if v is None or isinstance(v, bool) else float(v)
        except (TypeError, ValueError):
            return None

    def as_text(v):  # what json_extract_string gives: a string as it is, anything else as compact JSON
        return None if v is None else (v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))

    return {
        "span_id": spans["span_id"].combine_chunks(),
        "parent_span_id": spans["parent_span_id"].combine_chunks(),
        "phase": phase,
        "name": spans["name"].combine_chunks(),
        "step": spans["step"].combine_chunks(),
        "weight_version": spans["weight_version"].combine_chunks(),
        "process_id": spans["process_id"].combine_chunks(),
        "thread_id": spans["thread_id"].combine_chunks(),
        "start_ns": spans["start_ns"].combine_chunks(),
        "end_ns": spans["end_ns"].combine_chunks(),
        "waiting_for": pa.array([as_text(v) for v in waiting], pa.string()),
        "sync_bytes": pa.array([as_float(v) for v in sync_bytes], pa.float64()),
        "sync_method": pa.array([as_text(v) for v in sync_method], pa.string()),
    }


def build(spans: pa.Table, knowledge: Knowledge | None = None) -> pa.Table:
    """The per-part summary of `spans` (finished spans of the current schema version)."""
    knowledge = knowledge if knowledge is not None else Knowledge()
    cols = _analysis_columns(spans)
    n = spans.num_rows
    sid = np.asarray(cols["span_id"].fill_null(0).to_numpy(zero_copy_only=False), _I64)
    has_parent = cols["parent_span_id"].is_valid().to_numpy(zero_copy_only=False)
    pid = np.asarray(cols["parent_span_id"].fill_null(0).to_numpy(zero_copy_only=False), _I64)
    start = np.asarray(cols["start_ns"].fill_null(0).to_numpy(zero_copy_only=False), _I64)
    end = np.asarray(cols["end_ns"].fill_null(0).to_numpy(zero_copy_only=False), _I64)
    thread = np.asarray(cols["thread_id"].fill_null(-1).to_numpy(zero_copy_only=False), _I64)
    phase_codes, phase_names = _codes(cols["phase"])
    proc_codes, proc_names = _codes(cols["process_id"])
    # known spans: these rows, then the running ones (possible parents of these rows)
    live = knowledge.live
    own = -1 if knowledge.process_id is None else _index(proc_names, knowledge.process_id)
    k_id = np.concatenate([sid, np.array([x.span_id for x in live], _I64)])
    k_parent = np.concatenate([pid, np.array([0 if x.parent_id is None else x.parent_id for x in live], _I64)])
    k_has_parent = np.concatenate([has_parent, np.array([x.parent_id is not None for x in live], bool)])
    k_remote = np.concatenate([np.zeros(n, bool), np.array([x.parent_remote for x in live], bool)])
    k_stage_phase = np.array([p in STAGE_OF for p in phase_names.tolist()] + [False], bool)
    k_stage_of_name = np.array([_STAGE_CODE.get(p, -1) for p in phase_names.tolist()] + [-1], _I64)
    live_stage_phase = np.array([x.phase in STAGE_OF for x in live], bool)
    live_stage = np.array([_STAGE_CODE.get(x.phase, -1) for x in live], _I64)
    k_is_stage_phase = np.concatenate([k_stage_phase[phase_codes], live_stage_phase])
    k_stage = np.concatenate([k_stage_of_name[phase_codes], live_stage])
    k_proc = np.concatenate([proc_codes, np.full(len(live), own, _I64)])
    k_thread = np.concatenate([thread, np.array([x.thread_id for x in live], _I64)])
    k_start = np.concatenate([start, np.array([x.start_ns for x in live], _I64)])
    k_end = np.concatenate([end, np.full(len(live), np.iinfo(_I64).max, _I64)])
    k_live = np.concatenate([np.zeros(n, bool), np.ones(len(live), bool)])

    order = np.argsort(k_id, kind="stable")  # the first row of each id is its parent row, as the analysis takes it
    sorted_ids = k_id[order]

    def find(ids_: np.ndarray, valid: np.ndarray) -> np.ndarray:
        at = np.clip(np.searchsorted(sorted_ids, ids_), 0, max(len(sorted_ids) - 1, 0))
        hit = valid & (len(sorted_ids) > 0) & (sorted_ids[at] == ids_) if len(sorted_ids) else np.zeros(len(ids_), bool)
        return np.where(hit, order[at] if len(order) else 0, -1)

    parent = find(pid, has_parent)  # each row's parent among the known spans, -1 if unknown
    # spans that are parents of something this process knows of: never merged
    parents_known = np.concatenate([pid[has_parent], k_parent[n:][k_has_parent[n:]],
                                    np.fromiter(knowledge.pending, _I64, len(knowledge.pending))])
    is_parent = np.isin(sid, parents_known)
    own_stage = k_stage[:n]
    p = np.maximum(parent, 0)
    same_thread = (parent >= 0) & (k_thread[p] == thread)
    never = np.isin(phase_names, list(_NEVER_MERGED))
    plain = ((parent >= 0) & ~is_parent & ~np.append(never, False)[phase_codes]
             & k_is_stage_phase[p] & ((own_stage < 0) | (own_stage == k_stage[p]))
             & (end > start) & (start >= k_start[p]) & (k_live[p] | (end <= k_end[p]))
             & (k_proc[p] == proc_codes) & (proc_codes >= 0))
    # same-thread ancestors beyond the parent: all known, and of the leaf's stage (or none)
    walk = np.flatnonzero(plain & same_thread & (own_stage >= 0))
    anc = p[walk]
    for _ in range(_MAX_DEPTH):
        if not len(walk):
            break
        up = find(k_parent[anc], k_has_parent[anc])
        root = ~k_has_parent[anc] | (k_live[anc] & k_remote[anc])  # the chain ends: no parent, or another process
        unknown = ~root & (up < 0)
        plain[walk[unknown]] = False
        go = ~root & (up >= 0)
        up_ = np.maximum(up, 0)
        go &= (k_proc[up_] == k_proc[anc]) & (k_thread[up_] == k_thread[anc])  # the chain ends: another thread
        hit = go & (k_stage[up_] >= 0) & (k_stage[up_] != own_stage[walk])
        plain[walk[hit]] = False
        keep = go & ~hit
        walk, anc = walk[keep], up_[keep]
    else:
        plain[walk] = False
    knowledge.forget(sid)
    knowledge.remember(pid[has_parent & ((parent < 0) | (parent >= n))])  # parents still to come: never leaves then
    rows = pa.table({**cols, "count": pa.array(np.ones(n, _I64)), "total_ns": pa.array(end - start),
                     "same_thread": pa.array(np.where(plain, same_thread, False), mask=~plain),
                     "parent_thread_id": pa.array(np.where(plain, k_thread[p], 0), mask=~plain)}, schema=DIGEST_SCHEMA)
    # a merged span's thread, as the analysis compares it: its parent's on the parent's thread, its own
    # otherwise (-1: unknown, stored as null)
    threads = np.where(plain & same_thread, k_thread[p], thread)
    rows = rows.set_column(DIGEST_SCHEMA.get_field_index("thread_id"), "thread_id", pa.array(threads, mask=threads == -1))
    keep = pa.array(~plain)
    return _finish(rows.filter(keep), rows.filter(pc.invert(keep)).set_column(
        0, "span_id", pa.nulls(int(plain.sum()), pa.int64())))


def combine(summaries: list[pa.Table]) -> pa.Table:
    """The per-part summary of a part merged from parts with these summaries: their rows, with the
    unions of one key merged again where they overlap (a union of unions)."""
    rows = pa.concat_tables([t.select(DIGEST_SCHEMA.names).cast(DIGEST_SCHEMA) for t in summaries])
    single = rows["span_id"].is_valid()
    return _finish(rows.filter(single), rows.filter(pc.invert(single)))


def _finish(singles: pa.Table, leaves: pa.Table) -> pa.Table:
    """Rows of a summary: the spans of their own, then the unions of `leaves`, by step and start."""
    table = pa.concat_tables([singles, _unions(leaves)]) if leaves.num_rows else singles
    return table.take(pc.sort_indices(table, sort_keys=[("step", "ascending"), ("start_ns", "ascending")]))


_KEY = ("step", "process_id", "phase", "parent_span_id", "same_thread")  # what a union merges by


def _unions(leaves: pa.Table) -> pa.Table:
    """One row per union of the intervals of `leaves` (spans, or unions of an earlier summary) of
    one key. Intervals that overlap or touch are one union, as in `rltrace.analysis._intervals.union`
    (which the analysis applies to these rows again: a union of unions is the union of the spans)."""
    keys = []
    for name in _KEY:
        column = leaves[name].combine_chunks()
        if pa.types.is_string(column.type):
            keys.append(_codes(column)[0])
        else:
            keys += [column.is_valid().to_numpy(zero_copy_only=False).astype(_I64),
                     np.asarray(column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), _I64)]
    a = np.asarray(leaves["start_ns"].to_numpy(), _I64)
    b = np.asarray(leaves["end_ns"].to_numpy(), _I64)
    order = np.lexsort((a, *keys[::-1]))
    a, b = a[order], b[order]
    new_group = np.ones(len(order), bool)
    if len(order) > 1:
        new_group[1:] = np.any([k[order][1:] != k[order][:-1] for k in keys], axis=0)
    reach = _grouped_running_max(np.cumsum(new_group) - 1, b)
    opens = new_group.copy()
    opens[1:] |= a[1:] > reach[:-1]  # a union ends where the next interval starts after every earlier one ended
    union = np.cumsum(opens) - 1
    firsts = np.flatnonzero(opens)
    n = len(firsts)
    count = np.bincount(union, weights=np.asarray(leaves["count"].to_numpy(), np.float64)[order], minlength=n)
    total = np.bincount(union, weights=np.asarray(leaves["total_ns"].to_numpy(), np.float64)[order], minlength=n)
    first = leaves.take(pa.array(order[firsts]))  # a member of each union, for the columns the key fixes
    return first.set_column(first.schema.get_field_index("start_ns"), "start_ns", pa.array(a[firsts])) \
        .set_column(first.schema.get_field_index("end_ns"), "end_ns", pa.array(np.maximum.reduceat(b, firsts) if n else b)) \
        .set_column(first.schema.get_field_index("count"), "count", pa.array(np.round(count).astype(_I64))) \
        .set_column(first.schema.get_field_index("total_ns"), "total_ns", pa.array(np.round(total).astype(_I64)))


def _grouped_running_max(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of `values` that starts again at each group (rows sorted by group)."""
    if not len(values):
        return values
    lo = int(values.min())
    shifted = values - lo  # >= 0
    width = int(shifted.max()) + 1
    if width < 2**62 and (int(group.max()) + 1) * width < 2**62:  # each group in its own band: one cumulative maximum
        return np.maximum.accumulate(group * width + shifted) - group * width + lo
    out = values.copy()
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    for s, e in zip(starts, np.append(starts[1:], len(values))):
        out[s:e] = np.maximum.accumulate(values[s:e])
    return out


def _codes(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    enc = pc.dictionary_encode(column)
    return (np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), _I64),
            np.asarray(enc.dictionary.to_pylist(), dtype=object))


def _index(names: np.ndarray, value: str) -> int:
    hits = np.flatnonzero(names == value)
    return int(hits[0]) if len(hits) else -2  # -2: the process writes none of these rows


def footer(part_name: str, rows: int) -> dict:
    """The footer key of a summary of span part `part_name` holding `rows` spans."""
    return {_names.META_DIGEST_OF: json.dumps([part_name, rows]).encode()}
