"""Per-step results that need interval arithmetic: phase and stage times, waits, critical path.

`compute(spans, checks)` turns the finished spans overlapping a batch of steps (a `Spans`, loaded
by `summary.py` from DuckDB) into rows of the `step_summary` table (schema in `rltrace._names`);
`summary.py` caches them per connection and in the run's summary cache. Definitions
(docs/analysis.md):

- phase seconds: length of the union of that phase's spans of the step (per process, and across
  processes with process_id NULL); `count` spans, `total_ns` summed durations.
- stage seconds (`R`, `T`, `W`, and `reward`): union over every process of the *own time* of the
  step's spans whose phase is in that category, so nested or concurrent spans count once. A
  span's own time leaves out its descendants on the same thread that belong to another stage:
  when `train` contains `rollout` and `reward` (TRL generates inside its training step), each
  instant counts for the innermost stage and `train` keeps only its own work.
- nested: per step, outer stage and inner stage, the time the inner stage ran inside the outer
  one on the same thread (what was taken out of the outer stage's time).
- overlap: per step and cost term X, the time X's own intervals ran while another term ran
  anywhere (other processes, other threads, other steps): measured concurrency, the only
  evidence that stages overlapped.
- self time: the parts of a span where none of its children on the same thread runs, i.e. what
  that thread was doing itself (a `rollout` span whose thread sits in a `wait` child is waiting,
  not working, during that wait).
- waits: inside the step's window (first start to last end over all processes), each process
  that has spans in the step is *idle* where none of its busy or wait spans runs (any step);
  a `wait` span counts over its self time (so also inside a busy parent). Each such interval is
  attributed to the busy phases whose self time runs meanwhile on other processes or other
  threads of the same process (a phase with child phases only where no child runs). Idle time
  inside one of the process's own container spans (`step`, an `iteration` around stages) while
  nothing ran anywhere is that container's own work (a Hugging Face Trainer's forward and
  backward inside `step`), not idleness nor a wait for "untraced"; while work ran elsewhere it
  stays a wait for that work. A step with no busy span (only containers and waits, e.g. cut
  short by a crash) gives no wait rows.
- sync: each `weight_sync` span (start_ns, end_ns, seconds = duration, count = `rl.bytes` or NULL,
  other = method).
- critical path: from the top-level busy span that ends last, repeatedly step back to the
  top-level busy span of the step that ended last before the current one started.

Everything runs on numpy arrays of integer codes (phases, processes, parent rows), never on
per-span Python objects: the work is a handful of sorts and cumulative maxima per batch
(`_intervals`). Unions are taken once per phase and then combined from the merged intervals,
which are far fewer than the spans.
"""

from __future__ import annotations

from typing import Mapping

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rltrace import _names
from rltrace._phases import STAGE_OF, TERM_OF_STAGE, TERMS, WAIT, containers
from rltrace._phases import term as term_of
from rltrace.analysis import _intervals as iv
from rltrace.store.ids import span_hex

logger = logging.getLogger("rltrace")

VERSION = 11  # 4: stage time is own time (nested stages count once, innermost); nested and overlap rows
# 5: a sync row for every weight_sync span, with its start and end (count NULL without rl.bytes)
# 6: a container's own time with nothing running anywhere is its work, not idle; no waits from a step with no work
# 7: child rows (the phases directly inside a stage's spans: reward functions, tool calls, engines)
# 8: ties broken by what rows hold (phase, process names), so spans and per-part summaries give one answer
# 9: the process that ran an awaited phase longest: ties by name, a phase's 0 ns runs left out (batching changed it)
# 10: time before a process's first span (of the run) is its start-up, not a wait
# 11: nor is time after a process ended; windows crossing most of the run are left out (bounded work)
TOLERANCE_NS = 1_000_000  # critical path: a predecessor may end up to 1 ms after its successor starts

_COLUMNS = (
    "step kind seq process_id phase other other_process_id detail span_id start_ns end_ns seconds count total_ns version"
).split()
_I64 = np.int64
_DENSE = 1 << 22  # group keys up to this many possible values are counted, not hashed


