"""Weight sync broken down into its child phases, and which one grew."""

from __future__ import annotations

import pytest

from rltrace import analysis, report, store
from rltrace.testing import RunBuilder


def _growing_run(path):
    """Six syncs: gather 0.1 s, transfer 0.2 s, then a worker's load that grows 0.5 s per sync."""
    b = RunBuilder(path)
    tr, ro = b.process("trainer"), b.process("rollout")
    for step in range(6):
        t = step * 10.0
        load = 0.2 + 0.5 * step
        sync = tr.span("weight_sync", t, t + 0.3 + load + 0.01, step=step)
        tr.span("gather", t, t + 0.1, step=step, parent=sync, bytes=1000)
        tr.span("transfer", t + 0.1, t + 0.3, step=step, parent=sync, bytes=1000)
        recv = ro.span("weight_load", t + 0.3, t + 0.3 + load, step=step, parent=sync)
        ro.span("drain", t + 0.3, t + 0.3, step=step, parent=recv)
        ro.span("load", t + 0.3, t + 0.3 + load, step=step, parent=recv, bytes=2000)
    b.write()
    return store.open(b.run_dir)


def test_children_are_found_across_processes(tmp_path):
    rows = analysis.sync_children(_growing_run(tmp_path / "run"))
    assert len(rows) == 6 * 4
    last = rows[rows["step"] == 5].set_index("child")
    assert last.loc["load", "seconds"] == pytest.approx(2.7) and last.loc["load", "bytes"] == 2000
    assert last.loc["gather", "seconds"] == pytest.approx(0.1)


def test_the_child_that_grew_is_named(tmp_path):
    con = _growing_run(tmp_path / "run")
    g = analysis.sync_growth(con)
    assert g["syncs"] == 6 and g["grew"] == "load" and g["largest"] == "load"
    load = next(c for c in g["children"] if c["child"] == "load")
    assert load["growth_s"] == pytest.approx(2.5) and load["share_of_growth"] == pytest.approx(1.0)
    transfer = next(c for c in g["children"] if c["child"] == "transfer")
    assert transfer["growth_s"] == pytest.approx(0.0, abs=1e-9)
    said = [s for s in report.build(con, now_ns=0)["findings"] if s.startswith("Weight sync grew")]
    assert said == ["Weight sync grew from 510 ms to 3.01 s over 6 syncs (fitted); load grew most, from 200 ms to "
                    "2.70 s, 100% of the growth."]


def test_a_flat_sync_gets_no_growth_sentence(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(5):
        sync = tr.span("weight_sync", step, step + 0.5, step=step)
        tr.span("transfer", step, step + 0.5, step=step, parent=sync)
    b.write()
    data = report.build(store.open(b.run_dir), now_ns=0)
    assert data["weight_sync_children"]["grew"] is None
    assert not [s for s in data["findings"] if "grew" in s]
