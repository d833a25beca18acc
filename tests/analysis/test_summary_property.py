"""Property: on any run, the fast per-step summaries (`rltrace.analysis._compute`) equal the
reference implementation's (`oracle_compute`); steps computed in many small batches equal the
same steps computed in one; a report that reuses the summary cache equals one without it.

Random runs mix what real ones hold: several processes and threads (or none known), spans nested
on their thread and children on other threads or processes (now and then outside their parent's
time), every standard phase plus `step`, `wait` (with and without `rl.waiting_for`),
`weight_sync` with and without `rl.bytes` and `rl.method`, user phases that group others
(containers) or not, spans without a step, a span stored twice, zero-length spans, equal start
and end times (times on a coarse grid, some a fraction of a millisecond apart for the critical
path's 1 ms tolerance), steps that overlap, step numbers from 0, below 0 or near 1e12, and
steps whose spans are split across several parts and flushes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rltrace import analysis, store
from rltrace._phases import STAGE_OF
from rltrace.analysis import _compute, summary
from rltrace.analysis import _intervals as iv
from rltrace.testing import T0_NS, RunBuilder

from . import oracle_compute


PHASES = [*STAGE_OF, "step", "wait", "eval", "iteration", "prefill"]
#: a weight sync's child and a delta-sync step (what the serving marks look for), in runs that are
#: not steady: in steady ones more phases make fewer runs show the same relations in every window
SYNC_PHASES = ["transfer", "diff"]
UNIT_NS = 250_000_000  # a coarse grid: equal times are common
JITTER_NS = 500_000  # half the critical path's tolerance


@st.composite
def runs(draw, max_top: int = 7, steady: bool = False):
    """A run as span specs: dicts with key, parent (key or None), proc, thread, phase, start_ns,
    end_ns (nanoseconds after t0), step (or None), attrs and name.

    `steady`: every step has the same shape, as in a real run (one step's spans repeated at a
    drawn period, so that steps may overlap; children inside their parent, of its step or of
    none): what the run shows about its phases (which group others, which run inside which)
    is then the same in any window of steps, so summaries cannot depend on how steps are batched.
    """
    nproc = draw(st.integers(1, 3))
    nsteps = 1 if steady else draw(st.integers(1, 4))
    first = 0 if steady else draw(st.sampled_from([0, 0, 0, -2, 10**12]))  # step numbers need not start at 0
    step_numbers = st.integers(first, first + nsteps - 1)
    specs: list[dict] = []

    def time(lo: int, hi: int) -> int:
        units = draw(st.integers(lo // UNIT_NS, max(lo // UNIT_NS, hi // UNIT_NS)))
        return max(lo, min(hi, units * UNIT_NS + draw(st.sampled_from([0, 0, 0, 1, 2, 3])) * JITTER_NS))

    def attrs(phase: str) -> dict:
        if phase == "wait":
            target = draw(st.sampled_from([None, None, "rollout", "train", "reward", "weight_sync", "generate"]))
            return {} if target is None else {"waiting_for": target}
        if phase == "weight_sync":
            out = {}
            size = draw(st.sampled_from([None, 1_000_000, 2_000_000, 2.5e6, 7]))
            if size is not None:
                out["bytes"] = size
            method = draw(st.sampled_from([None, "nccl", "ipc"]))
            if method is not None:
                out["method"] = method
            return out
        return {}

    def add(parent: dict | None, depth: int) -> None:
        if parent is None:
            proc, thread = draw(st.integers(0, nproc - 1)), draw(st.sampled_from([1, 1, 2, None]))
            start = time(0, 40 * UNIT_NS)
            end = time(start, start + draw(st.integers(0, 12)) * UNIT_NS)
            step = draw(st.one_of(st.none(), step_numbers, step_numbers))
        else:
            where = draw(st.sampled_from(["same", "same", "same", "thread", "process"]))
            proc, thread = parent["proc"], parent["thread"]
            if where == "thread":
                thread = 1 if thread == 2 else 2
            elif where == "process":
                proc = draw(st.integers(0, nproc - 1))
            lo, hi = parent["start_ns"], parent["end_ns"]
            if not steady and draw(st.integers(0, 9)) == 0:  # now and then a child outside its parent
                lo, hi = max(0, lo - 2 * UNIT_NS), hi + 2 * UNIT_NS
            start = time(lo, hi)
            end = time(start, hi)
            step = parent["step"] if draw(st.integers(0, 5)) else draw(st.one_of(st.none(), step_numbers))
            if steady and step != parent["step"]:
                step = None
        phase = draw(st.sampled_from(PHASES if steady else PHASES + SYNC_PHASES))
        spec = {"key": len(specs), "parent": None if parent is None else parent["key"], "proc": proc,
                "thread": thread, "phase": phase, "start_ns": start, "end_ns": end, "step": step,
                "attrs": attrs(phase), "name": draw(st.sampled_from([phase, phase, "other"]))}
        specs.append(spec)
        if depth < 3:
            for _ in range(draw(st.integers(0, 3 - depth))):
                add(spec, depth + 1)

    for _ in range(draw(st.integers(1, max_top))):
        add(None, 0)
    if not steady:  # a span stored twice (an exporter's retry): the same id again
        return specs + [specs[i] for i in draw(st.lists(st.integers(0, len(specs) - 1), max_size=2))]
    period, repeats = draw(st.integers(1, 14)) * UNIT_NS, draw(st.integers(2, 4))
    return [{**spec, "key": spec["key"] + k * len(specs),
             "parent": None if spec["parent"] is None else spec["parent"] + k * len(specs),
             "start_ns": spec["start_ns"] + k * period, "end_ns": spec["end_ns"] + k * period,
             "step": None if spec["step"] is None else k}
            for k in range(repeats) for spec in specs]


def _checks(frame: pd.DataFrame, steps) -> pd.DataFrame:
    """What `summary.checks` gives for these steps."""
    stepped = frame[frame["step"].notna() & frame["step"].isin(list(steps))].astype({"step": "int64"})
    return stepped.assign(total_ns=stepped["end_ns"] - stepped["start_ns"]).groupby("step").agg(
        count=("start_ns", "size"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
        total_ns=("total_ns", "sum")).reset_index()


def _table(specs: list[dict]) -> pa.Table:
    """The spans as `summary._load` returns them (in its column order and types)."""
    def attr(spec, key, phase):
        return spec["attrs"].get(key) if spec["phase"] == phase else None

    return pa.table({
        "span_id": pa.array([s["key"] + 1 for s in specs], pa.int64()),
        "parent_span_id": pa.array([None if s["parent"] is None else s["parent"] + 1 for s in specs], pa.int64()),
        "phase": pa.array([s["phase"] for s in specs], pa.string()),
        "name": pa.array([s["name"] for s in specs], pa.string()),
        "step": pa.array([s["step"] for s in specs], pa.int64()),
        "process_id": pa.array([f"p{s['proc']}" for s in specs], pa.string()),
        "thread_id": pa.array([s["thread"] for s in specs], pa.int64()),  # None: not known
        "start_ns": pa.array([T0_NS + s["start_ns"] for s in specs], pa.int64()),
        "end_ns": pa.array([T0_NS + s["end_ns"] for s in specs], pa.int64()),
        "waiting_for": pa.array([attr(s, "waiting_for", "wait") for s in specs], pa.string()),
        "sync_bytes": pa.array([None if attr(s, "bytes", "weight_sync") is None else float(s["attrs"]["bytes"])
                                for s in specs], pa.float64()),
        "sync_method": pa.array([attr(s, "method", "weight_sync") for s in specs], pa.string()),
    })


def _batch(table: pa.Table, checks: pd.DataFrame) -> pa.Table:
    """The spans `summary._load` would read for these steps: every span overlapping their range."""
    lo, hi = int(checks["start_ns"].min()), int(checks["end_ns"].max())
    frame = table.to_pandas()
    keep = (frame["end_ns"] >= lo) & (frame["start_ns"] <= hi)
    return table.filter(pa.array(keep.to_numpy()))


def _pairs(table: pa.Table) -> set[tuple[str, str]]:
    """(parent phase, child phase) of every parent link among these spans."""
    phase_of = dict(zip(table["span_id"].to_pylist(), table["phase"].to_pylist()))
    return {(phase_of[p], c) for p, c in zip(table["parent_span_id"].to_pylist(), table["phase"].to_pylist())
            if p in phase_of}


def _same_phase_relations(specs: list[dict]) -> bool:
    """Whether each step's window shows the same parent/child phases as the whole run. Which phases
    group others (containers) and which run inside which are read from the spans loaded with a
    batch of steps, in both implementations: where a window shows fewer, batching may change a
    step's waits and critical path (a run whose every step has the same shape never does)."""
    table = _table(specs)
    frame = table.to_pandas()
    whole = _pairs(table)
    steps = frame["step"].dropna().unique()
    return all(_pairs(_batch(table, _checks(frame, [int(step)]))) == whole for step in steps)


