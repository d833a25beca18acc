"""What a report reads out of every span's attribute text (engine request fields)
is read once per span part: later reports take it from a sidecar for the parts seen before and
read only the new parts, so a report on a live run of 100M spans does not parse 100M attribute
texts each time."""

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rltrace import analysis, store
from rltrace.analysis import _parts
from rltrace.analysis.engine_requests import requests_kind
from rltrace.store import rows as store_rows
from rltrace.testing import RunBuilder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _request(worker, step, start, end, **meta):
    """A request span carrying SGLang's meta (plain attribute names, as SGLang writes them)."""
    worker.spans.append(store_rows.span_row(
        trace_id=f"{step:032x}", span_id=f"r{len(worker.run.processes)}{step:05d}{len(worker.spans):010d}",
        parent_span_id=None, name="generate", phase="generate", step=step, weight_version=None,
        start_ns=worker.run.t0_ns + round(start * 1e9),
        end_ns=None if end is None else worker.run.t0_ns + round(end * 1e9), status="UNSET", thread_id=1,
        thread_name="MainThread", attributes=meta))


def _requests(worker, step, n, e2e=1.0):
    for i in range(n):
        _request(worker, step, 10.0 * step + i, 10.0 * step + i + 0.5, e2e_latency=e2e, queue_time=0.25,
                 decode_throughput=100.0 * (i + 1))


def _run(tmp_path):
    b = RunBuilder(tmp_path / "run")
    trainer, worker = b.process("trainer"), b.process("rollout")
    for step in range(3):
        trainer.span("train", 10.0 * step + 5, 10.0 * step + 8, step=step)
        _requests(worker, step, 2)
    b.write()
    return b, trainer, worker


def _sidecar(cache, kind):
    """The main sidecar file of that kind."""
    (path,) = cache.glob(f"*.{kind}.parquet")
    return path


def _additions(cache, kind):
    return sorted(cache.glob(f"*.{kind}.new-*.parquet"))


def test_request_fields_of_parts_seen_before_come_from_the_sidecar(tmp_path, cache):
    b, trainer, worker = _run(tmp_path)
    first = analysis.engine(store.open(b.run_dir))
    assert first["requests"].tolist() == [2, 2, 2] and first["e2e_latency_mean"].tolist() == [1.0, 1.0, 1.0]
    path = _sidecar(cache, requests_kind())
    table = pq.read_table(path)
    assert len(table) == 6
    # every part is listed as seen, also the trainer's, which holds no request
    assert _parts.listed_parts(table.schema) == _parts.parts_now(store.open(b.run_dir))
    marked = table.set_column(table.schema.get_field_index("e2e_s"), "e2e_s",
                              pc.multiply(table["e2e_s"], 7.0))
    pq.write_table(marked, path)  # marked: e2e_latency reads 7 if taken from here

    _requests(worker, 3, 3, e2e=2.0)  # the run goes on
    b.write()
    again = analysis.engine(store.open(b.run_dir)).set_index("step")
    assert again.loc[[0, 1, 2], "e2e_latency_mean"].tolist() == [7.0, 7.0, 7.0]  # seen parts: not read again
    assert (again.loc[3, "requests"], again.loc[3, "e2e_latency_mean"]) == (3, 2.0)  # the new part was read

    part = next(p for p in (b.run_dir / "spans").glob("*.parquet")
                if "generate" in pq.read_table(p)["phase"].to_pylist() and 0 in pq.read_table(p)["step"].to_pylist())
    pq.write_table(pq.read_table(part), part, compression="none")  # same name, other bytes: another part
    rewritten = analysis.engine(store.open(b.run_dir)).set_index("step")
    assert rewritten.loc[0, "e2e_latency_mean"] == 1.0  # read again


def test_open_spans_with_request_fields_count_without_a_sidecar_row(tmp_path, cache):
    b, _, worker = _run(tmp_path)
    _request(worker, 3, 31.0, None, e2e_latency=4.0)  # still open: its own record, rewritten in place
    b.write()
    con = store.open(b.run_dir)
    table = analysis.engine(con).set_index("step")
    assert (table.loc[3, "requests"], table.loc[3, "e2e_latency_mean"]) == (1, 4.0)
    assert len(pq.read_table(_sidecar(cache, requests_kind()))) == 6  # finished spans only


def test_a_sidecar_that_cannot_be_read_is_computed_again(tmp_path, cache):
    b, _, _ = _run(tmp_path)
    want = analysis.engine(store.open(b.run_dir))
    path = _sidecar(cache, requests_kind())
    path.write_bytes(b"not parquet")
    assert analysis.engine(store.open(b.run_dir)).equals(want)
    assert pq.read_table(path).num_rows == 6  # written again

    path.unlink()
    (cache / path.name).mkdir()  # a folder where the file should be: it cannot be written, the report still works
    assert analysis.engine(store.open(b.run_dir)).equals(want)
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # no half-written file left


def test_additions_are_folded_into_the_main_file(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(_parts, "ADDITIONS", 1)
    b, trainer, worker = _run(tmp_path)
    analysis.engine(store.open(b.run_dir))
    _requests(worker, 3, 1)
    b.write()
    analysis.engine(store.open(b.run_dir))
    assert len(_additions(cache, requests_kind())) == 1 and len(pq.read_table(_sidecar(cache, requests_kind()))) == 6
    _requests(worker, 4, 1)
    b.write()
    table = analysis.engine(store.open(b.run_dir))
    assert _additions(cache, requests_kind()) == []  # folded in
    assert len(pq.read_table(_sidecar(cache, requests_kind()))) == 8
    assert table["requests"].tolist() == [2, 2, 2, 1, 1]
    assert analysis.engine(store.open(b.run_dir)).equals(table)
