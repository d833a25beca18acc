"""The reference implementation of the per-step summaries, kept only to check the product.

This is rltrace's summary algorithm (version 5) as first written, over a pandas frame of spans:
slow (about 10 s per million spans) but plainly correct and proven on every known-answer run.
`rltrace.analysis._compute` is the fast one; `tests/conftest.py` checks that both agree on every
summary the test suite computes (`assert_same`).

Per-step results that need interval arithmetic: phase and stage times, waits, critical path.

`compute(spans, checks)` turns the finished spans overlapping a batch of steps into rows of the
`step_summary` table (schema in `rltrace._names`); `summary.py` caches them per connection and
`rltrace compact` stores them. Definitions (docs/analysis.md):

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
  inside one of the process's own container spans while nothing ran anywhere is that
  container's work and no wait; a step with no busy span gives no wait rows.
- sync: each `weight_sync` span (start_ns, end_ns, seconds = duration, count = `rl.bytes` or NULL,
  other = method).
- critical path: from the top-level busy span that ends last, repeatedly step back to the
  top-level busy span of the step that ended last before the current one started.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rltrace.analysis import _intervals as iv
from rltrace._phases import STAGE_OF, TERM_OF_STAGE, TERMS, WAIT, containers
from rltrace._phases import term as term_of

VERSION = 10  # 4: stage time is own time (nested stages count once, innermost); nested and overlap rows
# 5: a sync row for every weight_sync span, with its start and end (count NULL without rl.bytes)
# 6: a container's own time with nothing running anywhere is its work, not idle; no waits from a step with no work
# 7: child rows (the phases directly inside a stage's spans: reward functions, tool calls, engines)
# 8: ties broken by what rows hold (phase, process names), so spans and per-part summaries give one answer
# 9: the process that ran an awaited phase longest: ties by name, a phase's 0 ns runs left out
# 10: time before a process's first span (of the run) is its start-up, not a wait
TOLERANCE_NS = 1_000_000  # critical path: a predecessor may end up to 1 ms after its successor starts

_COLUMNS = (
    "step kind seq process_id phase other other_process_id detail span_id start_ns end_ns seconds count total_ns version"
).split()


def frame(table) -> pd.DataFrame:
    """The spans a batch loaded (an Arrow table) as the frame this reference reads: span ids as hex
    text, as they were when it was written (stored ids are integers, `rltrace.store.ids`)."""
    import pyarrow as pa

    from rltrace.store import ids

    for name in ("span_id", "parent_span_id"):
        if name in table.column_names and not pa.types.is_string(table.schema.field(name).type):
            column = pa.array([ids.span_hex(v) for v in table.column(name).to_pylist()], pa.string())
            table = table.set_column(table.column_names.index(name), name, column)
    return table.to_pandas()


def _rows(kind: str, **cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    frame = pd.DataFrame({c: cols.get(c, [None] * n) for c in _COLUMNS if c != "kind"})
    frame.insert(1, "kind", kind)
    frame["version"] = VERSION
    return frame


def compute(spans: pd.DataFrame, checks: pd.DataFrame, firsts: dict | None = None, lasts: dict | None = None) -> pd.DataFrame:
    """Summary rows for the steps in `checks` (step, count, start_ns, end_ns, total_ns).

    `spans`: every finished span overlapping those steps' windows, with columns span_id,
    parent_span_id, phase, name, step, process_id, thread_id, start_ns, end_ns, waiting_for, sync_bytes,
    sync_method.
    """
    spans = spans.reset_index(drop=True)
    if "count" not in spans:  # rows of per-part summaries stand for `count` spans of `total_ns` summed; a span for itself
        spans = spans.assign(count=1, total_ns=spans["end_ns"] - spans["start_ns"])
    phases = pd.factorize(spans["phase"])
    parent_row = pd.Series(np.arange(len(spans)), index=spans["span_id"])
    parent_row = parent_row[parent_row.index.notna() & ~parent_row.index.duplicated()]  # a union of a summary has no id
    prow = spans["parent_span_id"].map(parent_row).fillna(-1).astype(np.int64).to_numpy()
    phase = spans["phase"].to_numpy(object)
    has_parent = prow >= 0
    pairs = set(zip(phase[prow[has_parent]], phase[has_parent]))
    container_phases = containers(pairs)
    busy = ~np.isin(phase, sorted(container_phases | {WAIT}))
    in_batch = spans["step"].isin(checks["step"]).to_numpy()
    own = _own_stage_time(spans, phases, prow)
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
        _phase_rows(spans[in_batch]),
        *_stage_rows(spans, phases, own, in_batch),
        _wait_rows(spans, checks, prow, busy, in_batch, container_phases, firsts or {}, lasts or {}),
        _path_rows(spans, prow, busy, in_batch, phases, own[1]),
        _sync_rows(spans[in_batch]),
        _child_rows(spans, prow, in_batch),
    ]
    return pd.concat([f for f in frames if len(f)], ignore_index=True)


def _child_rows(spans: pd.DataFrame, prow: np.ndarray, in_batch: np.ndarray) -> pd.DataFrame:
    """Per step, (stage phase, phase of a span directly inside one of its spans): union seconds, spans."""
    kid = np.flatnonzero(in_batch & (prow >= 0))
    phase = spans["phase"].to_numpy(object)
    parent, child = phase[prow[kid]], phase[kid]
    keep = np.isin(parent, list(STAGE_OF)) & (child != parent)
    kid, parent, child = kid[keep], parent[keep], child[keep]
    if not len(kid):
        return pd.DataFrame()
    frame = pd.DataFrame({"step": spans["step"].to_numpy()[kid], "parent": parent, "child": child,
                          "a": spans["start_ns"].to_numpy(np.int64)[kid], "b": spans["end_ns"].to_numpy(np.int64)[kid],
                          "w": spans["count"].to_numpy(np.int64)[kid]})  # a union row stands for `count` spans
    groups = frame.groupby(["step", "parent", "child"], sort=True)
    covered = iv.total(groups.ngroup().to_numpy(), frame["a"].to_numpy(), frame["b"].to_numpy(), groups.ngroups)
    keys = groups["w"].sum().reset_index()
    return _rows("child", step=keys["step"].to_numpy(), phase=keys["parent"].to_numpy(object),
                 other=keys["child"].to_numpy(object), seconds=covered / 1e9, count=keys["w"].to_numpy())


def _sync_rows(spans: pd.DataFrame) -> pd.DataFrame:
    """Every weight-sync span: start and end, seconds = duration, count = bytes (NULL without
    `rl.bytes`), other = method."""
    sync = spans[spans["phase"] == "weight_sync"]
    if sync.empty:
        return pd.DataFrame()
    return _rows(
        "sync",
        step=sync["step"].to_numpy(),
        process_id=sync["process_id"].to_numpy(object),
        phase=sync["phase"].to_numpy(object),
        other=sync["sync_method"].to_numpy(object),
        span_id=sync["span_id"].to_numpy(object),
        start_ns=sync["start_ns"].to_numpy(),
        end_ns=sync["end_ns"].to_numpy(),
        seconds=((sync["end_ns"] - sync["start_ns"]) / 1e9).to_numpy(),
        count=[None if pd.isna(b) else int(round(b)) for b in sync["sync_bytes"]],
    )


def _union_seconds(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    groups = frame.groupby(keys, sort=True, dropna=False)
    codes = groups.ngroup().to_numpy()
    covered = iv.total(codes, frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy(), groups.ngroups)
    out = groups.agg(count=("count", "sum"), total_ns=("duration_ns", "sum")).reset_index()
    out["seconds"] = covered / 1e9
    return out


def _phase_rows(spans: pd.DataFrame) -> pd.DataFrame:
    if spans.empty:
        return pd.DataFrame()
    spans = spans.assign(duration_ns=spans["total_ns"])
    per_process = _union_seconds(spans, ["step", "process_id", "phase"])
    overall = _union_seconds(spans, ["step", "phase"]).assign(process_id=None)
    both = pd.concat([per_process, overall], ignore_index=True)
    return _rows(
        "phase",
        step=both["step"].to_numpy(),
        process_id=both["process_id"].to_numpy(object),
        phase=both["phase"].to_numpy(object),
        seconds=both["seconds"].to_numpy(),
        count=both["count"].to_numpy(),
        total_ns=both["total_ns"].to_numpy(),
    )


def _lookup(phases: tuple, table: dict, default):
    """`table[phase]` for every span, from `pd.factorize` of the phases (a per-row map is seconds at
    1M spans); code -1 (no phase) gets the default."""
    codes, names = phases
    values = np.array([table.get(n, default) for n in names] + [default], dtype=object if default is None else None)
    return values[codes]


def _same_thread_parent(spans: pd.DataFrame, prow: np.ndarray) -> np.ndarray:
    """Parent row of each span when the parent ran on the same process and thread, else -1."""
    proc = pd.factorize(spans["process_id"])[0]
    thread = spans["thread_id"].fillna(-1).to_numpy(np.int64)
    parent = np.maximum(prow, 0)
    same = (prow >= 0) & (proc[parent] == proc) & (thread[parent] == thread)
    return np.where(same, prow, -1)


def _own_stage_time(spans: pd.DataFrame, phases: tuple, prow: np.ndarray):
    """Each staged span's own time: its interval minus same-thread descendants of another stage.

    Returns (row, start, end) pieces for spans with a stage, and the (outer row, inner row) pairs
    that were taken out (every staged ancestor of another stage, so `train > forward > rollout`
    takes rollout out of both).
    """
    code = _lookup(phases, {p: list(TERM_OF_STAGE).index(st) for p, st in STAGE_OF.items()}, -1).astype(np.int64)
    up = _same_thread_parent(spans, prow)
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    inner = np.flatnonzero(code >= 0)
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
    outer = np.concatenate(outer_l) if outer_l else np.empty(0, np.int64)
    nested = np.concatenate(inner_l) if inner_l else np.empty(0, np.int64)
    rows, a, b = iv.complement(outer, start[nested], end[nested], start, end)
    keep = code[rows] >= 0
    return (rows[keep], a[keep], b[keep]), (outer, nested)


_TAGS = (*TERMS, "reward")  # stage rows: the three cost terms, and reward on its own


def _stage_rows(spans: pd.DataFrame, phases: tuple, own, in_batch: np.ndarray) -> list[pd.DataFrame]:
    """`stage` rows (R, T, W, reward: own-time unions), `nested` rows and `overlap` rows, from the
    own-time pieces and nesting pairs of `_own_stage_time`."""
    if spans.empty:
        return []
    (rows, a, b), (outer, inner) = own
    term = _lookup(phases, {p: TERMS.index(term_of(p)) for p in STAGE_OF}, -1).astype(np.int64)
    reward = _lookup(phases, {"reward": True}, False).astype(bool)
    steps = spans["step"].to_numpy()
    mine = in_batch[rows]
    r, pa_, pb = rows[mine], a[mine], b[mine]
    both = np.concatenate([np.flatnonzero(term[r] >= 0), np.flatnonzero(reward[r])])
    tag = np.concatenate([term[r][term[r] >= 0], np.full(int(reward[r].sum()), len(TERMS), np.int64)])
    tagged = pd.DataFrame({"step": steps[r][both].astype(np.int64), "tag": tag, "row": r[both],
                           "a": pa_[both], "b": pb[both]})
    out = []
    if len(tagged):
        groups = tagged.groupby(["step", "tag"], sort=True)
        covered = iv.total(groups.ngroup().to_numpy(), tagged["a"].to_numpy(), tagged["b"].to_numpy(), groups.ngroups)
        dur = spans["total_ns"].to_numpy(np.int64)
        weight = spans["count"].to_numpy(np.int64)
        per_row = tagged.drop_duplicates(["step", "tag", "row"])
        rows_ = per_row["row"].to_numpy()
        agg = per_row.assign(d=dur[rows_], w=weight[rows_]).groupby(["step", "tag"], sort=True).agg(
            count=("w", "sum"), total_ns=("d", "sum")).reset_index()
        out.append(_rows("stage", step=agg["step"].to_numpy(), phase=np.array(_TAGS, object)[agg["tag"].to_numpy()],
                         seconds=covered / 1e9, count=agg["count"].to_numpy(), total_ns=agg["total_ns"].to_numpy()))
    out.append(_nested_rows(spans, phases, outer, inner, in_batch))
    out.append(_overlap_rows(rows, a, b, term[rows], steps, in_batch))
    return [f for f in out if len(f)]


def _nested_rows(spans: pd.DataFrame, phases: tuple, outer: np.ndarray, inner: np.ndarray,
                 in_batch: np.ndarray) -> pd.DataFrame:
    """Per step, (outer stage, inner stage): how long the inner one ran inside the outer one."""
    keep = in_batch[outer]
    outer, inner = outer[keep], inner[keep]
    if not len(outer):
        return pd.DataFrame()
    stage = _lookup(phases, STAGE_OF, None)
    frame = pd.DataFrame({
        "step": spans["step"].to_numpy()[outer],
        "outer": stage[outer],
        "inner": stage[inner],
        "a": spans["start_ns"].to_numpy(np.int64)[inner],
        "b": spans["end_ns"].to_numpy(np.int64)[inner],
    })
    groups = frame.groupby(["step", "outer", "inner"], sort=True)
    covered = iv.total(groups.ngroup().to_numpy(), frame["a"].to_numpy(), frame["b"].to_numpy(), groups.ngroups)
    keys = groups.size().reset_index()
    return _rows("nested", step=keys["step"].to_numpy(), phase=keys["outer"].to_numpy(object),
                 other=keys["inner"].to_numpy(object), seconds=covered / 1e9, count=keys[0].to_numpy())


def _overlap_rows(rows, a, b, code, steps, in_batch) -> pd.DataFrame:
    """Per step and term X: time X's own intervals ran while another term ran anywhere."""
    staged = code >= 0
    rows, a, b, code = rows[staged], a[staged], b[staged], code[staged]
    if not len(rows):
        return pd.DataFrame()
    # group k = "every term but k", built from all loaded spans (any step: async stages overlap across steps)
    g = np.concatenate([np.full(int((code != k).sum()), k, np.int64) for k in range(len(TERMS))])
    s = np.concatenate([a[code != k] for k in range(len(TERMS))])
    e = np.concatenate([b[code != k] for k in range(len(TERMS))])
    others = iv.Coverage(g, s, e)
    mine = in_batch[rows]
    if not mine.any():
        return pd.DataFrame()
    frame = pd.DataFrame({"step": steps[rows[mine]].astype(np.int64), "term": code[mine]})
    groups = frame.groupby(["step", "term"], sort=True)
    ug, us, ue = iv.union(groups.ngroup().to_numpy(), a[mine], b[mine])
    keys = groups.size().reset_index()
    ns = others.between(keys["term"].to_numpy(np.int64)[ug], us, ue)
    total = np.bincount(ug, weights=ns.astype(np.float64), minlength=len(keys))
    return _rows("overlap", step=keys["step"].to_numpy(), phase=np.array(TERMS, object)[keys["term"].to_numpy()],
                 seconds=total / 1e9)