def _encode(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(int64 code per row, -1 for null; the distinct values) of a string column."""
    enc = pc.dictionary_encode(column)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks() if enc.num_chunks else pa.array([], pa.dictionary(pa.int32(), pa.string()))
    return np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), _I64), enc.dictionary


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 code per row, -1 for null; names as an object array) of a string column."""
    codes, values = _encode(column)
    return codes, np.asarray(values.to_pylist(), dtype=object)


def _codes_in(column: pa.ChunkedArray | pa.Array, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_codes` of the column's rows taken in `order`, without taking the text: codes numbered by
    first appearance in that order, as encoding the reordered column would number them."""
    codes, names = _codes(column)
    codes = codes[order]
    if not len(names):  # every value null
        return codes, names
    valid = codes >= 0
    present, first_at = np.unique(codes[valid], return_index=True)
    by_first = present[np.argsort(first_at, kind="stable")]
    renumber = np.empty(len(names), _I64)
    renumber[by_first] = np.arange(len(by_first), dtype=_I64)
    return np.where(valid, renumber[np.maximum(codes, 0)], -1), names[by_first]


def _parents(parent_ids: pa.ChunkedArray, span_ids: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(parent code per span, -1 for none; the first row with each parent id, -1 when none is
    loaded, one more entry -1 for code -1): `first[code]` is each span's parent row.

    Parents are few (a rollout over thousands of generate spans): the distinct parent ids make a
    small hash table that every span id is looked up in, instead of hashing a million span ids.
    """
    index, ids = _encode(parent_ids)
    which = np.asarray(pc.index_in(span_ids, value_set=ids).fill_null(-1).to_numpy(zero_copy_only=False), _I64)
    rows = np.flatnonzero(which >= 0)
    found, at = np.unique(which[rows], return_index=True)  # the first span with each parent id
    first = np.full(len(ids) + 1, -1, _I64)  # the last entry: no parent
    first[found] = rows[at]
    return index, first


@dataclass
class Spans:
    """Finished spans as parallel numpy arrays sorted by start, strings as codes.

    `row` maps back to the order of `table` (what DuckDB returned) for the few per-span strings
    the critical path and waits print (span id, name, declared wait target).
    """

    table: pa.Table
    row: np.ndarray
    step: np.ndarray  # int64; meaningless where not has_step
    has_step: np.ndarray
    phase: np.ndarray
    phase_names: np.ndarray
    proc: np.ndarray
    proc_names: np.ndarray
    thread: np.ndarray  # -1 where unknown
    start: np.ndarray
    end: np.ndarray
    prow: np.ndarray  # parent's row in this order, -1 when the parent is not loaded
    sync_bytes: np.ndarray  # float, NaN where none
    count: np.ndarray  # spans a row stands for: 1, or more in a per-part summary's union (`rltrace.store.digest`)
    total: np.ndarray  # their summed durations (ns)

    @classmethod
    def from_arrow(cls, table: pa.Table, order: np.ndarray | None = None) -> Spans:
        """From columns span_id, parent_span_id, phase, name, step, process_id, thread_id,
        start_ns, end_ns, waiting_for, sync_bytes, sync_method, and (rows of per-part summaries)
        count and total_ns. `order`: the rows' order, by start (default: by start, ties as in
        `table`); the same as the table taken in that order, without taking its text columns."""
        def ints(name, fill):
            return np.asarray(table[name].fill_null(fill).to_numpy(), _I64)

        start = ints("start_ns", 0)
        order = np.argsort(start, kind="stable") if order is None else np.asarray(order, _I64)
        taken = pa.array(order)
        parent, first = _parents(table["parent_span_id"].take(taken), table["span_id"].take(taken))
        phase, phase_names = _codes_in(table["phase"], order)
        proc, proc_names = _codes_in(table["process_id"], order)
        end = ints("end_ns", 0)
        weighted = "count" in table.column_names
        return cls(
            table=table,
            row=order,
            step=ints("step", 0)[order],
            has_step=table["step"].is_valid().to_numpy(zero_copy_only=False)[order],
            phase=phase,
            phase_names=phase_names,
            proc=proc,
            proc_names=proc_names,
            thread=ints("thread_id", -1)[order],
            start=start[order],
            end=end[order],
            prow=first[parent],  # each span's parent row in this order, -1 when not loaded
            sync_bytes=table["sync_bytes"].cast(pa.float64()).fill_null(np.nan).to_numpy()[order],
            count=(ints("count", 1) if weighted else np.ones(len(start), _I64))[order],
            total=(ints("total_ns", 0) if weighted else end - start)[order],
        )

    def __len__(self) -> int:
        return len(self.start)

    def strings(self, column: str, rows: np.ndarray) -> np.ndarray:
        """Values of a string column for some rows (in this order), None for null.

        Taken chunk by chunk: DuckDB hands over a million rows as ~500 chunks, and a take from
        the whole chunked column costs milliseconds however few rows are asked for."""
        chunks = self.table[column].chunks
        at = self.row[rows]
        starts = np.cumsum([0] + [len(c) for c in chunks])
        which = np.searchsorted(starts, at, side="right") - 1
        out = np.empty(len(at), dtype=object)
        for c in np.unique(which).tolist():
            mine = which == c
            out[mine] = chunks[c].take(pa.array(at[mine] - starts[c])).to_pylist()
        return out

    def span_ids(self, rows: np.ndarray) -> np.ndarray:
        """Span ids of some rows as hex text (the summary rows people read), None for none."""
        return np.array([span_hex(v) for v in self.strings("span_id", rows)], dtype=object)

    def by_phase(self, table: dict, default) -> np.ndarray:
        """`table[phase]` for each phase code, the default last (what code -1, no phase, indexes)."""
        values = [table.get(n, default) for n in self.phase_names] + [default]
        return np.array(values, dtype=object if default is None else None)


def _rows(kind: str, **cols) -> pd.DataFrame:
    """Summary rows of one kind, every column typed as the summary schema types it (nullable
    Int64, float64, text as object): a column a kind leaves empty is a typed null column, never
    an object column of None that DuckDB would type from a sample of its values."""
    n = len(next(iter(cols.values())))
    frame = pd.DataFrame({c: _typed(c, cols.get(c), n) for c in _COLUMNS if c != "kind"})
    frame.insert(1, "kind", kind)
    frame["version"] = VERSION
    return frame


_INTEGER = frozenset(f.name for f in _names.STEP_SUMMARY_SCHEMA if pa.types.is_integer(f.type))
_FLOAT = frozenset(f.name for f in _names.STEP_SUMMARY_SCHEMA if pa.types.is_floating(f.type))


def _typed(column: str, values, n: int):
    if column in _INTEGER:
        return pd.array(np.full(n, None, object) if values is None else values, dtype="Int64")
    if column in _FLOAT:
        return np.full(n, np.nan) if values is None else np.asarray(values, np.float64)
    return np.full(n, None, object) if values is None else values


def _group(*columns: tuple[np.ndarray, int]) -> tuple[np.ndarray, int, list[np.ndarray]]:
    """Group rows by several small non-negative integer columns, given as (values, size).

    Returns (group id per row, number of groups, each column's value per group), groups in
    ascending key order.
    """
    key = _key(list(columns))
    product = 1
    for _, size in columns:
        product *= max(int(size), 1)
    if product <= _DENSE:  # few possible keys: count them instead of hashing every row
        present = np.bincount(key, minlength=product) > 0
        uniq = np.flatnonzero(present)
        gid = (np.cumsum(present) - 1)[key]
    else:
        gid, uniq = pd.factorize(key, sort=True)
    out = []
    rest = uniq.astype(_I64)
    for _, size in reversed(columns):
        out.append(rest % max(int(size), 1))
        rest = rest // max(int(size), 1)
    return np.asarray(gid, _I64), len(uniq), out[::-1]


def _distinct(key: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of `key` (in 0..size-1), ascending; counted when size allows."""
    return np.flatnonzero(np.bincount(key, minlength=size)) if size <= _DENSE else np.unique(key)


def _key(columns: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """One int64 per row that orders rows as the columns ((values, size) pairs) do."""
    key = np.asarray(columns[0][0], _I64)
    for values, size in columns[1:]:
        key = key * max(int(size), 1) + values
    return key


def _union_by(columns: list[tuple[np.ndarray, int]], a: np.ndarray, b: np.ndarray):
    """Merge the intervals [a, b) within each group of `columns` ((values, size) pairs, values
    in 0..size-1): returns each merged interval's column values, start and end."""
    if not len(a):
        return [np.empty(0, _I64) for _ in columns], np.empty(0, _I64), np.empty(0, _I64)
    gid, _, keys = _group(*columns)
    g, us, ue = iv.union(gid, a, b)
    return [k[g] for k in keys], us, ue


def _sum_by(columns: list[tuple[np.ndarray, int]], weights: np.ndarray | None = None, counts: np.ndarray | None = None):
    """(each group's column values, row count (or summed `counts`), summed weights) for groups of `columns`."""
    gid, n, keys = _group(*columns)
    count = np.bincount(gid, minlength=n) if counts is None else np.bincount(gid, weights=counts, minlength=n).astype(_I64)
    total = None if weights is None else np.bincount(gid, weights=weights, minlength=n)
    return keys, count, total


def _lookup_at(keys: np.ndarray, key: np.ndarray, values: np.ndarray, default=0) -> np.ndarray:
    """values[i] where keys[i] == key (keys sorted and unique), else default."""
    if not len(keys):
        return np.full(len(key), default)
    pos = np.clip(np.searchsorted(keys, key), 0, len(keys) - 1)
    return np.where(keys[pos] == key, values[pos], default)


class _Batch:
    """Codes and the merged intervals every result of one batch is derived from.

    Spans that are not a parent on their own thread (nearly all: generate, forward, score…) have
    own time and self time equal to the whole span, so they enter one grouped union by (step,
    process, phase); the few parents are cut into pieces explicitly. Every union after that
    works on the merged intervals, which are far fewer than the spans.
    """

    def __init__(self, s: Spans, checks: pd.DataFrame):
        self.s = s
        n = len(s)
        prow = s.prow
        has_parent = prow >= 0
        # every (parent phase, child phase) seen, as codes (counted, not sorted: phases are few)
        width = len(s.phase_names) + 1
        pairs = _distinct((s.phase[prow[has_parent]] + 1) * width + s.phase[has_parent] + 1, width * width)
        self.parent_phase, self.child_phase = pairs // width - 1, pairs % width - 1
        names = np.append(s.phase_names, None)
        self.container_phases = containers(zip(names[self.parent_phase], names[self.child_phase]))
        # per phase code (the last entry for code -1)
        self.busy_phase = ~s.by_phase(dict.fromkeys(self.container_phases | {WAIT}, True), False)
        self.busy = self.busy_phase[s.phase]
        self.wait_phase = s.by_phase({WAIT: True}, False)
        self.container_phase = s.by_phase(dict.fromkeys(self.container_phases, True), False)
        self.in_batch = s.has_step & np.isin(s.step, checks["step"].to_numpy(_I64))
        code, steps = pd.factorize(np.where(self.in_batch, s.step, 0))
        self.steps = np.asarray(steps, _I64)
        self.nb = len(self.steps)  # bucket nb: spans of other steps, or of none
        self.bucket = np.where(self.in_batch, code, self.nb).astype(_I64)
        self.nproc, self.nphase = len(s.proc_names) + 1, len(s.phase_names) + 1
        self.proc1, self.phase1 = s.proc + 1, s.phase + 1  # codes from 0, for grouping (0 = none)
        self.stage_phase = s.by_phase({p: list(TERM_OF_STAGE).index(st) for p, st in STAGE_OF.items()}, -1)
        self.term_phase = s.by_phase({p: TERMS.index(term_of(p)) for p in STAGE_OF}, -1)
        self.reward_phase = s.by_phase({"reward": True}, False)
        self.sync_phase = s.by_phase({"weight_sync": True}, False)
        self.code = self.stage_phase[s.phase]
        self.up = _same_thread_parent(s)
        self.outer, self.inner = _nesting(self.code, self.up)

        has_child = np.zeros(n, bool)
        has_child[self.up[self.up >= 0]] = True
        parents = np.flatnonzero(has_child)
        kids = np.flatnonzero(self.up >= 0)
        # the few parents: self time (minus same-thread children), own time (minus other stages inside)
        self.self_pieces = _minus(parents, self.up[kids], s.start[kids], s.end[kids], s.start, s.end)
        staged_parents = parents[self.code[parents] >= 0]
        self.own_pieces = _minus(staged_parents, self.outer, s.start[self.inner], s.end[self.inner], s.start, s.end)
        self.has_child = has_child

        # the one pass over every span; parents go to a bucket of their own, dropped (they are in pieces)
        aside = self.nb + 1
        columns = [(np.where(has_child, aside, self.bucket), self.nb + 2), (self.proc1, self.nproc),
                   (self.phase1, self.nphase)]
        (mb, mp, mph), ma, me = _union_by(columns, s.start, s.end)
        kept = mb != aside
        self.m = (mb[kept], mp[kept], mph[kept], ma[kept], me[kept])
        mb, mp, mph, ma, me = self.m
        raw = (np.concatenate([mb, self.bucket[parents]]), np.concatenate([mp, self.proc1[parents]]),
               np.concatenate([mph, self.phase1[parents]]))
        (rb, rp, rph), ra, re = _union_by(
            [(raw[0], self.nb + 1), (raw[1], self.nproc), (raw[2], self.nphase)],
            np.concatenate([ma, s.start[parents]]), np.concatenate([me, s.end[parents]]))
        self.raw = (rb, rp, rph, ra, re)  # every span's whole interval, merged per (bucket, process, phase)

    def per_phase(self):
        """Per (step, process, phase) of the batch: keys (bucket, process + 1, phase + 1), span
        count and summed durations; computed once (phase rows and wait attribution use it)."""
        if not hasattr(self, "_per_phase"):
            (kb, kp, kph), count, total = _sum_by(
                [(self.bucket, self.nb + 1), (self.proc1, self.nproc), (self.phase1, self.nphase)],
                self.s.total.astype(np.float64), self.s.count)
            mine = kb < self.nb  # bucket nb: spans of other steps, or of none
            self._per_phase = (kb[mine], kp[mine], kph[mine]), count[mine], total[mine]
        return self._per_phase

    def own(self):
        """Own-time intervals of staged spans: (bucket, phase code + 1, start, end), merged or pieces."""
        mb, _, mph, ma, me = self.m
        staged = (self.stage_phase[mph - 1] >= 0) & (me > ma)
        r, a, b = self.own_pieces
        return (np.concatenate([mb[staged], self.bucket[r]]), np.concatenate([mph[staged], self.phase1[r]]),
                np.concatenate([ma[staged], a]), np.concatenate([me[staged], b]))


def compute(spans: Spans, checks: pd.DataFrame, firsts: Mapping[str, int] | None = None,
            lasts: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Summary rows for the steps in `checks` (step, count, start_ns, end_ns, total_ns).

    `spans`: every finished span overlapping those steps' windows. `firsts`: each process's first
    span start in the whole run (`summary.first_starts`): before it the process was starting up
    (spawning, importing, loading), which is not waiting for anything. `lasts`: when each process
    that ended did so (`summary.last_ends`): after it, it waits for nothing.
    """
    x = _Batch(spans, checks)
    stage_frames, stage_unions = _stage_rows(x)
    frames = [
        _rows(
            "step",
            step=checks["step"].to_numpy(),
            start_ns=checks["start_ns"].to_numpy(),
            end_ns=checks["end_ns"].to_numpy(),
            seconds=(checks["end_ns"] - checks["start_ns"]).to_numpy() / 1e9,
            count=checks["count"].to_numpy(),
            total_ns=checks["total_ns"].to_numpy(),
        ),
        _phase_rows(x),
        *stage_frames,
        _overlap_rows(x, stage_unions),
        _wait_rows(x, checks, firsts or {}, lasts or {}),
        _path_rows(x),
        _sync_rows(x),
        _child_rows(x),
    ]
    return pd.concat([f for f in frames if len(f)], ignore_index=True)


def _child_rows(x: _Batch) -> pd.DataFrame:
    """Per step, (stage phase, phase of a span directly inside one of its spans): seconds = union
    of the child spans across processes, count = child spans. What names the culprit inside a
    stage: the reward function, tool call or engine that holds most of its time."""
    s = x.s
    kid = np.flatnonzero(x.in_batch & (s.prow >= 0))
    parent = s.phase[s.prow[kid]]
    keep = (x.stage_phase[parent] >= 0) & (s.phase[kid] != parent)
    kid, parent = kid[keep], parent[keep]
    if not len(kid):
        return pd.DataFrame()
    columns = [(x.bucket[kid], x.nb + 1), (parent + 1, x.nphase), (x.phase1[kid], x.nphase)]
    (kb, kp, kc), count, _ = _sum_by(columns, counts=s.count[kid])
    (mb, mp, mc), ma, me = _union_by(columns, s.start[kid], s.end[kid])
    _, _, covered = _sum_by([(mb, x.nb + 1), (mp, x.nphase), (mc, x.nphase)], (me - ma).astype(np.float64))
    names = np.append(s.phase_names, None)
    return _rows("child", step=x.steps[kb], phase=names[kp - 1], other=names[kc - 1], seconds=covered / 1e9,
                 count=count)


def _sync_rows(x: _Batch) -> pd.DataFrame:
    """Every weight-sync span of the step: start_ns, end_ns, seconds = duration, count = bytes
    (NULL without `rl.bytes`), other = method. All of them: the sync trend orders them by start."""
    s = x.s
    sync = np.flatnonzero(x.in_batch & x.sync_phase[s.phase])
    if not len(sync):
        return pd.DataFrame()
    nbytes = s.sync_bytes[sync]
    missing = np.isnan(nbytes)
    return _rows(
        "sync",
        step=s.step[sync],
        process_id=s.proc_names[s.proc[sync]],
        phase=s.phase_names[s.phase[sync]],
        other=s.strings("sync_method", sync),
        span_id=s.span_ids(sync),
        start_ns=s.start[sync],
        end_ns=s.end[sync],
        seconds=(s.end[sync] - s.start[sync]) / 1e9,
        count=pd.arrays.IntegerArray(np.round(np.where(missing, 0, nbytes)).astype(_I64), missing),
    )


def _phase_rows(x: _Batch) -> pd.DataFrame:
    s = x.s
    if not x.in_batch.any():
        return pd.DataFrame()
    (kb, kp, kph), count, total = x.per_phase()
    rb, rp, rph, ra, re = x.raw
    mine = rb < x.nb
    sizes = [x.nb + 1, x.nproc, x.nphase]
    (ub, up_, uph), _, covered = _sum_by([(rb[mine], sizes[0]), (rp[mine], sizes[1]), (rph[mine], sizes[2])],
                                         (re - ra)[mine].astype(np.float64))
    ukey = _key([(ub, sizes[0]), (up_, sizes[1]), (uph, sizes[2])])
    per_process = _lookup_at(ukey, _key([(kb, sizes[0]), (kp, sizes[1]), (kph, sizes[2])]), covered, 0.0)
    # across processes: the merged intervals once more, by (step, phase)
    (ob, oph), oa, oe = _union_by([(rb[mine], sizes[0]), (rph[mine], sizes[2])], ra[mine], re[mine])
    (sb, sph), _, oc = _sum_by([(ob, sizes[0]), (oph, sizes[2])], (oe - oa).astype(np.float64))
    (cb, cph), _, ctotal = _sum_by([(kb, sizes[0]), (kph, sizes[2])], total)
    across = _lookup_at(_key([(sb, sizes[0]), (sph, sizes[2])]), _key([(cb, sizes[0]), (cph, sizes[2])]), oc, 0.0)
    # ccount counts groups; the spans per (step, phase) are the summed per-process counts
    (_, _), _, cspan = _sum_by([(kb, sizes[0]), (kph, sizes[2])], count.astype(np.float64))
    procs, phases = np.append(s.proc_names, None), np.append(s.phase_names, None)
    return pd.concat([
        _rows("phase", step=x.steps[kb], process_id=procs[kp - 1], phase=phases[kph - 1],
              seconds=np.round(per_process) / 1e9, count=count, total_ns=np.round(total).astype(_I64)),
        _rows("phase", step=x.steps[cb], process_id=np.full(len(cb), None, object), phase=phases[cph - 1],
              seconds=np.round(across) / 1e9, count=np.round(cspan).astype(_I64), total_ns=np.round(ctotal).astype(_I64)),
    ], ignore_index=True)


def _same_thread_parent(s: Spans) -> np.ndarray:
    """Parent row of each span when the parent ran on the same process and thread, else -1."""
    parent = np.maximum(s.prow, 0)
    same = (s.prow >= 0) & (s.proc[parent] == s.proc) & (s.thread[parent] == s.thread)
    return np.where(same, s.prow, -1)


def _nesting(code: np.ndarray, up: np.ndarray):
    """(outer row, inner row) pairs: every staged same-thread ancestor of a span of another stage
    (so `train > forward > rollout` takes rollout out of both train and forward)."""
    inner = np.flatnonzero((code >= 0) & (up >= 0))
    anc = up[inner]
    outer_l, inner_l = [], []
    for _ in range(len(code)):  # a chain is never longer, unless stored ids loop (a span its own parent)
        if not len(inner):
            break
        live = anc >= 0
        inner, anc = inner[live], anc[live]
        hit = (code[anc] >= 0) & (code[anc] != code[inner])
        outer_l.append(anc[hit])
        inner_l.append(inner[hit])
        anc = up[anc]
    outer = np.concatenate(outer_l) if outer_l else np.empty(0, _I64)
    nested = np.concatenate(inner_l) if inner_l else np.empty(0, _I64)
    return outer, nested


def _minus(rows: np.ndarray, group: np.ndarray, a: np.ndarray, b: np.ndarray, start, end):
    """Pieces (row, start, end) of each span in `rows` minus the intervals [a, b) given for it
    (`group` = its row). Spans with nothing to take out come back whole, without a sort."""
    n = len(start)
    wanted = np.zeros(n, bool)
    wanted[rows] = True
    cut = np.zeros(n, bool)
    cut[group[wanted[group]]] = True
    whole = rows[~cut[rows]]
    whole = whole[end[whole] > start[whole]]
    sliced = np.flatnonzero(cut)
    pos = np.full(n, -1, _I64)
    pos[sliced] = np.arange(len(sliced), dtype=_I64)
    valid = pos[group] >= 0
    g, ps, pe = iv.complement(pos[group[valid]], a[valid], b[valid], start[sliced], end[sliced], ordered=False)
    keep = pe > ps
    return (np.concatenate([whole, sliced[g[keep]]]), np.concatenate([start[whole], ps[keep]]),
            np.concatenate([end[whole], pe[keep]]))


_TAGS = (*TERMS, "reward")  # stage rows: the three cost terms, and reward on its own


def _stage_rows(x: _Batch):
    """`stage` rows (R, T, W, reward: own-time unions) and `nested` rows; also the merged own
    time per (step, tag) for the overlap rows."""
    s = x.s
    ob, oph, oa, ob_ = x.own()
    mine = ob < x.nb
    tag_of = np.where(x.term_phase >= 0, x.term_phase, -1)
    ob, oph, oa, ob_ = ob[mine], oph[mine], oa[mine], ob_[mine]
    t = tag_of[oph - 1]
    r = x.reward_phase[oph - 1]
    tags = np.concatenate([t[t >= 0], np.full(int(r.sum()), len(TERMS), _I64)])
    bk = np.concatenate([ob[t >= 0], ob[r]])
    (ub, ut), ua, ue = _union_by([(bk, x.nb + 1), (tags, len(_TAGS))],
                                 np.concatenate([oa[t >= 0], oa[r]]), np.concatenate([ob_[t >= 0], ob_[r]]))
    frames = []
    if len(ub):
        (gb, gt), _, covered = _sum_by([(ub, x.nb + 1), (ut, len(_TAGS))], (ue - ua).astype(np.float64))
        # spans counted: staged spans of the batch with some own time (a parent wholly taken by
        # other stages has none), once per tag
        has_own = np.zeros(len(s), bool)
        has_own[x.own_pieces[0]] = True
        has_own |= ~x.has_child & (s.end > s.start)
        rows = np.flatnonzero(x.in_batch & has_own & (x.code >= 0))
        rt = x.term_phase[s.phase[rows]]
        rr = x.reward_phase[s.phase[rows]]
        srows = np.concatenate([rows[rt >= 0], rows[rr]])
        stags = np.concatenate([rt[rt >= 0], np.full(int(rr.sum()), len(TERMS), _I64)])
        (cb, ct), count, total = _sum_by([(x.bucket[srows], x.nb + 1), (stags, len(_TAGS))],
                                         s.total[srows].astype(np.float64), s.count[srows])
        key = _key([(gb, x.nb + 1), (gt, len(_TAGS))])
        ckey = _key([(cb, x.nb + 1), (ct, len(_TAGS))])
        frames.append(_rows("stage", step=x.steps[gb], phase=np.array(_TAGS, object)[gt],
                            seconds=np.round(covered) / 1e9,
                            count=_lookup_at(ckey, key, count, 0),
                            total_ns=np.round(_lookup_at(ckey, key, total, 0.0)).astype(_I64)))
    frames.append(_nested_rows(x))
    return [f for f in frames if len(f)], (ub, ut, ua, ue)


def _nested_rows(x: _Batch) -> pd.DataFrame:
    """Per step, (outer stage, inner stage): how long the inner one ran inside the outer one."""
    s = x.s
    keep = x.in_batch[x.outer]
    outer, inner = x.outer[keep], x.inner[keep]
    if not len(outer):
        return pd.DataFrame()
    code = x.code
    stages = np.array(list(TERM_OF_STAGE), object)
    gid, n, (gstep, gout, gin) = _group((x.bucket[outer], x.nb + 1), (code[outer], len(stages)),
                                        (code[inner], len(stages)))
    covered = iv.total(gid, s.start[inner], s.end[inner], n)
    frame = _rows("nested", step=x.steps[gstep], phase=stages[gout], other=stages[gin], seconds=covered / 1e9,
                  count=np.bincount(gid, minlength=n))
    return frame.sort_values(["step", "phase", "other"], kind="stable", ignore_index=True)


def _overlap_rows(x: _Batch, mine) -> pd.DataFrame:
    """Per step and term X: time X's own intervals ran while another term ran anywhere."""
    ub, ut, ua, ue = mine
    keep = ut < len(TERMS)
    ub, ut, ua, ue = ub[keep], ut[keep], ua[keep], ue[keep]
    if not len(ub):
        return pd.DataFrame()
    # each term's own time over every loaded span (any step: async stages overlap across steps),
    # then "every term but k" from those merged intervals
    ob, oph, oa, oe = x.own()
    term = x.term_phase[oph - 1]
    staged = term >= 0
    (tg,), ts, te = _union_by([(term[staged], len(TERMS))], oa[staged], oe[staged])
    k = len(TERMS)
    g = np.concatenate([np.full(int((tg != j).sum()), j, _I64) for j in range(k)])
    others = iv.Coverage(g, np.concatenate([ts[tg != j] for j in range(k)]),
                         np.concatenate([te[tg != j] for j in range(k)]))
    ns = others.between(ut, ua, ue)
    (gb, gt), _, total = _sum_by([(ub, x.nb + 1), (ut, k)], ns.astype(np.float64))
    return _rows("overlap", step=x.steps[gb], phase=np.array(TERMS, object)[gt], seconds=total / 1e9)


def _wait_rows(x: _Batch, checks, firsts: Mapping[str, int], lasts: Mapping[str, int]) -> pd.DataFrame:
    s = x.s
    if not len(s):
        return pd.DataFrame()
    lo_t = min(int(s.start.min()), int(checks["start_ns"].min()))
    hi_t = max(int(s.end.max()), int(checks["end_ns"].max()))
    lo, hi = np.full(x.nproc, lo_t, _I64), np.full(x.nproc, hi_t, _I64)

    # idle: windows of (step, participating process) minus that process's busy and wait spans
    rb, rp, rph, ra, re = x.raw
    active = x.busy_phase[rph - 1] | x.wait_phase[rph - 1]
    idle_g, idle_s, idle_e = iv.complement(rp[active], ra[active], re[active], lo, hi)
    batch = x.in_batch
    (kb, kp, _), _, _ = x.per_phase()
    pair = np.unique(kb * x.nproc + kp)  # each (step, process) with spans in the batch
    pb, pp = pair // x.nproc, pair % x.nproc
    cstep = checks.set_index("step")
    wstart = cstep.loc[x.steps[pb], "start_ns"].to_numpy(_I64)
    wend = cstep.loc[x.steps[pb], "end_ns"].to_numpy(_I64)
    first = np.array([np.iinfo(_I64).min] + [firsts.get(p, np.iinfo(_I64).min) for p in s.proc_names], _I64)
    wstart = np.maximum(wstart, first[pp])  # a process idle before its first span is starting up
    last = np.array([np.iinfo(_I64).max] + [lasts.get(p, np.iinfo(_I64).max) for p in s.proc_names], _I64)
    wend = np.minimum(wend, last[pp])  # and one that has ended waits for nothing
    # a step's window normally crosses a few idle gaps of each process; windows that cross most of
    # the run (its step numbers recorded again by a later run into the same directory) are left out
    win, a, b, left_out = iv.clip_within(idle_g, idle_s, idle_e, pp, wstart, wend,
                                         limit=16 * (len(idle_g) + len(pp)) + 1_000_000)
    if len(left_out):
        steps = np.unique(x.steps[pb][left_out])
        logger.warning("rltrace: waits of %d step(s) (%s) were not computed: each of their windows spans the work of "
                       "many other steps (the same step numbers recorded again, by a later run into this directory?)",
                       len(steps), _steps_text(steps))
    idle = _split_by_containers(x, x.steps[pb][win], pp[win], a, b)

    # wait spans of the batch's steps, over their self time (their thread is waiting, whatever encloses it)
    waiting = x.wait_phase[s.phase] & batch
    whole = np.flatnonzero(waiting & ~x.has_child & (s.end > s.start))
    pr, pa_, pb_ = x.self_pieces
    cut = waiting[pr]
    rows = np.concatenate([whole, pr[cut]])
    a = np.concatenate([s.start[whole], pa_[cut]])
    b = np.concatenate([s.end[whole], pb_[cut]])
    parent = s.prow[rows]
    parent_phase = np.where(parent >= 0, np.append(s.phase_names, None)[s.phase[np.maximum(parent, 0)]], WAIT)
    declared = s.strings("waiting_for", rows)
    waits = pd.DataFrame({
        "step": s.step[rows],
        "proc": x.proc1[rows],
        "a": a,
        "b": b,
        "in_phase": parent_phase,
        "detail": np.where(pd.isna(declared), "wait_span", "declared"),
        "declared": declared,
    })
    waits["contained"] = False
    pieces = pd.concat([f for f in (idle, waits) if len(f)], ignore_index=True) if len(idle) or len(waits) else idle
    # no wait is drawn from a step with no work recorded in it (only containers and waits: a step
    # cut short by a crash, say)
    worked = np.unique(s.step[x.busy & batch])
    pieces = pieces[np.isin(pieces["step"].to_numpy(_I64), worked)]
    if pieces.empty:
        return pd.DataFrame()
    attributed = _attribute(pieces, x)
    # inside its own container, a process with nothing running anywhere does the container's work
    attributed = attributed[~(attributed["contained"].to_numpy(bool) & attributed["waited_for"].isna().to_numpy())]
    if attributed.empty:
        return pd.DataFrame()
    attributed["process_id"] = np.insert(s.proc_names, 0, None)[attributed["proc"].to_numpy()]
    agg = _total_by(attributed, ["step", "process_id", "detail", "in_phase", "waited_for"], "ns")
    agg["seconds"] = agg["ns"] / 1e9
    agg["other_process_id"] = _who_ran(x, agg)
    return _rows(
        "wait",
        step=agg["step"].to_numpy(),
        process_id=agg["process_id"].to_numpy(object),
        phase=agg["in_phase"].to_numpy(object),
        other=agg["waited_for"].to_numpy(object),
        other_process_id=agg["other_process_id"].to_numpy(object),
        detail=agg["detail"].to_numpy(object),
        seconds=agg["seconds"].to_numpy(),
        count=agg["count"].to_numpy(),
    )


def _total_by(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """One row per distinct combination of `keys` (a missing value is a value of its own, given as
    None): the keys, `value` summed and `count` rows, in no particular order (summary rows are
    ordered when read). What `groupby(keys, dropna=False)` gives, without hashing text tuples."""
    gid = np.zeros(len(frame), _I64)
    for key in keys:
        codes, uniques = pd.factorize(frame[key].to_numpy(), use_na_sentinel=True)  # missing: -1
        gid = pd.factorize(gid * (len(uniques) + 1) + (np.asarray(codes, _I64) + 1))[0].astype(_I64)
    n = int(gid.max()) + 1 if len(gid) else 0
    _, first = np.unique(gid, return_index=True)  # a row of each group, for its keys
    out = {}
    for key in keys:
        values = frame[key].to_numpy()[first]
        if values.dtype == object:
            values = np.where(pd.isna(values), None, values)
        out[key] = values
    out[value] = np.bincount(gid, weights=frame[value].to_numpy(np.float64), minlength=n)
    out["count"] = np.bincount(gid, minlength=n)
    return pd.DataFrame(out)


def _split_by_containers(x: _Batch, step: np.ndarray, proc: np.ndarray, a: np.ndarray, b: np.ndarray) -> pd.DataFrame:
    """Idle pieces (step, process + 1, start, end) cut where the process is inside one of its own
    container spans (`contained`): there, time when nothing ran anywhere is the container's own
    work (a Trainer's forward and backward inside `step`), not idleness; time when work ran
    elsewhere stays a wait for it."""
    rb, rp, rph, ra, re = x.raw
    cont = x.container_phase[rph - 1]
    cg, cs, ce = iv.union(rp[cont], ra[cont], re[cont])
    piece, ins, ine = iv.clip(cg, cs, ce, proc, a, b)  # container time inside each idle piece
    g, outs, oute = iv.complement(piece, ins, ine, a, b, ordered=False)
    return pd.DataFrame({
        "step": np.concatenate([step[g], step[piece]]),
        "proc": np.concatenate([proc[g], proc[piece]]),
        "a": np.concatenate([outs, ins]),
        "b": np.concatenate([oute, ine]),
        "contained": np.concatenate([np.zeros(len(g), bool), np.ones(len(piece), bool)]),
    }).assign(in_phase="idle", detail="idle", declared=None)


def _descendants(parent: np.ndarray, child: np.ndarray) -> dict[int, set[int]]:
    """Phase code -> every phase code below it (children, grandchildren, ...), itself excluded."""
    children: dict[int, set[int]] = {}
    for p, c in zip(parent.tolist(), child.tolist()):
        children.setdefault(p, set()).add(c)
    out = {}
    for top in children:
        seen, todo = set(), list(children[top])
        while todo:
            c = todo.pop()
            if c not in seen and c != top:
                seen.add(c)
                todo.extend(children.get(c, ()))
        if seen:
            out[top] = seen
    return out


_PAIRS = 20_000_000  # (piece, segment) pairs enumerated at once; beyond, pieces x phases are queried in chunks


def _own_segments(pg, ps, pe, children: dict[int, set[int]]):
    """Each busy phase's merged time minus its busy descendants' (the time it ran as itself):
    (phase, start, end), disjoint within a phase. `pg, ps, pe`: merged time per phase, sorted by
    (phase, start). Each parent interval is cut only by the descendants' intervals inside it, so
    a phase shared by many parents (one child name under thousands of request names) costs what
    it overlaps, not a copy per parent."""
    parent = np.flatnonzero(np.isin(pg, np.fromiter(children, _I64, len(children)))) if children else np.empty(0, _I64)
    if not len(parent):
        return pg, ps, pe
    link_parent = np.fromiter((p for p, kids in children.items() for _ in kids), _I64)
    link_kid = np.fromiter((k for kids in children.values() for k in kids), _I64)
    order = np.argsort(link_parent, kind="stable")
    link_parent, link_kid = link_parent[order], link_kid[order]
    lo = np.searchsorted(link_parent, pg[parent], "left")
    counts = np.searchsorted(link_parent, pg[parent], "right") - lo
    window = np.repeat(np.arange(len(parent), dtype=_I64), counts)  # each parent interval once per descendant
    kid = link_kid[iv.ranges(lo, counts)]
    w, cs, ce = iv.clip(pg, ps, pe, kid, ps[parent][window], pe[parent][window])
    g, own_s, own_e = iv.complement(window[w], cs, ce, ps[parent], pe[parent], ordered=False)
    alone = np.ones(len(pg), bool)
    alone[parent] = False
    return (np.concatenate([pg[alone], pg[parent][g]]), np.concatenate([ps[alone], own_s]),
            np.concatenate([pe[alone], own_e]))


def _overlap_by_phase(g, start, end, a, b, pieces: np.ndarray):
    """(piece, phase, ns) for each of the `pieces` (indices into a, b) and each phase g whose
    intervals (disjoint within a phase) overlap it, ns > 0.

    The overlapping (piece, interval) pairs are listed when there are fewer of them than pieces x
    phases (the usual case: a wait overlaps a few stages); otherwise, or past `_PAIRS`, every
    piece asks every phase, in chunks (many concurrent waits over a finely cut phase)."""
    a, b = a[pieces], b[pieces]
    empty = (np.empty(0, _I64),) * 3
    if not len(pieces) or not len(g):
        return empty
    by_start = np.argsort(start, kind="stable")
    # intervals that start inside a piece
    lo1 = np.searchsorted(start[by_start], a, "left")
    n1 = np.searchsorted(start[by_start], b, "left") - lo1
    # intervals that start before a piece and are still running at its start
    by_a = np.argsort(a, kind="stable")
    lo2 = np.searchsorted(a[by_a], start, "right")
    n2 = np.maximum(np.searchsorted(a[by_a], end, "left") - lo2, 0)
    phases = np.unique(g)
    pairs = int(n1.sum() + n2.sum())
    if pairs <= min(len(a) * len(phases), _PAIRS):
        q = np.concatenate([np.repeat(np.arange(len(a), dtype=_I64), n1), by_a[iv.ranges(lo2, n2)]])
        i = np.concatenate([by_start[iv.ranges(lo1, n1)], np.repeat(np.arange(len(g), dtype=_I64), n2)])
        ns = np.minimum(end[i], b[q]) - np.maximum(start[i], a[q])
        keep = ns > 0
        base = int(phases[-1]) + 1
        key = q[keep] * base + g[i[keep]]
        order = np.argsort(key, kind="stable")
        key, ns = key[order], ns[keep][order]
        if not len(key):
            return empty
        first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        total = np.add.reduceat(ns, first)  # a phase's intervals overlapping one piece, summed
        q, c = np.divmod(key[first], base)
        return pieces[q], c, total
    cov = iv.Coverage(g, start, end)
    out = []
    step = max(1, _PAIRS // len(phases))
    for lo in range(0, len(a), step):
        q = np.repeat(np.arange(lo, min(lo + step, len(a)), dtype=_I64), len(phases))
        c = np.tile(phases, len(q) // len(phases))
        ns = cov.between(c, a[q], b[q])
        keep = ns > 0
        out.append((pieces[q[keep]], c[keep], ns[keep]))
    return tuple(np.concatenate(col) for col in zip(*out))


def _attribute(pieces: pd.DataFrame, x: _Batch) -> pd.DataFrame:
    """One row per (piece, phase waited for) with the overlapping ns; waited_for None = nothing ran.

    Work is the self time of busy spans: a waiting thread's own enclosing span does not count,
    while another thread of the same process working meanwhile does.
    """
    s = x.s
    codes, names = s.phase, s.phase_names
    # each busy phase's self time merged once (whole spans, and the parents' pieces)
    _, _, mph, ma, me = x.m
    pr, pa_, pb_ = x.self_pieces
    busy_m = x.busy_phase[mph - 1]
    busy_p = x.busy[pr]
    (pg,), ps, pe = _union_by([(np.concatenate([mph[busy_m] - 1, codes[pr][busy_p]]), len(names))],
                              np.concatenate([ma[busy_m], pa_[busy_p]]), np.concatenate([me[busy_m], pb_[busy_p]]))
    up, down = x.parent_phase, x.child_phase
    link = x.busy_phase[up] & x.busy_phase[down] & (up != down)  # a busy phase directly inside another
    og, os_, oe = _own_segments(pg, ps, pe, _descendants(up[link], down[link]))
    a, b = pieces["a"].to_numpy(_I64), pieces["b"].to_numpy(_I64)
    measured = pieces["declared"].isna().to_numpy()
    # what ran meanwhile: (piece, phase, ns) for every phase that ran as itself during a measured piece
    q, c, ns = _overlap_by_phase(og, os_, oe, a, b, np.flatnonzero(measured))
    width = len(names)
    nothing = (b - a) - iv.Coverage(np.zeros(len(pg), _I64), ps, pe).between(np.zeros(len(a), _I64), a, b)
    whole = b - a
    # then "nothing ran" for measured pieces, the declared target for the others
    q = np.concatenate([q, np.flatnonzero(measured), np.flatnonzero(~measured)])
    c = np.concatenate([c, np.full(int(measured.sum()), width, _I64), np.full(int((~measured).sum()), width + 1, _I64)])
    ns = np.concatenate([ns, nothing[measured], whole[~measured]])
    keep = ns > 0
    order = np.lexsort((c[keep], q[keep]))  # piece by piece, phases in code order, as a table would list them
    row, col, ns = q[keep][order], c[keep][order], ns[keep][order]
    declared = pieces["declared"].to_numpy(object)
    targets = np.append(np.asarray(names, object), [None, None])[col]
    targets = np.where(col == width + 1, declared[row], targets)
    out = pieces.iloc[row].reset_index(drop=True)
    return out.assign(waited_for=targets, ns=ns)


def _who_ran(x: _Batch, waits: pd.DataFrame) -> np.ndarray:
    """For each wait row, the other process where the awaited phase ran longest in that step, or the
    waiting process itself when the phase ran only there (on another thread)."""
    s = x.s
    (kb, kp, kph), _, total = x.per_phase()
    other = np.flatnonzero(s.has_step & ~x.in_batch)  # spans of neighbouring steps in the loaded window
    scode, sval = pd.factorize(s.step[other])
    (ob, op, oph), _, ototal = _sum_by([(scode.astype(_I64), len(sval)), (x.proc1[other], x.nproc),
                                         (x.phase1[other], x.nphase)], s.total[other].astype(np.float64))
    step = np.concatenate([x.steps[kb], np.asarray(sval, _I64)[ob]])
    proc, phase = np.concatenate([kp, op]), np.concatenate([kph, oph])
    known = (proc > 0) & (phase > 0)
    ran = pd.DataFrame({"step": step[known], "phase": np.append(s.phase_names, None)[phase[known] - 1],
                        "process_id": np.append(s.proc_names, None)[proc[known] - 1],
                        "ns": np.round(np.concatenate([total, ototal])[known]).astype(_I64)})
    # longest first; ties by name (one answer however the steps were batched); a phase that ran 0 ns did not run
    ran = ran[ran["ns"] > 0].sort_values(["ns", "step", "phase", "process_id"], ascending=[False, True, True, True],
                                         kind="stable", ignore_index=True)
    best: dict[tuple, list[str]] = {}
    for step, ph, proc in zip(ran["step"].tolist(), ran["phase"].tolist(), ran["process_id"].tolist()):
        best.setdefault((step, ph), []).append(proc)
        best.setdefault((None, ph), {})[proc] = None  # the awaited work may belong to another step
    for key in [k for k in best if k[0] is None]:
        best[key] = list(best[key])  # each process once, in order of first appearance
    out = []
    for step, ph, proc in zip(waits["step"].tolist(), waits["waited_for"].tolist(), waits["process_id"].tolist()):
        ph = None if ph is None or ph is pd.NA or (isinstance(ph, float) and np.isnan(ph)) else ph
        ran_by = best.get((step, ph), []) + best.get((None, ph), [])
        other = next((p for p in ran_by if p != proc), None)
        out.append(other if other is not None else (proc if ran_by else None))
    return np.array(out, object)


def _last_child(s: Spans, parents: np.ndarray) -> dict[int, int]:
    """For each row in `parents`, its child that ends last; on ties, the one whose phase and then
    process sort last by name (what the rows hold, not where they were read: a per-part summary
    holds a union of children where the spans hold each)."""
    kids = np.flatnonzero(s.prow >= 0)
    if not len(kids) or not len(parents):
        return {}
    wanted = np.zeros(len(s), bool)
    wanted[parents] = True
    kids = kids[wanted[s.prow[kids]]]
    if not len(kids):
        return {}
    phase_rank = _rank(s.phase_names)[s.phase[kids]]
    proc_rank = _rank(s.proc_names)[s.proc[kids]]
    order = np.lexsort((proc_rank, phase_rank, s.end[kids], s.prow[kids]))
    kids = kids[order]
    is_last = np.ones(len(kids), bool)
    is_last[:-1] = s.prow[kids[1:]] != s.prow[kids[:-1]]
    return dict(zip(s.prow[kids[is_last]].tolist(), kids[is_last].tolist()))


def _rank(names: np.ndarray) -> np.ndarray:
    """Each code's rank in name order, the last entry (code -1: none) first."""
    order = np.argsort(np.array([str(n) for n in names], dtype=object), kind="stable")
    rank = np.empty(len(names) + 1, _I64)
    rank[order] = np.arange(1, len(names) + 1)
    rank[-1] = 0
    return rank


def _path_rows(x: _Batch) -> pd.DataFrame:
    """Critical path per step over top-level busy spans. A stage nested in another stage's span on
    the same thread is a link of its own (TRL: rollout → reward → train inside one training step),
    and the outer span's link starts where its last nested stage ended (its own time)."""
    s, busy = x.s, x.busy
    prow, proc, start, end = s.prow, s.proc, s.start, s.end
    parent = np.maximum(prow, 0)
    stage = x.code
    other_stage = (stage >= 0) & (stage[parent] >= 0) & (stage[parent] != stage)
    top = busy & x.in_batch & ((prow < 0) | ~busy[parent] | (proc[parent] != proc) | other_stage)
    outer, inner = x.outer, x.inner
    link_start = start.copy()
    np.maximum.at(link_start, outer, np.where(end[inner] <= end[outer], end[inner], start[outer]))
    steps = s.step
    tops = np.flatnonzero(top)
    tops = tops[np.lexsort((s.row[tops], steps[tops]))]
    cuts = np.flatnonzero(np.diff(steps[tops])) + 1  # one slice per step (no scan of every span per step)
    chains = []
    for idx in np.split(tops, cuts) if len(tops) else []:
        # by end, longer first on ties, then in load order (what a reader of the parts sees first)
        idx = idx[np.lexsort((s.row[idx], -(end[idx] - start[idx]), end[idx]))]
        ends = end[idx]
        chain = [idx[-1]]
        seen = {idx[-1]}  # spans ending within TOLERANCE_NS of each other (rollout and its nested reward) would cycle
        while True:
            cur = chain[-1]
            k = np.searchsorted(ends, link_start[cur] + TOLERANCE_NS, side="right")
            cand = [j for j in idx[:k][::-1][:64] if j not in seen and start[j] < link_start[cur]]
            if not cand:
                break
            best_end = end[cand[0]]
            ties = [j for j in cand if best_end - end[j] <= TOLERANCE_NS]
            chain.append(next((j for j in ties if proc[j] == proc[cur]), ties[0]))
            seen.add(chain[-1])
        chains.append(np.asarray(chain[::-1], _I64))
    if not chains:
        return pd.DataFrame()
    links = np.concatenate(chains)
    seq = np.concatenate([np.arange(len(c)) for c in chains])
    last = _last_child(s, links)
    child = np.array([last.get(int(i), -1) for i in links], _I64)
    has_child = child >= 0
    proc_names = np.append(s.proc_names, None)
    phase_names = np.append(s.phase_names, None)
    return _rows(
        "path",
        step=steps[links],
        seq=seq,
        process_id=proc_names[proc[links]],
        phase=phase_names[s.phase[links]],
        other=np.where(has_child, phase_names[s.phase[np.maximum(child, 0)]], None),
        other_process_id=np.where(has_child, proc_names[proc[np.maximum(child, 0)]], None),
        detail=s.strings("name", links),
        span_id=s.span_ids(links),
        start_ns=start[links],
        end_ns=end[links],
        seconds=(end[links] - start[links]) / 1e9,
    )


def _steps_text(steps: np.ndarray) -> str:
    """"3–7, 12" for a log line (ranges of consecutive steps, at most 6 of them)."""
    runs = np.split(steps, np.flatnonzero(np.diff(steps) != 1) + 1)
    text = ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs[:6])
    return text + (", …" if len(runs) > 6 else "")
