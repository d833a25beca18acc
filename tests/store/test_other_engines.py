"""The spans of a run are a plain Parquet dataset: `pyarrow.dataset` alone (as Spark, Trino or
ClickHouse would, from the same files) reads them and gets the per-phase totals `rltrace report`
prints. docs/scale.md documents the schema and when to move to such an engine."""

from __future__ import annotations

import contextvars
import json
import threading
import textwrap
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

import rltrace
from rltrace.cli import main as cli

from ..conftest import PYTHON, REPO, python_env

WORKER = """
import sys, time, rltrace
rltrace.init(sys.argv[1], role="reward", flush_interval=0.01)
for step in range(6):
    with rltrace.phase("reward", step=step):
        for _ in range(3):
            with rltrace.phase("score"):
                time.sleep(0.002)
    rltrace.flush()
rltrace.shutdown()
"""


def _record(run_dir) -> None:
    """Two processes; a rollout whose requests overlap on threads (union < sum); parts merged by the writers."""
    import subprocess

    worker = subprocess.Popen([PYTHON, "-c", WORKER, str(run_dir)], cwd=REPO, env=python_env())
    rltrace.init(run_dir, role="rollout", flush_interval=0.01)
    for step in range(6):
        with rltrace.phase("rollout", step=step):
            def requests():
                for _ in range(4):
                    with rltrace.phase("generate"):
                        time.sleep(0.001)
            threads = [threading.Thread(target=contextvars.copy_context().run, args=(requests,)) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        with rltrace.phase("train", step=step):
            time.sleep(0.003)
        rltrace.flush()
    hung = rltrace.start_phase("generate", step=6)  # open: in open_spans/, not in the dataset of finished spans
    rltrace.flush()
    assert worker.wait(timeout=120) == 0
    hung.end()
    rltrace.shutdown()


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    order = np.argsort(starts, kind="stable")
    total, cur_s, cur_e = 0, None, None
    for s, e in zip(starts[order].tolist(), ends[order].tolist()):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0 if cur_e is None else cur_e - cur_s)


def test_pyarrow_dataset_alone_gets_the_reports_per_phase_totals(run_dir, capsys):
    _record(run_dir)
    spans = ds.dataset(run_dir / "spans", format="parquet").to_table()
    schema = spans.schema
    assert schema.field("span_id").type == pa.int64() and schema.field("parent_span_id").type == pa.int64()
    assert schema.field("trace_id").type == pa.binary(16) and schema.field("step").type == pa.int64()
    assert len(pc.unique(spans["span_id"])) == spans.num_rows  # every span once: no replaced part left after exit
    phase = pc.coalesce(spans["phase"], spans["name"]).to_numpy(zero_copy_only=False)
    step = spans["step"].to_numpy(zero_copy_only=False)
    start, end = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    stepped = ~np.isnan(step.astype(float))
    mine = {}
    for name in sorted(set(phase[stepped])):
        rows = stepped & (phase == name)
        union = sum(_union_ns(start[rows & (step == s)], end[rows & (step == s)]) for s in set(step[rows].tolist()))
        mine[name] = {"spans": int(rows.sum()), "span_s": int((end[rows] - start[rows]).sum()) / 1e9, "total_s": union / 1e9}

    assert cli(["report", str(run_dir), "--json"]) == 0
    report = {p["phase"]: p for p in json.loads(capsys.readouterr().out)["phases"]}
    assert set(report) == set(mine)
    for name, want in mine.items():
        got = report[name]
        assert got["spans"] == want["spans"], name
        assert abs(got["span_s"] - want["span_s"]) < 1e-9 and abs(got["total_s"] - want["total_s"]) < 1e-9, name
    assert mine["generate"]["total_s"] < mine["generate"]["span_s"]  # requests overlapped: the union counts them once
    # the per-part summaries are Parquet too, beside the parts they summarise (where they merge spans:
    # the rollout worker's requests overlap; the reward worker's scores run one after another)
    summaries = {p.name for p in (run_dir / "span_digests").iterdir()}
    assert summaries and summaries < {p.name for p in (run_dir / "spans").iterdir()}
    assert pq.read_schema(next((run_dir / "span_digests").iterdir())).field("count").type == pa.int64()


def documented_reader(run_dir):
    """The spans that the pyarrow snippet of docs/scale.md reads, run as written there."""
    text = (REPO / "docs" / "scale.md").read_text()
    snippet = text.split("  ```python\n", 1)[1].split("  ```", 1)[0]
    namespace = {"RUN_DIR": run_dir}
    exec(textwrap.dedent(snippet), namespace)  # noqa: S102 - the documentation's own code
    return namespace["spans"]


def test_the_documented_pyarrow_reader_reads_again_when_parts_are_merged_away_under_it(run_dir, monkeypatch):
    """A compaction replaces and deletes the parts while the snippet of docs/scale.md reads their
    footers: it lists again and reads each span once, not FileNotFoundError."""
    from rltrace import _names
    from rltrace.store import merge

    monkeypatch.setenv("RLTRACE_MERGE_PARTS", "0")
    rltrace.init(run_dir, role="trainer", flush_interval=0.01)
    for step in range(4):
        with rltrace.phase("train", step=step):
            pass
        rltrace.flush()
    rltrace.shutdown()
    flushed = sorted((run_dir / "spans").glob("*.parquet"))
    real, compacted = pq.read_metadata, []

    def read_metadata(path, *args, **kwargs):
        if not compacted:  # the compaction runs between the snippet's listing and its first read
            compacted.append(True)
            merge.merge(run_dir / "spans", _names.SPANS, flushed, "c-000000000001.parquet")
            for part in flushed:
                part.unlink()
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pq, "read_metadata", read_metadata)
    spans = documented_reader(run_dir)
    assert compacted and spans.num_rows == len(pc.unique(spans["span_id"])) == 4


def test_the_documented_pyarrow_reader_leaves_out_parts_a_killed_writer_left_replaced(run_dir, capsys):
    """A writer killed right after a merge leaves the merged part and the parts it replaces: every
    file read counts their spans twice; the reader docs/scale.md shows (footers, pyarrow alone)
    reads each span once, as `rltrace report` does."""
    import pathlib

    from rltrace import _names
    from rltrace.store import merge

    rltrace.init(run_dir, role="trainer", flush_interval=0.01)
    for step in range(4):
        with rltrace.phase("train", step=step):
            pass
        rltrace.flush()
    rltrace.shutdown()
    flushed = sorted((run_dir / "spans").glob("*.parquet"))  # as the writer left them at exit
    # a merge of them whose writer was killed before it deleted its inputs
    merge.merge(run_dir / "spans", _names.SPANS, flushed, "trainer-killed-m00000099.parquet")
    assert len(list((run_dir / "spans").glob("*.parquet"))) == len(flushed) + 1
    every = ds.dataset(run_dir / "spans", format="parquet").to_table()

    spans = documented_reader(run_dir)

    assert cli(["report", str(run_dir), "--json"]) == 0
    counted = sum(p["spans"] for p in json.loads(capsys.readouterr().out)["phases"])
    assert spans.num_rows == len(pc.unique(spans["span_id"])) == counted == 4
    assert every.num_rows == 2 * counted  # every file: each span twice