def _self_time(spans: pd.DataFrame, proc_codes: np.ndarray, prow: np.ndarray):
    """(span row, start, end) pieces of each span where none of its children on the same thread runs."""
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    thread = spans["thread_id"].fillna(-1).to_numpy(np.int64)
    child = np.flatnonzero(prow >= 0)
    child = child[(proc_codes[child] == proc_codes[prow[child]]) & (thread[child] == thread[prow[child]])]
    return iv.complement(prow[child], start[child], end[child], start, end)


def _contained(idle: pd.DataFrame, proc_codes, start, end, container) -> pd.DataFrame:
    """Idle pieces cut where their process is inside one of its own container spans (`contained`)."""
    cg, cs, ce = iv.union(proc_codes[container], start[container], end[container])
    out = []
    for step, proc, a, b in zip(idle["step"], idle["proc"], idle["a"], idle["b"]):
        cut = a
        for s, e in zip(cs[cg == proc], ce[cg == proc]):  # disjoint, in order
            s, e = max(s, a), min(e, b)
            if e <= s:
                continue
            if s > cut:
                out.append((step, proc, cut, s, False))
            out.append((step, proc, s, e, True))
            cut = e
        if cut < b:
            out.append((step, proc, cut, b, False))
    cols = list(zip(*out)) if out else [[]] * 5
    return pd.DataFrame({"step": np.array(cols[0], np.int64), "proc": np.array(cols[1], np.int64),
                         "a": np.array(cols[2], np.int64), "b": np.array(cols[3], np.int64),
                         "contained": np.array(cols[4], bool)})


