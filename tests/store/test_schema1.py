"""Runs written before span ids became integers (schema version 1: ids as hex text) still read:
converted on read, or once and for all by `rltrace compact`. The run in `schema1/run` was written
by that release (`schema1/make_run.py`); `schema1/expected.json` is what it read then."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import _names, store
from rltrace.cli import main as cli
from rltrace.store import ids

HERE = Path(__file__).parent / "schema1"
EXPECTED = json.loads((HERE / "expected.json").read_text())
COLUMNS = ["trace_id", "span_id", "parent_span_id", "name", "phase", "step", "start_ns", "end_ns", "is_open", "process_id"]


@pytest.fixture
def old_run(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(HERE / "run", run)
    return run


def _spans(run: Path) -> list[dict]:
    con = store.open(run)
    rows = con.execute(f"SELECT {', '.join(COLUMNS)} FROM spans ORDER BY start_ns, span_id").fetchall()
    return [dict(zip(COLUMNS, r)) for r in rows]


def _versions(run: Path, folder: str) -> set[int]:
    return {int(pq.read_metadata(p).metadata[_names.META_VERSION]) for p in (run / folder).glob("*.parquet")}


def test_the_old_run_reads_as_it_did_with_ids_as_hex(old_run):
    assert json.loads((old_run / "run.json").read_text())["schema_version"] == 1
    assert _versions(old_run, "spans") == {1}
    assert _spans(old_run) == EXPECTED["spans"]  # every id, parent link, time and open record as written
    con = store.open(old_run)
    stored = con.execute("SELECT span_id, parent_span_id, trace_id, span_hex(span_id) FROM _spans").fetchall()
    by_hex = {row[3]: row for row in stored}
    for span in EXPECTED["spans"]:  # the stored form: int64 and 16 bytes, the same ids
        got = by_hex[span["span_id"]]
        assert got[0] == ids.span_int(span["span_id"]) and got[1] == ids.span_int(span["parent_span_id"])
        assert got[2] == bytes.fromhex(span["trace_id"])
    totals = con.execute("""SELECT phase, count(*), sum(end_ns - start_ns) FROM spans WHERE NOT is_open
                            GROUP BY phase ORDER BY phase""").fetchall()
    assert [{"phase": p, "count": n, "ns": int(ns)} for p, n, ns in totals] == EXPECTED["phase_totals"]


def test_the_report_of_the_old_run_follows_its_parent_links(old_run, capsys):
    assert cli(["report", str(old_run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in report["steps"]][:3] == [0, 1, 2]
    phases = {p["phase"]: p for p in report["phases"]}
    assert phases["forward"]["spans"] == 6 and phases["generate"]["spans"] == 9
    assert [o["phase"] for o in report["open_spans"]] == ["generate"]  # the killed worker's hung phase
    assert len(report["open_spans"][0]["span_id"]) == 16  # people see the hex id


def test_compact_rewrites_old_span_parts_once_and_new_writers_join_the_old_run(old_run):
    before = _spans(old_run)
    rltrace.init(old_run, role="reward")  # a process of this release joins the old run
    with rltrace.phase("reward", step=2):
        with rltrace.phase("score"):
            pass
    rltrace.shutdown()
    assert _versions(old_run, "spans") == {1, _names.SPANS.version}
    mixed = _spans(old_run)
    assert len(mixed) == len(before) + 2 and all(s in mixed for s in before)
    assert cli(["compact", str(old_run), "--grace", "0"]) == 0
    assert _versions(old_run, "spans") == {_names.SPANS.version}  # converted once, not on every read
    assert _spans(old_run) == mixed
