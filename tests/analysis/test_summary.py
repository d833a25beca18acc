"""Stored per-step summaries are used while they match the spans, and recomputed when not."""

import pyarrow.compute as pc

from rltrace import _names, analysis, store
from rltrace.store.writer import write_part
from rltrace.testing import RunBuilder


def _run(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in (1, 2):
        tr.span("rollout", 10 * step, 10 * step + 3, step=step)
        tr.span("train", 10 * step + 3, 10 * step + 5, step=step)
    b.write()
    return b, tr


def _store_tampered(run_dir):
    """Store the summary with step 1's t_R changed to 99, keeping the fingerprint."""
    table = analysis.summary_table(store.open(run_dir))
    tamper = pc.and_(pc.equal(table["kind"], "stage"), pc.equal(table["phase"], "R"))
    seconds = pc.if_else(pc.and_(tamper, pc.equal(table["step"], 1)), 99.0, table["seconds"])
    table = table.set_column(table.schema.get_field_index("seconds"), "seconds", seconds)
    write_part(run_dir / _names.STEP_SUMMARY.folder, "step_summary.parquet", table, _names.STEP_SUMMARY)


def test_stored_summary_is_used_while_the_step_is_unchanged(tmp_path):
    b, _ = _run(tmp_path)
    _store_tampered(b.run_dir)
    cm = analysis.cost_model(store.open(b.run_dir)).set_index("step")
    assert cm.loc[1, "t_R"] == 99.0  # read from the stored summary, not recomputed
    assert cm.loc[2, "t_R"] == 3.0


def test_a_step_that_gained_spans_is_recomputed(tmp_path):
    b, tr = _run(tmp_path)
    _store_tampered(b.run_dir)
    tr.span("reward", 13, 14, step=1)  # written after the summary: step 1's fingerprint changes
    b.write()
    cm = analysis.cost_model(store.open(b.run_dir)).set_index("step")
    assert cm.loc[1, "t_R"] == 4.0
    assert cm.loc[1, "t_reward"] == 1.0
