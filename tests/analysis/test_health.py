"""A hung run reports its open span; dropped spans are counted per process."""

import numpy as np
import pytest

from rltrace import analysis, store
from rltrace.testing import RunBuilder


def test_hung_run_reports_its_open_span(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout", 3, dropped=12)
    for step in (1, 2):
        ro.span("rollout", 10 * step, 10 * step + 4, step=step)
        tr.span("train", 10 * step + 4, 10 * step + 8, step=step)
    ro.span("rollout", 30, 34, step=3)
    tr.span("train", 34, None, step=3)  # never ended
    b.write()
    con = store.open(b.run_dir)
    now = b.t0_ns + 100 * 10**9
    hung = analysis.open_spans(con, now_ns=now)
    assert len(hung) == 1
    row = hung.iloc[0]
    assert (row["process_id"], row["role"], row["phase"], row["step"]) == (tr.process_id, "trainer", "train", 3)
    assert row["age_s"] == pytest.approx(66.0)
    assert row["stalled_s"] == pytest.approx(0.0)  # the run wrote nothing after it started
    assert not row["ended_cleanly"]
    # open spans do not count as time in the step analyses
    assert np.isnan(analysis.cost_model(con).set_index("step").loc[3, "t_T"])
    drops = analysis.drops(con).set_index("process_id")
    assert drops.loc[ro.process_id, "spans_dropped"] == 12 and drops.loc[tr.process_id, "spans_dropped"] == 0
