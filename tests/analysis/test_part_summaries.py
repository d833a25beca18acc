"""Per-part summaries (`rltrace.store.digest`): the per-step summaries a report computes from them
equal those it computes from the spans, on random runs and on runs recorded by real writers.

The random runs are those of `test_summary_property` (children outside their parent's time, on
other threads and processes, spans stored twice, zero-length spans, steps that overlap, parts
split mid-step). Each span part gets a summary as a writer makes it: part by part, in write
order, with what the process knows when it merges (its spans still running then: those of later
parts that started before and end after), remembered from one part to the next.
"""

from __future__ import annotations

import contextvars
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rltrace
from rltrace import _names, store
from rltrace.analysis import summary
from rltrace.analysis.engine_requests import marks as serving_marks
from rltrace.store import digest, merge
from rltrace.store import views
from rltrace.store.views import read_whole
from rltrace.store.parts import write_part

from .test_summary_property import _build, _summaries, runs

BIG = (10**9, 10**9)


def summarise(run_dir: Path, live: bool) -> int:
    """Write a per-part summary beside every span part, as the writer of each would; the number of
    rows they hold (fewer than the spans when leaves were merged)."""
    parts = sorted((run_dir / "spans").glob("*.parquet"), key=lambda p: p.name.rsplit("-", 1)[1])
    tables = [read_whole(p) for p in parts]
    knowledge: dict[str, digest.Knowledge] = {}
    rows = 0
    for i, (path, table) in enumerate(zip(parts, tables)):
        process = table["process_id"][0].as_py()
        known = knowledge.setdefault(process, digest.Knowledge(process_id=process))
        now = max(table["end_ns"].to_pylist())
        known.live = []
        if live:  # the process's spans written later that had started by now and were still running
            for later in tables[i + 1:]:
                for r in later.to_pylist():
                    if r["process_id"] == process and r["start_ns"] <= now < r["end_ns"]:
                        parent_proc = _process_of(tables, r["parent_span_id"])
                        known.live.append(digest.Live(
                            span_id=r["span_id"], phase=r["phase"] or r["name"] or "", thread_id=r["thread_id"] or -1,
                            start_ns=r["start_ns"], parent_id=r["parent_span_id"],
                            parent_remote=parent_proc is not None and parent_proc != process))
        built = digest.build(table, known)
        rows += built.num_rows
        write_part(run_dir / _names.SPAN_DIGEST.folder, path.name, built, _names.SPAN_DIGEST,
                   digest.footer(path.name, table.num_rows))
    return rows


def _process_of(tables, span_id):
    for t in tables:
        for sid, proc in zip(t["span_id"].to_pylist(), t["process_id"].to_pylist()):
            if sid == span_id:
                return proc
    return None


_PRODUCT = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_PRODUCT
@given(specs=runs(max_top=5), parts=st.integers(1, 3), split=st.integers(0, 40), live=st.booleans(),
       batch=st.sampled_from([BIG, (1, 1)]))