def _build(specs: list[dict], run_dir: Path, parts: int, split: int, between=None) -> Path:
    """The run written through the store writer: spans before `split` in a first flush (as
    `parts` parts per process), the rest in a second one (a step's spans in several parts);
    `between(run_dir)` is called after the first flush."""
    b = RunBuilder(run_dir)
    procs = [b.process("trainer" if i == 0 else "rollout", rank=i) for i in range(3)]
    made: dict[int, object] = {}
    for i, spec in enumerate(specs):
        if i == split:
            b.write(parts_per_process=parts)
            if between is not None:
                between(run_dir)
        made[spec["key"]] = procs[spec["proc"]].span(
            spec["phase"], spec["start_ns"] / 1e9, spec["end_ns"] / 1e9, step=spec["step"],
            parent=made.get(spec["parent"]), thread=spec["thread"], name=spec["name"], **spec["attrs"])
    return b.write(parts_per_process=parts)


def _summaries(run_dir: Path, cache: Path, batch: tuple[int, int]) -> pd.DataFrame:
    """Every step's summary rows through the product path (`summary.table`), batches of `batch`
    spans; each batch is checked against the reference by the autouse fixture."""
    old = summary.BATCH_SPANS
    os.environ["RLTRACE_SUMMARY_CACHE_DIR"] = str(cache)
    summary.BATCH_SPANS = batch
    try:
        con = store.open(run_dir)
        out = summary.table(con).to_pandas()
        analysis.cost_model(con)
        analysis.waits(con)
        analysis.critical_path(con)
    finally:
        summary.BATCH_SPANS = old
    return out.sort_values(list(out.columns[:11]), key=lambda c: c.astype(str)).reset_index(drop=True)