def _wait_rows(spans, checks, prow, busy, in_batch, container_phases, firsts, lasts) -> pd.DataFrame:
    proc_codes, procs = pd.factorize(spans["process_id"])
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    phase = spans["phase"].to_numpy(object)
    nproc = len(procs)
    if nproc == 0:
        return pd.DataFrame()
    lo = np.full(nproc, min(start.min(), checks["start_ns"].min()), np.int64)
    hi = np.full(nproc, max(end.max(), checks["end_ns"].max()), np.int64)
    waiting = phase == WAIT

    # idle: windows of (step, participating process) minus that process's busy and wait spans
    idle_g, idle_s, idle_e = iv.complement(proc_codes[busy | waiting], start[busy | waiting], end[busy | waiting], lo, hi)
    pairs = spans[in_batch].assign(proc=proc_codes[in_batch])[["step", "proc"]].drop_duplicates()
    pairs = pairs.merge(checks[["step", "start_ns", "end_ns"]], on="step")
    # before its first span of the run a process is starting up, not waiting
    for proc, name in enumerate(procs):
        if name in firsts:
            mine = pairs["proc"] == proc
            pairs.loc[mine, "start_ns"] = pairs.loc[mine, "start_ns"].clip(lower=int(firsts[name]))
        # after it ended it waits for nothing
        if name in lasts:
            mine = pairs["proc"] == proc
            pairs.loc[mine, "end_ns"] = pairs.loc[mine, "end_ns"].clip(upper=int(lasts[name]))
    win, a, b = iv.clip(idle_g, idle_s, idle_e, pairs["proc"], pairs["start_ns"], pairs["end_ns"])
    idle = pd.DataFrame(
        {"step": pairs["step"].to_numpy()[win], "proc": pairs["proc"].to_numpy()[win], "a": a, "b": b}
    )
    # inside the process's own container spans, time when nothing ran anywhere is the container's work
    idle = _contained(idle, proc_codes, start, end, np.isin(phase, sorted(container_phases)))
    idle = idle.assign(in_phase="idle", detail="idle", declared=None)

    # wait spans of the batch's steps, over their self time (their thread is waiting, whatever encloses it)
    own = _self_time(spans, proc_codes, prow)
    keep = waiting[own[0]] & in_batch[own[0]]
    rows, a, b = own[0][keep], own[1][keep], own[2][keep]
    parent_phase = np.where(prow[rows] >= 0, phase[np.maximum(prow[rows], 0)], WAIT)
    declared = spans["waiting_for"].to_numpy(object)[rows]
    waits = pd.DataFrame(
        {
            "step": spans["step"].to_numpy()[rows],
            "proc": proc_codes[rows],
            "a": a,
            "b": b,
            "in_phase": parent_phase,
            "detail": np.where(pd.isna(declared), "wait_span", "declared"),
            "declared": declared,
        }
    )
    waits["contained"] = False
    pieces = pd.concat([idle, waits], ignore_index=True)
    worked = spans["step"][busy & in_batch].unique()  # steps with some work recorded in them
    pieces = pieces[pieces["step"].isin(worked)]
    if pieces.empty:
        return pd.DataFrame()
    attributed = _attribute(pieces, spans, prow, busy, own)
    attributed = attributed[~(attributed["contained"].astype(bool) & attributed["waited_for"].isna())]
    if attributed.empty:
        return pd.DataFrame()
    attributed["process_id"] = procs[attributed["proc"].to_numpy()]
    keys = ["step", "process_id", "detail", "in_phase", "waited_for"]
    agg = attributed.groupby(keys, dropna=False, sort=True).agg(seconds=("ns", "sum"), count=("ns", "size")).reset_index()
    agg["seconds"] = agg["seconds"] / 1e9
    agg["other_process_id"] = _who_ran(spans, agg)
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