def test_summaries_from_per_part_summaries_equal_those_from_the_spans(specs, parts, split, live, batch):
    root = Path(tempfile.mkdtemp())
    try:
        run_dir = _build(specs, root / "run", parts, split)
        summarised = root / "summarised"
        shutil.copytree(run_dir, summarised)
        summarise(summarised, live)
        con = store.open(summarised)
        assert con.execute("SELECT count(*) FROM _rltrace_span_parts WHERE digest IS NOT NULL").fetchone()[0] \
            == len(list((run_dir / "spans").glob("*.parquet")))
        from_spans = _summaries(run_dir, root / "cache-spans", batch)
        from_summaries = _summaries(summarised, root / "cache-summaries", batch)
        pd.testing.assert_frame_equal(from_summaries, from_spans)
        # the serving marks (rollout windows, weight syncs with their versions) too, read from the summaries
        for kind in ("window", "weight_sync", "sync_child", "delta_step"):
            os.environ["RLTRACE_SUMMARY_CACHE_DIR"] = str(root / f"marks-spans-{kind}")
            want = serving_marks(store.open(run_dir), kind)
            os.environ["RLTRACE_SUMMARY_CACHE_DIR"] = str(root / f"marks-summaries-{kind}")
            got = serving_marks(store.open(summarised), kind)
            pd.testing.assert_frame_equal(got, want)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_serving_marks_are_read_from_the_summaries_not_the_spans(run_dir, monkeypatch, tmp_path):
    """A part with a per-part summary gives its rollout windows and weight syncs (with their
    versions) from the summary: with its span part unreadable, the marks are still the spans'."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    rltrace.init(run_dir, role="rollout", flush_interval=0.01)
    for step in range(3):
        with rltrace.phase("rollout", step=step):
            _generate_on_threads(step)
        with rltrace.phase("weight_sync", step=step, weight_version=step + 1):
            time.sleep(0.002)
        rltrace.flush()
    rltrace.shutdown()  # merges its parts into one, with its summary
    assert len(list((run_dir / "span_digests").glob("*.parquet"))) == 1
    want = {kind: serving_marks(store.open(run_dir), kind) for kind in ("window", "weight_sync")}
    assert list(want["window"]["step"]) == [0, 1, 2] and list(want["weight_sync"]["weight_version"]) == [1, 2, 3]
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "fresh"))
    con = store.open(run_dir)
    read = []
    real = views.parts_sql
    monkeypatch.setattr(views, "parts_sql", lambda table, parts, *a: read.append(table.name) or real(table, parts, *a))
    for kind, frame in want.items():
        pd.testing.assert_frame_equal(serving_marks(con, kind), frame)
    assert "spans" not in read  # the span part was not scanned
    shutil.rmtree(run_dir / "span_digests")  # without its summary, the same marks from the spans
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "spans"))
    con = store.open(run_dir)
    for kind, frame in want.items():
        pd.testing.assert_frame_equal(serving_marks(con, kind), frame)
    assert "spans" in read


def _generate_on_threads(step: int) -> None:
    """A rollout whose requests run on 4 threads at once (the spans a per-part summary merges)."""
    def requests():
        for _ in range(10):
            with rltrace.phase("generate"):
                time.sleep(0.0005)

    with rltrace.phase("rollout", step=step):
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(requests,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def test_a_summary_holds_a_few_rows_a_step_and_is_not_used_once_its_part_is_replaced(run_dir, monkeypatch):
    """A real writer merges its parts (with summaries) while it records; the report reads the
    summaries and gives what the spans give; a summary that names a part not in force is ignored."""
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    rltrace.init(run_dir, role="rollout", flush_interval=0.01)
    for step in range(12):
        _generate_on_threads(step)
        with rltrace.phase("train", step=step):
            for _ in range(5):
                with rltrace.phase("forward"):
                    pass
        with rltrace.phase("wait", step=step, waiting_for="rollout"):
            pass
        rltrace.flush()
    rltrace.shutdown()
    summaries = list((run_dir / "span_digests").glob("*.parquet"))
    spans = list((run_dir / "spans").glob("*.parquet"))
    assert len(summaries) == len(spans) == 1 and summaries[0].name == spans[0].name
    held = pq.read_table(summaries[0])
    generate = held.filter(pc.equal(held["phase"], "generate"))
    assert pc.sum(generate["count"]).as_py() == 12 * 40 and generate.num_rows < 12 * 40 / 2  # 40 a step, most merged
    with_summaries = _summaries(run_dir, run_dir.parent / "c1", BIG)
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM _rltrace_span_parts WHERE digest IS NOT NULL").fetchone() == (1,)
    shutil.rmtree(run_dir / "span_digests")
    pd.testing.assert_frame_equal(_summaries(run_dir, run_dir.parent / "c2", BIG), with_summaries)
    # a summary naming a part that is not in force (here: the right name, other rows) is not used
    write_part(run_dir / "span_digests", spans[0].name, held, _names.SPAN_DIGEST, digest.footer(spans[0].name, 1))
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM _rltrace_span_parts WHERE digest IS NOT NULL").fetchone() == (0,)
    assert summary.checks(con)["count"].sum() == 12 * (1 + 40 + 6 + 1)


def test_spans_whose_ids_loop_do_not_hang_the_report(run_dir):
    """A corrupt record naming itself (or a span naming it) as its parent: the analysis walks each
    chain of ancestors at most as far as there are spans, instead of forever."""
    from rltrace.store import rows
    from rltrace.testing import RunBuilder

    b = RunBuilder(run_dir)
    p = b.process("trainer")
    ns = b.t0_ns
    for span_id, parent, phase, start in ((1, 1, "forward", 0), (2, 3, "train", 10), (3, 2, "rollout", 20)):
        p.spans.append(rows.span_row(trace_id=1, span_id=span_id, parent_span_id=parent, name=phase, phase=phase, step=0,
                                     start_ns=ns + start, end_ns=ns + start + 5, thread_id=1))
    b.write()
    frame = summary.rows(store.open(b.run_dir))  # the autouse fixture checks it against the reference too
    assert set(frame["kind"]) >= {"step", "phase"}


def test_a_part_merged_from_parts_seen_before_is_not_read_again(run_dir, monkeypatch):
    """The per-part facts a report keeps (span counts per step, engine request fields) of a part a
    writer merged from parts the report has seen are its inputs' facts: no span is read again."""
    from rltrace.analysis import _parts

    monkeypatch.setenv("RLTRACE_MERGE_PARTS", "0")
    rltrace.init(run_dir, role="trainer", flush_interval=0.01)
    for step in range(6):
        with rltrace.phase("train", step=step):
            pass
        rltrace.flush()
    rltrace.shutdown()
    first = summary.checks(store.open(run_dir))
    scanned = []
    real = _parts._scan
    monkeypatch.setattr(_parts, "_scan", lambda con, name, schema, select, parts, *a: scanned.append((name, set(parts)))
                        or real(con, name, schema, select, parts, *a))
    store.compact(run_dir, grace_s=0)  # the six parts merged into one
    assert len(list((run_dir / "spans").glob("*.parquet"))) == 1
    con = store.open(run_dir)
    assert summary.checks(con).equals(first) and scanned == []