def _both(table: pa.Table, checks: pd.DataFrame, hashed: bool, chunk: int, ranked: bool,
          asked: bool = False) -> pd.DataFrame:
    """Fast summary rows of a batch (the autouse fixture compares them with the reference).

    `hashed`: group keys hashed even when few (the path of batches with many steps and phases);
    `chunk`: the columns in chunks of that many rows, as DuckDB returns large batches; `ranked`:
    interval keys made of time ranks (the path of 10,000 steps in one batch; the reference uses
    the same interval module, so that path is also checked against the plain one here); `asked`:
    waits attributed by asking every phase about every piece, one piece at a time (the path past
    `_PAIRS` overlapping pairs) instead of listing the overlapping pairs.
    """
    table = pa.Table.from_batches(table.to_batches(max_chunksize=chunk), table.schema)
    dense, limit, pairs = _compute._DENSE, iv._LIMIT, _compute._PAIRS
    _compute._DENSE = 0 if hashed else dense
    iv._LIMIT = 2**32 if ranked else limit  # any run longer than 4 s overflows: ranks
    _compute._PAIRS = 1 if asked else pairs
    try:
        got = _compute.compute(_compute.Spans.from_arrow(table), checks)
    finally:
        _compute._DENSE, iv._LIMIT, _compute._PAIRS = dense, limit, pairs
    if ranked:
        oracle_compute.assert_same(got, _compute.compute(_compute.Spans.from_arrow(table), checks))
    return got


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs=runs(), hashed=st.booleans(), chunk=st.sampled_from([1, 3, 10**6]), ranked=st.booleans(),
       asked=st.booleans())
def test_fast_summaries_equal_the_reference(specs, hashed, chunk, ranked, asked):
    """Direct: the spans of every batch `summary` could load, through both implementations."""
    table = _table(specs)
    frame = table.to_pandas()
    steps = sorted(int(s) for s in frame["step"].dropna().unique())
    if not steps:
        return
    everything = _checks(frame, steps)
    _both(_batch(table, everything), everything, hashed, chunk, ranked, asked)
    for step in steps:
        one = _checks(frame, [step])
        _both(_batch(table, one), one, hashed, chunk, ranked, asked)


