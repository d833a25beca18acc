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
  threads of the same process (a phase with child phases only where no child runs).
- sync: each `weight_sync` span with `rl.bytes` (seconds = duration, count = bytes, other = method).
- critical path: from the top-level busy span that ends last, repeatedly step back to the
  top-level busy span of the step that ended last before the current one started.

Everything runs on numpy arrays of integer codes (phases, processes, parent rows), never on
per-span Python objects: the work is a handful of sorts and cumulative maxima per batch
(`_intervals`). Unions are taken once per phase and then combined from the merged intervals,
which are far fewer than the spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rltrace.analysis import _intervals as iv
from rltrace._phases import STAGE_OF, TERM_OF_STAGE, TERMS, WAIT, containers
from rltrace._phases import term as term_of

VERSION = 4  # 4: stage time is own time (nested stages count once, innermost); nested and overlap rows
TOLERANCE_NS = 1_000_000  # critical path: a predecessor may end up to 1 ms after its successor starts

_COLUMNS = (
    "step kind seq process_id phase other other_process_id detail span_id start_ns end_ns seconds count total_ns version"
).split()
_I64 = np.int64


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 code per row, -1 for null; names as an object array) of a string column."""
    enc = pc.dictionary_encode(column)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks() if enc.num_chunks else pa.array([], pa.dictionary(pa.int32(), pa.string()))
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    return enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(_I64), names


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

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Spans:
        """From columns span_id, parent_span_id, phase, name, step, process_id, thread_id,
        start_ns, end_ns, waiting_for, sync_bytes, sync_method."""
        def ints(name, fill):
            return table[name].fill_null(fill).to_numpy().astype(_I64)

        start = ints("start_ns", 0)
        order = np.argsort(start, kind="stable")
        inverse = np.empty(len(order), _I64)
        inverse[order] = np.arange(len(order), dtype=_I64)
        parent = pc.index_in(table["parent_span_id"], value_set=table["span_id"]).fill_null(-1)
        parent = parent.to_numpy().astype(_I64)[order]
        phase, phase_names = _codes(table["phase"])
        proc, proc_names = _codes(table["process_id"])
        return cls(
            table=table,
            row=order,
            step=ints("step", 0)[order],
            has_step=table["step"].is_valid().to_numpy(zero_copy_only=False)[order],
            phase=phase[order],
            phase_names=phase_names,
            proc=proc[order],
            proc_names=proc_names,
            thread=ints("thread_id", -1)[order],
            start=start[order],
            end=ints("end_ns", 0)[order],
            prow=np.where(parent >= 0, inverse[np.maximum(parent, 0)], -1),
            sync_bytes=table["sync_bytes"].cast(pa.float64()).fill_null(np.nan).to_numpy()[order],
        )

    def __len__(self) -> int:
        return len(self.start)

    def strings(self, column: str, rows: np.ndarray) -> np.ndarray:
        """Values of a string column for some rows (in this order), None for null."""
        return np.asarray(self.table[column].take(pa.array(self.row[rows])).to_pylist(), dtype=object)

    def lookup(self, table: dict, default) -> np.ndarray:
        """`table[phase]` for every span, through the phase codes (code -1 gets the default)."""
        values = [table.get(n, default) for n in self.phase_names] + [default]
        return np.array(values, dtype=object if default is None else None)[self.phase]


def _rows(kind: str, **cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    frame = pd.DataFrame({c: cols.get(c, [None] * n) for c in _COLUMNS if c != "kind"})
    frame.insert(1, "kind", kind)
    frame["version"] = VERSION
    return frame


def _group(*columns: tuple[np.ndarray, int]) -> tuple[np.ndarray, int, list[np.ndarray]]:
    """Group rows by several small non-negative integer columns, given as (values, size).

    Returns (group id per row, number of groups, each column's value per group), groups in
    ascending key order.
    """
    key = np.zeros(len(columns[0][0]), _I64)
    for values, size in columns:
        key = key * max(int(size), 1) + values
    gid, uniq = pd.factorize(key, sort=True)
    out = []
    rest = uniq.astype(_I64)
    for _, size in reversed(columns):
        out.append(rest % max(int(size), 1))
        rest = rest // max(int(size), 1)
    return gid.astype(_I64), len(uniq), out[::-1]


def compute(spans: Spans, checks: pd.DataFrame) -> pd.DataFrame:
    """Summary rows for the steps in `checks` (step, count, start_ns, end_ns, total_ns).

    `spans`: every finished span overlapping those steps' windows.
    """
    s = spans
    prow = s.prow
    has_parent = prow >= 0
    pairs = np.unique(s.phase[prow[has_parent]] * (len(s.phase_names) + 1) + s.phase[has_parent])
    width = len(s.phase_names) + 1
    names = np.append(s.phase_names, None)
    container_phases = containers(zip(names[pairs // width], names[pairs % width]))
    busy = ~np.isin(s.phase, [k for k, n in enumerate(s.phase_names) if n in container_phases | {WAIT}])
    in_batch = s.has_step & np.isin(s.step, checks["step"].to_numpy(_I64))
    step_code, steps = pd.factorize(np.where(in_batch, s.step, 0))
    step_code = np.where(in_batch, step_code, -1).astype(_I64)
    steps = np.asarray(steps, _I64)
    own = _own_stage_time(s)
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
        _phase_rows(s, step_code, steps),
        *_stage_rows(s, own, step_code, steps),
        _wait_rows(s, checks, busy, step_code, steps),
        _path_rows(s, busy, in_batch, own[1]),
        _sync_rows(s, in_batch),
    ]
    return pd.concat([f for f in frames if len(f)], ignore_index=True)


def _sync_rows(s: Spans, in_batch: np.ndarray) -> pd.DataFrame:
    """Weight-sync spans with a payload size: seconds = duration, count = bytes, other = method."""
    sync = np.flatnonzero(in_batch & (s.lookup({"weight_sync": True}, False).astype(bool)) & ~np.isnan(s.sync_bytes))
    if not len(sync):
        return pd.DataFrame()
    return _rows(
        "sync",
        step=s.step[sync],
        process_id=s.proc_names[s.proc[sync]],
        phase=s.phase_names[s.phase[sync]],
        other=s.strings("sync_method", sync),
        span_id=s.strings("span_id", sync),
        seconds=(s.end[sync] - s.start[sync]) / 1e9,
        count=np.round(s.sync_bytes[sync]).astype(_I64),
    )


def _union_rows(gid: np.ndarray, n_groups: int, s: Spans, rows: np.ndarray):
    """(seconds, count, total_ns) per group of the spans `rows`."""
    covered = iv.total(gid, s.start[rows], s.end[rows], n_groups)
    count = np.bincount(gid, minlength=n_groups)
    total = np.bincount(gid, weights=(s.end[rows] - s.start[rows]).astype(np.float64), minlength=n_groups)
    return covered / 1e9, count, np.round(total).astype(_I64)


def _phase_rows(s: Spans, step_code: np.ndarray, steps: np.ndarray) -> pd.DataFrame:
    rows = np.flatnonzero(step_code >= 0)
    if not len(rows):
        return pd.DataFrame()
    nproc, nphase = len(s.proc_names) + 1, len(s.phase_names) + 1
    out = []
    for per_process in (True, False):
        cols = [(step_code[rows], len(steps)), (s.phase[rows] + 1, nphase)]
        if per_process:
            cols.insert(1, (s.proc[rows] + 1, nproc))
        gid, n, keys = _group(*cols)
        seconds, count, total = _union_rows(gid, n, s, rows)
        proc = np.append(s.proc_names, None)[keys[1] - 1] if per_process else np.full(n, None, object)
        out.append(_rows("phase", step=steps[keys[0]], process_id=proc,
                         phase=np.append(s.phase_names, None)[keys[-1] - 1],
                         seconds=seconds, count=count, total_ns=total))
    # per process first, then across processes, each by step and names (what a reader expects)
    return pd.concat(out, ignore_index=True)


def _stage_code(s: Spans) -> np.ndarray:
    return s.lookup({p: list(TERM_OF_STAGE).index(st) for p, st in STAGE_OF.items()}, -1).astype(_I64)


def _same_thread_parent(s: Spans) -> np.ndarray:
    """Parent row of each span when the parent ran on the same process and thread, else -1."""
    parent = np.maximum(s.prow, 0)
    same = (s.prow >= 0) & (s.proc[parent] == s.proc) & (s.thread[parent] == s.thread)
    return np.where(same, s.prow, -1)


def _own_stage_time(s: Spans):
    """Each staged span's own time: its interval minus same-thread descendants of another stage.

    Returns (row, start, end) pieces for spans with a stage, and the (outer row, inner row) pairs
    that were taken out (every staged ancestor of another stage, so `train > forward > rollout`
    takes rollout out of both).
    """
    code = _stage_code(s)
    up = _same_thread_parent(s)
    inner = np.flatnonzero(code >= 0)
    anc = up[inner]
    outer_l, inner_l = [], []
    while len(inner):
        live = anc >= 0
        inner, anc = inner[live], anc[live]
        hit = (code[anc] >= 0) & (code[anc] != code[inner])
        outer_l.append(anc[hit])
        inner_l.append(inner[hit])
        anc = up[anc]
    outer = np.concatenate(outer_l) if outer_l else np.empty(0, _I64)
    nested = np.concatenate(inner_l) if inner_l else np.empty(0, _I64)
    staged = np.flatnonzero(code >= 0)
    return _minus(staged, outer, s.start[nested], s.end[nested], s.start, s.end), (outer, nested)


def _minus(rows: np.ndarray, group: np.ndarray, a: np.ndarray, b: np.ndarray, start, end):
    """Pieces (row, start, end) of each span in `rows` minus the intervals [a, b) given for it
    (`group` = its row). Spans with nothing to take out come back whole, without a sort."""
    n = len(start)
    wanted = np.zeros(n, bool)
    wanted[rows] = True
    cut = np.zeros(n, bool)
    cut[group[wanted[group]]] = True
    whole = rows[~cut[rows]]
    sliced = np.flatnonzero(cut)
    pos = np.full(n, -1, _I64)
    pos[sliced] = np.arange(len(sliced), dtype=_I64)
    valid = pos[group] >= 0
    g, ps, pe = iv.complement(pos[group[valid]], a[valid], b[valid], start[sliced], end[sliced], ordered=False)
    return (np.concatenate([whole, sliced[g]]), np.concatenate([start[whole], ps]),
            np.concatenate([end[whole], pe]))


_TAGS = (*TERMS, "reward")  # stage rows: the three cost terms, and reward on its own


def _stage_rows(s: Spans, own, step_code: np.ndarray, steps: np.ndarray) -> list[pd.DataFrame]:
    """`stage` rows (R, T, W, reward: own-time unions), `nested` rows and `overlap` rows, from the
    own-time pieces and nesting pairs of `_own_stage_time`."""
    (rows, a, b), (outer, inner) = own
    term = s.lookup({p: TERMS.index(term_of(p)) for p in STAGE_OF}, -1).astype(_I64)
    reward = s.lookup({"reward": True}, False).astype(bool)
    mine = step_code[rows] >= 0
    r, pa_, pb = rows[mine], a[mine], b[mine]
    with_term = term[r] >= 0
    with_reward = reward[r]
    pr = np.concatenate([r[with_term], r[with_reward]])
    tag = np.concatenate([term[r][with_term], np.full(int(with_reward.sum()), len(TERMS), _I64)])
    ta = np.concatenate([pa_[with_term], pa_[with_reward]])
    tb = np.concatenate([pb[with_term], pb[with_reward]])
    out = []
    if len(pr):
        gid, n, (gstep, gtag) = _group((step_code[pr], len(steps)), (tag, len(_TAGS)))
        covered = iv.total(gid, ta, tb, n)
        # count and summed durations per span, not per piece (a span cut in two counts once)
        first = np.ones(len(pr), bool)
        seen = pd.DataFrame({"g": gid, "r": pr}).duplicated().to_numpy()
        first &= ~seen
        count = np.bincount(gid[first], minlength=n)
        dur = (s.end - s.start)[pr[first]].astype(np.float64)
        total = np.round(np.bincount(gid[first], weights=dur, minlength=n)).astype(_I64)
        out.append(_rows("stage", step=steps[gstep], phase=np.array(_TAGS, object)[gtag],
                         seconds=covered / 1e9, count=count, total_ns=total))
    out.append(_nested_rows(s, outer, inner, step_code, steps))
    out.append(_overlap_rows(rows, a, b, term[rows], step_code, steps))
    return [f for f in out if len(f)]


def _nested_rows(s: Spans, outer: np.ndarray, inner: np.ndarray, step_code, steps) -> pd.DataFrame:
    """Per step, (outer stage, inner stage): how long the inner one ran inside the outer one."""
    keep = step_code[outer] >= 0
    outer, inner = outer[keep], inner[keep]
    if not len(outer):
        return pd.DataFrame()
    code = _stage_code(s)
    stages = np.array(list(TERM_OF_STAGE), object)
    gid, n, (gstep, gout, gin) = _group((step_code[outer], len(steps)), (code[outer], len(stages)),
                                        (code[inner], len(stages)))
    covered = iv.total(gid, s.start[inner], s.end[inner], n)
    # groups in (step, outer name, inner name) order, as a reader sorting by name expects
    frame = _rows("nested", step=steps[gstep], phase=stages[gout], other=stages[gin], seconds=covered / 1e9,
                  count=np.bincount(gid, minlength=n))
    return frame.sort_values(["step", "phase", "other"], kind="stable", ignore_index=True)


def _overlap_rows(rows, a, b, code, step_code, steps) -> pd.DataFrame:
    """Per step and term X: time X's own intervals ran while another term ran anywhere."""
    staged = code >= 0
    rows, a, b, code = rows[staged], a[staged], b[staged], code[staged]
    mine = step_code[rows] >= 0
    if not mine.any():
        return pd.DataFrame()
    # each term's own time merged once (any step: async stages overlap across steps), then
    # "every term but k" from those merged intervals, far fewer than the pieces
    tg, ts, te = iv.union(code, a, b)
    k = len(TERMS)
    g = np.concatenate([np.full(int((tg != j).sum()), j, _I64) for j in range(k)])
    others = iv.Coverage(g, np.concatenate([ts[tg != j] for j in range(k)]),
                         np.concatenate([te[tg != j] for j in range(k)]))
    gid, n, (gstep, gterm) = _group((step_code[rows[mine]], len(steps)), (code[mine], k))
    ug, us, ue = iv.union(gid, a[mine], b[mine])
    ns = others.between(gterm[ug], us, ue)
    total = np.bincount(ug, weights=ns.astype(np.float64), minlength=n)
    return _rows("overlap", step=steps[gstep], phase=np.array(TERMS, object)[gterm], seconds=total / 1e9)


def _self_time(s: Spans):
    """(span row, start, end) pieces of each span where none of its children on the same thread runs."""
    up = _same_thread_parent(s)
    child = np.flatnonzero(up >= 0)
    return _minus(np.arange(len(s), dtype=_I64), up[child], s.start[child], s.end[child], s.start, s.end)


def _wait_rows(s: Spans, checks, busy, step_code, steps) -> pd.DataFrame:
    nproc = len(s.proc_names)
    if nproc == 0 or not len(s):
        return pd.DataFrame()
    start, end = s.start, s.end
    # a span with no process counts as its own "process" code nproc (as a NULL group would)
    proc = np.where(s.proc >= 0, s.proc, nproc)
    lo = np.full(nproc + 1, min(start.min(), checks["start_ns"].min()), _I64)
    hi = np.full(nproc + 1, max(end.max(), checks["end_ns"].max()), _I64)
    waiting = s.lookup({WAIT: True}, False).astype(bool)

    # idle: windows of (step, participating process) minus that process's busy and wait spans
    active = busy | waiting
    idle_g, idle_s, idle_e = iv.complement(proc[active], start[active], end[active], lo, hi)
    batch = step_code >= 0
    pgid, _, (pstep, pproc) = _group((step_code[batch], len(steps)), (proc[batch], nproc + 1))
    cstep = checks.set_index("step")
    wstart = cstep.loc[steps[pstep], "start_ns"].to_numpy(_I64)
    wend = cstep.loc[steps[pstep], "end_ns"].to_numpy(_I64)
    win, a, b = iv.clip(idle_g, idle_s, idle_e, pproc, wstart, wend)
    idle = pd.DataFrame({"step": steps[pstep][win], "proc": pproc[win], "a": a, "b": b}).assign(
        in_phase="idle", detail="idle", declared=None)

    # wait spans of the batch's steps, over their self time (their thread is waiting, whatever encloses it)
    own = _self_time(s)
    keep = waiting[own[0]] & batch[own[0]]
    rows, a, b = own[0][keep], own[1][keep], own[2][keep]
    parent = s.prow[rows]
    parent_phase = np.where(parent >= 0, np.append(s.phase_names, None)[s.phase[np.maximum(parent, 0)]], WAIT)
    declared = s.strings("waiting_for", rows)
    waits = pd.DataFrame({
        "step": s.step[rows],
        "proc": proc[rows],
        "a": a,
        "b": b,
        "in_phase": parent_phase,
        "detail": np.where(pd.isna(declared), "wait_span", "declared"),
        "declared": declared,
    })
    pieces = pd.concat([f for f in (idle, waits) if len(f)], ignore_index=True) if len(idle) or len(waits) else idle
    if pieces.empty:
        return pd.DataFrame()
    attributed = _attribute(pieces, s, busy, own)
    attributed["process_id"] = np.append(s.proc_names, None)[attributed["proc"].to_numpy()]
    keys = ["step", "process_id", "detail", "in_phase", "waited_for"]
    agg = attributed.groupby(keys, dropna=False, sort=True).agg(seconds=("ns", "sum"), count=("ns", "size")).reset_index()
    agg["seconds"] = agg["seconds"] / 1e9
    agg["other_process_id"] = _who_ran(s, agg, step_code, steps)
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


def _attribute(pieces: pd.DataFrame, s: Spans, busy, own) -> pd.DataFrame:
    """One row per (piece, phase waited for) with the overlapping ns; waited_for None = nothing ran.

    Work is the self time of busy spans (`own` from `_self_time`): a waiting thread's own enclosing
    span does not count, while another thread of the same process working meanwhile does.
    """
    codes, names = s.phase, s.phase_names
    prow = s.prow
    own_row, own_s, own_e = own
    working = busy[own_row]
    # each busy phase's self time merged once; every coverage group is built from those
    pg, ps, pe = iv.union(codes[own_row][working], own_s[working], own_e[working])
    busy_codes = np.unique(codes[busy])
    nested = np.flatnonzero(busy & (prow >= 0))
    nested = nested[busy[prow[nested]] & (codes[prow[nested]] != codes[nested])]
    link = np.unique(codes[prow[nested]] * (len(names) + 1) + codes[nested])
    children = _descendants(link // (len(names) + 1), link % (len(names) + 1))
    # coverage groups: each busy phase; each parent phase with its descendants; the descendants alone; all busy
    groups: list[tuple[object, set[int]]] = [(int(c), {int(c)}) for c in busy_codes]
    groups += [((c, "+"), {c} | kids) for c, kids in children.items()]
    groups += [((c, ":"), kids) for c, kids in children.items()]
    groups.append(("*", {int(c) for c in busy_codes}))
    index = {key: k for k, (key, _) in enumerate(groups)}
    g_list, s_list, e_list = [], [], []
    for k, (_, members) in enumerate(groups):
        mask = np.isin(pg, list(members))
        g_list.append(np.full(mask.sum(), k, _I64))
        s_list.append(ps[mask])
        e_list.append(pe[mask])
    cov = iv.Coverage(np.concatenate(g_list), np.concatenate(s_list), np.concatenate(e_list))
    a, b = pieces["a"].to_numpy(_I64), pieces["b"].to_numpy(_I64)
    n = len(pieces)

    def covered(key) -> np.ndarray:
        return cov.between(np.full(n, index[key], _I64), a, b)

    out = []
    measured = pieces["declared"].isna().to_numpy()
    for c in busy_codes:
        c = int(c)
        ns = covered((c, "+")) - covered((c, ":")) if c in children else covered(c)
        out.append(pieces.assign(waited_for=names[c], ns=ns)[measured & (ns > 0)])
    nothing = (b - a) - covered("*")
    out.append(pieces.assign(waited_for=None, ns=nothing)[measured & (nothing > 0)])
    out.append(pieces.assign(waited_for=pieces["declared"], ns=b - a)[~measured])
    return pd.concat(out, ignore_index=True)


def _who_ran(s: Spans, waits: pd.DataFrame, step_code, steps) -> np.ndarray:
    """For each wait row, the other process where the awaited phase ran longest in that step, or the
    waiting process itself when the phase ran only there (on another thread)."""
    loaded = np.flatnonzero(s.has_step & (s.proc >= 0) & (s.phase >= 0))
    scode, sval = pd.factorize(s.step[loaded])
    gid, n, (gs, gph, gpr) = _group((scode.astype(_I64), len(sval)), (s.phase[loaded], len(s.phase_names)),
                                    (s.proc[loaded], len(s.proc_names)))
    ns = np.bincount(gid, weights=(s.end - s.start)[loaded].astype(np.float64), minlength=n)
    ran = pd.DataFrame({"step": np.asarray(sval, _I64)[gs], "phase": s.phase_names[gph],
                        "process_id": s.proc_names[gpr], "ns": np.round(ns).astype(_I64)})
    ran = ran.sort_values(["step", "phase", "process_id"], kind="stable", ignore_index=True)
    ran = ran.sort_values("ns", ascending=False)
    best: dict[tuple, list[str]] = {}
    for step, ph, proc in zip(ran["step"].tolist(), ran["phase"].tolist(), ran["process_id"].tolist()):
        best.setdefault((step, ph), []).append(proc)
        best.setdefault((None, ph), []).append(proc)  # the awaited work may belong to another step
    out = []
    for step, ph, proc in zip(waits["step"].tolist(), waits["waited_for"].tolist(), waits["process_id"].tolist()):
        ph = None if ph is None or ph is pd.NA or (isinstance(ph, float) and np.isnan(ph)) else ph
        ran_by = best.get((step, ph), []) + best.get((None, ph), [])
        others = [p for p in ran_by if p != proc]
        out.append(others[0] if others else (proc if ran_by else None))
    return np.array(out, object)


def _last_child(s: Spans, parents: np.ndarray) -> dict[int, int]:
    """For each row in `parents`, its child that ends last (latest loaded on ties), if any."""
    kids = np.flatnonzero(s.prow >= 0)
    if not len(kids) or not len(parents):
        return {}
    wanted = np.zeros(len(s), bool)
    wanted[parents] = True
    kids = kids[wanted[s.prow[kids]]]
    if not len(kids):
        return {}
    order = np.lexsort((s.row[kids], s.end[kids], s.prow[kids]))
    kids = kids[order]
    is_last = np.ones(len(kids), bool)
    is_last[:-1] = s.prow[kids[1:]] != s.prow[kids[:-1]]
    return dict(zip(s.prow[kids[is_last]].tolist(), kids[is_last].tolist()))


def _path_rows(s: Spans, busy, in_batch, nesting) -> pd.DataFrame:
    """Critical path per step over top-level busy spans. A stage nested in another stage's span on
    the same thread is a link of its own (TRL: rollout → reward → train inside one training step),
    and the outer span's link starts where its last nested stage ended (its own time)."""
    prow, proc, start, end = s.prow, s.proc, s.start, s.end
    parent = np.maximum(prow, 0)
    stage = _stage_code(s)
    other_stage = (stage >= 0) & (stage[parent] >= 0) & (stage[parent] != stage)
    top = busy & in_batch & ((prow < 0) | ~busy[parent] | (proc[parent] != proc) | other_stage)
    outer, inner = nesting
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
        span_id=s.strings("span_id", links),
        start_ns=start[links],
        end_ns=end[links],
        seconds=(end[links] - start[links]) / 1e9,
    )
