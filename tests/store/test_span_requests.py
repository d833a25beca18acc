"""Engine request rows stored by the writer that merged a span part (`span_requests/`): a report
reads them instead of every span's attribute text, gets the rows the spans give, ignores rows of
another extraction version, and they go when their part is replaced."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import _names, analysis, store
from rltrace.analysis import _parts
from rltrace.store import merge, requests

REQUESTS = 6 * 5


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A rollout process recording 5 requests a step (SGLang's meta as attributes) over 6 steps;
    its writer merges its parts as it goes and at exit, into one part with its request rows."""
    monkeypatch.setattr(merge, "MARK_ROWS", 10)  # small parts count as large: the rows are stored
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    rltrace.init(run_dir, role="rollout", flush_interval=0.01)
    for step in range(6):
        with rltrace.phase("rollout", step=step):
            for i in range(5):
                with rltrace.phase("generate", e2e_latency=0.5 + i, queue_time=0.1, decode_throughput=90.0,
                                   prompt_tokens=100, cached_tokens=10 * i):
                    pass
        rltrace.flush()
    rltrace.shutdown()
    return run_dir


def _requests(run_dir, monkeypatch, cache) -> tuple[pd.DataFrame, bool]:
    """The run's engine requests from a fresh connection and cache, and whether a span part was
    scanned for them (rather than read from its writer's rows)."""
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(cache))
    con = store.open(run_dir)
    scans = []
    real = _parts._scan

    def spy(con_, name, schema, select, parts, *args, **kwargs):
        from_writers = real(con_, name, schema, select, parts, *args, **kwargs)
        if name.startswith("_rltrace_part_requests"):
            scans.append(set(parts) - from_writers)
        return from_writers

    monkeypatch.setattr(_parts, "_scan", spy)
    try:
        return analysis.engine_requests(con), any(scans)
    finally:
        monkeypatch.setattr(_parts, "_scan", real)


def test_a_report_reads_the_writers_request_rows_not_the_spans(run, monkeypatch, tmp_path):
    parts = list((run / "spans").glob("*.parquet"))
    stored = list((run / _names.SPAN_REQUESTS.folder).glob("*.parquet"))
    assert len(parts) == 1 and [p.name for p in stored] == [parts[0].name]
    meta = pq.read_metadata(stored[0]).metadata
    assert meta[_names.META_REQUESTS_SQL] == requests.SQL_VERSION and pq.read_metadata(stored[0]).num_rows == REQUESTS

    got, scanned = _requests(run, monkeypatch, tmp_path / "c1")
    assert not scanned  # no span part was read for them
    assert len(got) == REQUESTS and sorted(got["cached_tokens"].tolist()) == sorted([10.0 * i for i in range(5)] * 6)
    assert not list((tmp_path / "c1").glob("*.requests*.parquet"))  # nor copied into the sidecar: the file stays

    for path in stored:  # without the writer's rows: the same requests, from the spans
        path.unlink()
    want, scanned = _requests(run, monkeypatch, tmp_path / "c2")
    assert scanned
    pd.testing.assert_frame_equal(got, want)


def test_rows_of_another_extraction_version_are_not_used(run, monkeypatch, tmp_path):
    want, _ = _requests(run, monkeypatch, tmp_path / "c1")
    monkeypatch.setattr(requests, "SQL_VERSION", b"an-older-version")  # what a later release would see
    got, scanned = _requests(run, monkeypatch, tmp_path / "c2")
    assert scanned
    pd.testing.assert_frame_equal(got, want)


def test_the_rows_go_with_their_part(run):
    part = next((run / "spans").glob("*.parquet"))
    beside = merge.sidecar_paths(part)
    assert {p.parent.name for p in beside} == {_names.SPAN_DIGEST.folder, _names.SPAN_REQUESTS.folder}
    assert (run / _names.SPAN_REQUESTS.folder / part.name).exists()
    merge.delete(part)
    assert not part.exists() and not any(p.exists() for p in beside)


def test_a_part_without_requests_stores_none(tmp_path, monkeypatch):
    monkeypatch.setattr(merge, "MARK_ROWS", 10)
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    rltrace.init(tmp_path / "run", role="trainer", flush_interval=0.01)
    for step in range(6):
        for _ in range(5):
            with rltrace.phase("train", step=step):
                pass
        rltrace.flush()
    rltrace.shutdown()
    assert len(list((tmp_path / "run" / "spans").glob("*.parquet"))) == 1
    assert not list((tmp_path / "run" / _names.SPAN_REQUESTS.folder).glob("*.parquet"))


@pytest.mark.parametrize("marked", [True, False])
def test_a_merged_part_says_whether_a_rollout_marks_mismatch_not_recorded(tmp_path, monkeypatch, marked):
    """The footer mark `rltrace.mismatch_missing.1` is 1 exactly when a span holds the key, and a
    report finds the marked rollouts (a part marked 0 is not read for them)."""
    from rltrace.store import parts

    monkeypatch.setattr(parts, "MARK_ROWS", 10)
    monkeypatch.setattr(merge, "FLUSH_PARTS", 4)
    monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / "cache"))
    rltrace.init(tmp_path / "run", role="rollout", flush_interval=0.01)
    for step in range(6):
        extra = {"mismatch_missing": "generate is wrapped"} if marked and step >= 4 else {}
        with rltrace.phase("rollout", step=step, **extra):
            for _ in range(5):
                with rltrace.phase("generate"):
                    pass
        rltrace.flush()
    rltrace.shutdown()
    part = next((tmp_path / "run" / "spans").glob("*.parquet"))
    assert pq.read_metadata(part).metadata[_names.META_MISMATCH_MISSING] == (b"1" if marked else b"0")
    found = analysis.mismatch_missing(store.open(tmp_path / "run"))
    if marked:
        assert found[["reason", "steps", "first_step", "last_step"]].values.tolist() == [["generate is wrapped", 2, 4, 5]]
    else:
        assert found.empty