_PRODUCT = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_PRODUCT
@given(specs=runs(max_top=5), parts=st.integers(1, 3), split=st.integers(0, 40))
def test_summaries_through_the_store_equal_the_reference(specs, parts, split):
    """Product path: parts on disk, DuckDB, `summary.table` in one batch and in one batch per
    step on two threads (the autouse fixture checks every batch against the reference)."""
    root = Path(tempfile.mkdtemp())
    try:
        run_dir = _build(specs, root / "run", parts, split)
        _summaries(run_dir, root / "cache-one", (10**9, 10**9))
        _summaries(run_dir, root / "cache-many", (1, 1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@_PRODUCT
@given(specs=runs(max_top=4, steady=True), parts=st.integers(1, 3), split=st.integers(0, 60))
def test_steps_in_many_batches_equal_one_batch(specs, parts, split):
    """Steps computed one batch each, two at a time on threads, give exactly the rows of one
    batch, on runs whose steps show the same phase relations in every window."""
    assume(_same_phase_relations(specs))
    root = Path(tempfile.mkdtemp())
    try:
        run_dir = _build(specs, root / "run", parts, split)
        one = _summaries(run_dir, root / "cache-one", (10**9, 10**9))
        many = _summaries(run_dir, root / "cache-many", (1, 1))
        pd.testing.assert_frame_equal(one, many)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@_PRODUCT
@given(specs=runs(max_top=4, steady=True), split=st.integers(1, 60))
def test_a_cached_step_is_reused_only_while_it_holds(specs, split):
    """A report after the first flush leaves its summaries in the cache; after the second flush
    (new steps, late spans of old steps and of none) the report that reuses the cache gives what
    a report with no cache gives."""
    assume(_same_phase_relations(specs) and split < len(specs))
    root = Path(tempfile.mkdtemp())
    big = (10**9, 10**9)
    try:
        run_dir = _build(specs, root / "run", 1, split, lambda run: _summaries(run, root / "cache", big))
        cached = _summaries(run_dir, root / "cache", big)
        pd.testing.assert_frame_equal(cached, _summaries(run_dir, root / "fresh", big))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_many_distinct_phases_take_the_hashed_path(tmp_path, monkeypatch):
    """Spans without `rl.phase` take their name as phase, and some instrumentations put ids in
    names: with many distinct phases the (parent phase, child phase) pairs and group keys are
    hashed, not counted in a table sized by every possible pair (100,000 phases would need 10^10
    counters). Forced here with a small limit; the results equal the reference's."""
    monkeypatch.setattr(_compute, "_DENSE", 64)
    b = RunBuilder(tmp_path / "run")
    p, other = b.process("service"), b.process("trainer")
    for i in range(300):
        o, step = 0.01 * i, i // 100
        outer = p.span(f"request-{i}", o, o + 0.008, step=step)  # groups a rollout and a train: a container
        p.span("rollout", o + 0.001, o + 0.003, step=step, parent=outer)
        p.span("train", o + 0.004, o + 0.006, step=step, parent=outer)
        p.span(f"handler-{i}", o + 0.0065, o + 0.0075, step=step, parent=outer)
        other.span("wait", o, o + 0.009, step=step)
    b.write()
    rows = summary.rows(store.open(b.run_dir))  # the autouse fixture compares them with the reference's
    assert rows[rows["kind"] == "phase"]["phase"].nunique() == 603  # 300 requests, 300 handlers, rollout, train, wait
    waited = set(rows[rows["kind"] == "wait"]["other"].dropna())
    assert {"rollout", "train"} <= waited and not any(w.startswith("request-") for w in waited)  # containers are not work


def test_request_names_sharing_a_child_are_attributed_exactly(tmp_path):
    """A foreign service whose span names carry request ids, each request with a `decode` child
    (the same name under every request): a wait during them is split between each request's own
    time, `decode` and nothing, exactly. Attributing it used to take time and memory in the
    number of names times the spans (minutes at 20,000 names; benchmarks/bench_analysis.py
    --names); it now takes the overlaps. Kept small here for the reference, which still does."""
    n = 400
    b = RunBuilder(tmp_path / "run")
    trainer, service = b.process("trainer"), b.process("engine")
    trainer.span("wait", 0.0, 2.0, step=0)
    trainer.span("train", 2.0, 3.0, step=0)
    for i in range(n):
        start = 0.004 * i
        request = service.span(None, start, start + 0.003, step=0, name=f"Req {i:08x}")
        service.span(None, start + 0.001, start + 0.002, step=0, name="decode", parent=request)
    b.write()
    rows = summary.rows(store.open(b.run_dir), kinds=("wait",))  # the autouse fixture compares them with the reference's
    mine = rows[(rows["process_id"] == trainer.process_id) & (rows["phase"] == "wait")]
    by = mine.groupby(mine["other"].fillna("(nothing)"))["seconds"].sum()
    assert by["decode"] == pytest.approx(n * 0.001)
    assert by["(nothing)"] == pytest.approx(2.0 - n * 0.003)
    requests = by[by.index.str.startswith("Req ")]
    assert len(requests) == n and requests.to_numpy() == pytest.approx(0.002)
