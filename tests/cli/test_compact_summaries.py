"""`rltrace compact` stores per-step summaries; reports read them and give the same answers."""

import pyarrow.compute as pc
import pyarrow.parquet as pq

from rltrace import _names, analysis, report, store
from rltrace.analysis import _compute
from rltrace.cli import main
from rltrace.store.parts import write_part
from rltrace.testing import RunBuilder


def _run(path):
    """Disaggregated steps plus colocated-style waits: the trainer waits inside rollout while the
    worker generates, and once for a generate on its own second thread."""
    b = RunBuilder(path)
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(6):
        o = 10.0 * step
        r = tr.span("rollout", o, o + 4, step=step)
        tr.span("wait", o + 0.5, o + 4, step=step, parent=r, waiting_for="generate" if step % 2 else None)
        ro.span("generate", o, o + 3.5, step=step, parent=r, thread=2)
        tr.span("generate", o + 0.5, o + 1.5, step=step, parent=r, thread=3)
        tr.span("train", o + 4, o + 8, step=step)
        tr.span("weight_sync", o + 8, o + 9, step=step, bytes=1000 * (step + 1))
    b.write(parts_per_process=3)
    return b.run_dir


def test_compact_stores_summaries_that_reproduce_the_report(tmp_path):
    run = _run(tmp_path / "run")
    before = report.build(store.open(run), now_ns=0)
    assert {w["in_phase"] for w in before["waits"] if w["role"] == "trainer"} == {"rollout"}  # waits inside rollout
    assert main(["compact", str(run), "--grace", "0"]) == 0
    assert (run / _names.STEP_SUMMARY.folder / "step_summary.parquet").exists()
    con = store.open(run)
    assert con.execute("SELECT count(DISTINCT step) FROM step_summary").fetchone()[0] == 6
    assert report.build(con, now_ns=0) == before


def test_summaries_of_an_older_algorithm_are_recomputed(tmp_path):
    run = _run(tmp_path / "run")
    assert main(["compact", str(run), "--grace", "0"]) == 0
    expected = analysis.waits(store.open(run))
    path = run / _names.STEP_SUMMARY.folder / "step_summary.parquet"
    stale = pq.read_table(path)
    stale = stale.set_column(stale.schema.get_field_index("version"), "version",
                             pc.subtract(stale["version"], 1))
    stale = stale.set_column(stale.schema.get_field_index("seconds"), "seconds", pc.multiply(stale["seconds"], 10.0))
    write_part(path.parent, path.name, stale.cast(_names.STEP_SUMMARY_SCHEMA), _names.STEP_SUMMARY)
    con = store.open(run)
    assert con.execute("SELECT max(version) FROM step_summary").fetchone()[0] == _compute.VERSION - 1
    assert analysis.waits(con).equals(expected)
