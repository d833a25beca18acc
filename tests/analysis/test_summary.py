"""Stored per-step summaries are used while they match the spans, and recomputed when not."""

import pandas as pd
import pyarrow.compute as pc
import pytest

from rltrace import _names, analysis, store
from rltrace.analysis import summary
from rltrace.store.parts import write_part
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


def _varied_run(tmp_path):
    """Steps with waits, a critical path and weight syncs with and without `rl.bytes`."""
    b = RunBuilder(tmp_path / "varied")
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(3):
        t = 10.0 * step
        ro.span("rollout", t, t + 4, step=step)
        tr.span("train", t + 4, t + 6, step=step)
        tr.span("weight_sync", t + 6, t + 7, step=step, **({"bytes": 1000 * (step + 1)} if step else {}))
    b.write()
    return store.open(b.run_dir)


def test_summary_rows_have_the_types_duckdb_gives(tmp_path):
    """Rows come through Arrow, typed as DuckDB's own `.df()` types them: an integer column with a
    null is Int64, a text column with no value is object, every value the same."""
    con = _varied_run(tmp_path)
    every = summary.rows(con)
    kinds = sorted(set(every["kind"]))
    assert {"sync", "wait", "path", "phase", "step"} <= set(kinds)
    for kind, steps in [(None, None), *((k, None) for k in kinds), ("sync", (0, 0)), ("wait", (7, 9))]:
        where = "true" if kind is None else f"kind = '{kind}'"
        if steps:
            where += f" AND step BETWEEN {steps[0]} AND {steps[1]}"
        want = con.execute(f"SELECT * FROM {summary._CACHE} WHERE {where} {summary._order()}").df()
        got = summary.rows(con, steps, kinds=None if kind is None else (kind,))
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert [str(t) for t in got.dtypes] == [str(t) for t in want.dtypes]
    sync = summary.rows(con, kinds=("sync",))
    assert str(sync["count"].dtype) == "Int64" and sync["count"].tolist()[1:] == [2000, 3000]


def test_summary_rows_read_only_the_columns_asked(tmp_path):
    con = _varied_run(tmp_path)
    every = summary.rows(con, kinds=("wait", "step"))
    some = summary.rows(con, kinds=("wait", "step"), columns=("step", "kind", "seconds"))
    assert list(some.columns) == ["step", "kind", "seconds"]
    pd.testing.assert_frame_equal(some, every[["step", "kind", "seconds"]], check_exact=True)
    with pytest.raises(ValueError, match="no such summary column: secs"):
        summary.rows(con, columns=("step", "secs"))


def test_a_connection_holding_every_step_checks_no_step_again(tmp_path, monkeypatch):
    con = _varied_run(tmp_path)
    first = summary.rows(con, (1, 1))  # one step only: the others are still to fill
    assert set(first["step"]) == {1}
    every = summary.rows(con)
    assert set(every["step"]) == {0, 1, 2}
    looked = []
    monkeypatch.setattr(summary, "checks", lambda *a, **k: looked.append(a) or pytest.fail("checked again"))
    assert _same_rows(summary.rows(con, (1, 1)), every[every["step"] == 1])
    assert _same_rows(summary.rows(con), every) and not looked


def _same_rows(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """The same rows in any order (rows of one step, kind and seq come in no set order)."""
    def key(frame):
        return sorted(map(str, frame.astype(object).where(frame.notna(), None).itertuples(index=False)))
    return list(a.columns) == list(b.columns) and key(a) == key(b)
