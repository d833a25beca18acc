"""`rltrace compact` stores per-step summaries; reports read them and give the same answers."""

from rltrace import _names, report, store
from rltrace.cli import main
from rltrace.testing import RunBuilder


def test_compact_stores_summaries_that_reproduce_the_report(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(6):
        o = 10.0 * step
        r = ro.span("rollout", o, o + 4, step=step)
        ro.span("generate", o, o + 3.5, step=step, parent=r, thread=2)
        tr.span("train", o + 4, o + 8, step=step)
        tr.span("weight_sync", o + 8, o + 9, step=step, bytes=1000 * (step + 1))
    b.write(parts_per_process=3)
    before = report.build(store.open(b.run_dir), now_ns=0)
    assert main(["compact", str(b.run_dir), "--grace", "0"]) == 0
    assert (b.run_dir / _names.STEP_SUMMARY.folder / "step_summary.parquet").exists()
    con = store.open(b.run_dir)
    assert con.execute("SELECT count(DISTINCT step) FROM step_summary").fetchone()[0] == 6
    assert report.build(con, now_ns=0) == before