def _descendants(pairs: pd.DataFrame) -> dict[int, set[int]]:
    """Phase code -> every phase code below it (children, grandchildren, ...), itself excluded."""
    children: dict[int, set[int]] = {}
    for parent, child in zip(pairs["parent"].tolist(), pairs["child"].tolist()):
        children.setdefault(parent, set()).add(child)
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


def _attribute(pieces: pd.DataFrame, spans: pd.DataFrame, prow, busy, own) -> pd.DataFrame:
    """One row per (piece, phase waited for) with the overlapping ns; waited_for None = nothing ran.

    Work is the self time of busy spans (`own` from `_self_time`): a waiting thread's own enclosing
    span does not count, while another thread of the same process working meanwhile does.
    """
    codes, names = pd.factorize(spans["phase"])
    own_row, own_s, own_e = own
    working = busy[own_row]
    own_code, own_s, own_e = codes[own_row][working], own_s[working], own_e[working]
    busy_codes = np.unique(codes[busy])
    nested = np.flatnonzero(busy & (prow >= 0))
    nested = nested[busy[prow[nested]] & (codes[prow[nested]] != codes[nested])]
    children = _descendants(pd.DataFrame({"parent": codes[prow[nested]], "child": codes[nested]}).drop_duplicates())
    # coverage groups: each busy phase; each parent phase with its descendants; the descendants alone; all busy
    groups: list[tuple[object, set[int]]] = [(int(c), {int(c)}) for c in busy_codes]
    groups += [((c, "+"), {c} | kids) for c, kids in children.items()]
    groups += [((c, ":"), kids) for c, kids in children.items()]
    groups.append(("*", {int(c) for c in busy_codes}))
    index = {key: k for k, (key, _) in enumerate(groups)}
    g_list, s_list, e_list = [], [], []
    for k, (_, members) in enumerate(groups):
        mask = np.isin(own_code, list(members))
        g_list.append(np.full(mask.sum(), k, np.int64))
        s_list.append(own_s[mask])
        e_list.append(own_e[mask])
    cov = iv.Coverage(np.concatenate(g_list), np.concatenate(s_list), np.concatenate(e_list))
    a, b = pieces["a"].to_numpy(np.int64), pieces["b"].to_numpy(np.int64)
    n = len(pieces)

    def covered(key) -> np.ndarray:
        return cov.between(np.full(n, index[key], np.int64), a, b)

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