def _compare(run_dir: Path, tmp: Path, batch) -> None:
    summarised = tmp / "summarised"
    shutil.copytree(run_dir, summarised)
    summarise(summarised, live=False)
    pd.testing.assert_frame_equal(_summaries(summarised, tmp / "c2", batch), _summaries(run_dir, tmp / "c1", batch))


def test_unions_crossing_a_batch_and_unions_holding_a_named_parent_are_read_as_spans(tmp_path, monkeypatch):
    """The two cases where a summary's union is replaced by its spans: an async step's requests
    reaching past the time range of the step computed alone, and a request span that another
    process names as its parent (an engine's child span). Both are taken, and the summaries equal
    those from the spans."""
    from rltrace.analysis import _load
    from rltrace.testing import RunBuilder

    expanded, holding = [], []
    real, real_holding = _load._members, _load._holding_parents
    monkeypatch.setattr(_load, "_members", lambda con, unions, *a: expanded.append(unions.num_rows) or real(con, unions, *a))
    monkeypatch.setattr(_load, "_holding_parents", lambda *a: holding.append(int(real_holding(*a).sum())) or
                        real_holding(*a))
    b = RunBuilder(tmp_path / "run")
    trainer, worker, engine = b.process("trainer"), b.process("rollout"), b.process("engine")
    for step in range(3):
        o = 10.0 * step
        trainer.span("train", o + 6, o + 12, step=step)  # train of step k overlaps the rollout of step k + 1
        roll = worker.span("rollout", o, o + 8, step=step)
        for thread in (2, 3):
            for i in range(4):
                request = worker.span("generate", o + i * 2, o + i * 2 + 1.9, step=step, parent=roll, thread=thread)
        engine.span("decode", o + 7, o + 7.5, step=step, parent=request)  # names the last request as its parent
    b.write()
    _compare(b.run_dir, tmp_path, (1, 1))
    assert sum(holding) >= 3  # each decode's request, merged with another, was read as spans
    assert sum(expanded) > sum(holding)  # and unions of the next step reaching past a step's range