def _who_ran(spans: pd.DataFrame, waits: pd.DataFrame) -> np.ndarray:
    """For each wait row, the other process where the awaited phase ran longest in that step, or the
    waiting process itself when the phase ran only there (on another thread)."""
    ran = spans.assign(ns=spans["total_ns"]).groupby(["step", "phase", "process_id"])["ns"].sum()
    ran = ran.reset_index()
    ran = ran[ran["ns"] > 0].sort_values(["ns", "step", "phase", "process_id"], ascending=[False, True, True, True],
                                         kind="stable")  # longest first, ties by name; 0 ns did not run
    best: dict[tuple, list[str]] = {}
    for step, ph, proc in zip(ran["step"], ran["phase"], ran["process_id"]):
        best.setdefault((step, ph), []).append(proc)
        best.setdefault((None, ph), []).append(proc)  # the awaited work may belong to another step
    out = []
    for step, ph, proc in zip(waits["step"], waits["waited_for"], waits["process_id"]):
        ran = best.get((step, ph), []) + best.get((None, ph), [])
        others = [p for p in ran if p != proc]
        out.append(others[0] if others else (proc if ran else None))
    return np.array(out, object)


def _path_rows(spans, prow, busy, in_batch, phases, nesting) -> pd.DataFrame:
    """Critical path per step over top-level busy spans. A stage nested in another stage's span on
    the same thread is a link of its own (TRL: rollout → reward → train inside one training step),
    and the outer span's link starts where its last nested stage ended (its own time)."""
    phase = spans["phase"].to_numpy(object)
    proc = spans["process_id"].to_numpy(object)
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    parent = np.maximum(prow, 0)
    stage = _lookup(phases, {p: list(TERM_OF_STAGE).index(st) for p, st in STAGE_OF.items()}, -1).astype(np.int64)
    other_stage = (stage >= 0) & (stage[parent] >= 0) & (stage[parent] != stage)
    top = busy & in_batch & ((prow < 0) | ~busy[parent] | (proc[parent] != proc) | other_stage)
    outer, inner = nesting
    link_start = start.copy()
    np.maximum.at(link_start, outer, np.where(end[inner] <= end[outer], end[inner], start[outer]))
    with_parent = np.flatnonzero(prow >= 0)
    # the child that ends last; on ties the one whose phase, then process, sorts last by name
    names = lambda col: pd.Series(spans[col].to_numpy(object)[with_parent]).fillna("").astype(str).to_numpy()  # noqa: E731
    order = np.lexsort((names("process_id"), names("phase"), end[with_parent], prow[with_parent]))
    kids = with_parent[order]
    is_last = np.ones(len(kids), bool)
    is_last[:-1] = prow[kids[1:]] != prow[kids[:-1]]
    last_child = dict(zip(prow[kids[is_last]].tolist(), kids[is_last].tolist()))
    steps = spans["step"].to_numpy()
    out = []
    tops = np.flatnonzero(top)
    tops = tops[np.argsort(steps[tops], kind="stable")]
    cuts = np.flatnonzero(np.diff(steps[tops])) + 1  # one slice per step (no scan of every span per step)
    for idx in np.split(tops, cuts) if len(tops) else []:
        step = steps[idx[0]]
        idx = idx[np.lexsort((-(end[idx] - start[idx]), end[idx]))]  # by end, longer first on ties
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
        for seq, i in enumerate(reversed(chain)):
            child = last_child.get(i)
            out.append(
                {
                    "step": step,
                    "seq": seq,
                    "process_id": proc[i],
                    "phase": phase[i],
                    "other": None if child is None else phase[child],
                    "other_process_id": None if child is None else proc[child],
                    "detail": spans["name"].iat[i],
                    "span_id": spans["span_id"].iat[i],
                    "start_ns": start[i],
                    "end_ns": end[i],
                    "seconds": (end[i] - start[i]) / 1e9,
                }
            )
    if not out:
        return pd.DataFrame()
    frame = pd.DataFrame(out)
    return _rows("path", **{c: frame[c].to_numpy(object if frame[c].dtype == object else None) for c in frame})


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """The same summary rows in any order: keys equal, seconds within 1 ns, counts exact."""
    keys = ["step", "kind", "seq", "process_id", "phase", "other", "other_process_id", "detail", "span_id",
            "start_ns", "end_ns", "count", "total_ns"]

    def norm(frame: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame({c: frame[c] if c in frame else None for c in keys + ["seconds"]})
        for c in ("step", "seq", "start_ns", "end_ns", "count", "total_ns"):
            out[c] = pd.array([None if pd.isna(v) else int(v) for v in out[c]], dtype="Int64")
        for c in ("kind", "process_id", "phase", "other", "other_process_id", "detail", "span_id"):
            out[c] = [None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v) for v in out[c]]
        out["seconds"] = out["seconds"].astype(float)
        return out.sort_values(keys, na_position="first", kind="stable", key=lambda s: s.astype(str)).reset_index(drop=True)

    a, b = norm(got), norm(want)
    assert len(a) == len(b), f"{len(a)} summary rows, the reference has {len(b)}:\n{a}\n{b}"
    for c in keys:
        same = (a[c].astype(object).fillna("<NA>") == b[c].astype(object).fillna("<NA>"))
        assert same.all(), f"column {c} differs:\n{a[~same]}\n{b[~same]}"
    assert np.allclose(a["seconds"].to_numpy(), b["seconds"].to_numpy(), rtol=0, atol=1e-9, equal_nan=True), \
        f"seconds differ:\n{a}\n{b}"
