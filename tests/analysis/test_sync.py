"""Weight sync broken down into its child phases, and which one grew."""

from __future__ import annotations

import numpy as np
import pytest

from rltrace import analysis, report, store
from rltrace.analysis import summary
from rltrace.analysis._steps import step_filter
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
    assert said == ["Weight sync grew from 510 ms to 3.01 s over 6 syncs (the first and last sync); load grew most, "
                    "from 200 ms to 2.70 s, 100% of the growth."]


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


def _syncs_without_bytes(path):
    """Weight syncs mostly without `rl.bytes`: one per step on the trainer (growing), one on the
    rollout worker every other step whose phase is only in its name, one with bytes, one before
    the first step (no step), and one still open."""
    b = RunBuilder(path)
    tr, ro = b.process("trainer"), b.process("rollout")
    tr.span("weight_sync", -1.0, -0.2)
    for step in range(6):
        t = step * 10.0
        tr.span("train", t, t + 5.0, step=step)
        tr.span("weight_sync", t + 5.0, t + 5.2 + 0.1 * step, step=step)
        if step % 2:
            ro.span(None, t + 5.05, t + 5.1 + 0.3 * step, step=step, name="weight_sync")
        if step == 3:
            tr.span("weight_sync", t + 6.0, t + 6.5, step=step, bytes=4096, method="nccl")
    tr.span("weight_sync", 60.0, None, step=5)
    b.write()
    return store.open(b.run_dir)


def _scanned_syncs(con, steps=None) -> list[float]:
    """The durations of every finished weight_sync span in start order, scanned from the spans."""
    where, params = step_filter(steps)
    return con.execute(
        f"""SELECT duration_s FROM spans WHERE coalesce(phase, name) = 'weight_sync' AND NOT is_open AND {where}
            ORDER BY start_ns""", params).df()["duration_s"].tolist()


def test_every_weight_sync_span_has_a_summary_row(tmp_path):
    con = _syncs_without_bytes(tmp_path / "run")
    rows = summary.rows(con, kinds=("sync",))
    spans = con.execute("""SELECT step, span_id, start_ns, end_ns FROM spans WHERE coalesce(phase, name) = 'weight_sync'
                           AND NOT is_open AND step IS NOT NULL ORDER BY span_id""").df()
    assert len(rows) == 6 + 3 + 1 == len(spans)
    got = rows.sort_values("span_id", ignore_index=True)
    assert got["span_id"].tolist() == spans["span_id"].tolist()
    assert got["start_ns"].tolist() == spans["start_ns"].tolist() and got["end_ns"].tolist() == spans["end_ns"].tolist()
    assert (got["phase"] == "weight_sync").all()
    assert got["count"].dropna().tolist() == [4096] and int(got["count"].isna().sum()) == 9
    points = analysis.weight_sync_points(con)  # the bandwidth fit only reads syncs with a payload size
    assert points[["step", "bytes", "seconds", "method"]].values.tolist() == [[3, 4096.0, pytest.approx(0.5), "nccl"]]
    assert analysis.weight_sync_fit(con)["n"] == 1


@pytest.mark.parametrize("steps", [None, (2, 4), (3, None), (None, 0)])
def test_sync_growth_equals_a_scan_of_the_spans(tmp_path, steps):
    con = _syncs_without_bytes(tmp_path / "run")
    durations = _scanned_syncs(con, steps)
    g = analysis.sync_growth(con, steps)
    assert g["syncs"] == len(durations) == {None: 11, (2, 4): 5, (3, None): 6, (None, 0): 1}[steps]
    w = max(1, min(100, len(durations) // 5))
    assert g["total"]["median_s"] == pytest.approx(float(np.median(durations)), abs=1e-12)
    assert g["window"] == w
    assert g["total"]["first_s"] == pytest.approx(float(np.median(durations[:w])), abs=1e-12)
    assert g["total"]["last_s"] == pytest.approx(float(np.median(durations[-w:])), abs=1e-12)
    assert g["children"] == [] and g["grew"] is None


MB = 1e6


def test_stalled_syncs_neither_bend_the_fit_nor_make_a_trend(tmp_path):
    """1,000 syncs of 1-5 MB at 1 ms + bytes / (1 GB/s), 13 of them stalled (0.2-0.5 s): the fit
    says B_W = 1 GB/s and t_0 = 1 ms, names the 13, and the trend compares medians of the ends."""
    rng = np.random.default_rng(5)
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    stalled = set(rng.choice(np.arange(500, 1000), 13, replace=False).tolist())
    t = 0.0
    for step in range(1000):
        size = (1 + step % 5) * MB
        dur = 1e-3 + size / 1e9 + rng.normal(0, 2e-5)
        if step in stalled:
            dur += rng.uniform(0.2, 0.5)
        tr.span("weight_sync", t, t + dur, step=step, bytes=int(size))
        t += dur + 0.01
    b.write()
    r = report.plain(report.build(store.open(b.run_dir), now_ns=0))
    fit = r["weight_sync_fit"]
    assert fit["regime"] == "bandwidth" and fit["B_W"] == pytest.approx(1e9, rel=0.02)
    assert fit["t_0"] == pytest.approx(1e-3, rel=0.05)
    assert sorted(x["step"] for x in fit["set_aside"]) == sorted(stalled) and fit["kept"] == 987
    text = " ".join(r["findings"])
    assert "B_W = 1.00 GB/s, t_0 = 1.00 ms" in text and "latency-bound" not in text
    assert "13 stalled weight syncs set aside from the fit" in text
    g = r["weight_sync_children"]
    assert g["window"] == 100
    assert g["total"]["first_s"] == pytest.approx(4e-3, rel=0.02) and g["total"]["last_s"] == pytest.approx(4e-3, rel=0.02)
    assert "Weight sync grew" not in text
    assert r["figures"]["B_W"]["kind"] == "derived" and r["figures"]["B_W"]["value"] == fit["B_W"]


def test_t_0_is_not_stated_when_the_payload_explains_the_time():
    sizes = np.array([1, 2, 3, 4, 5] * 20) * MB
    fit = analysis.fit_bandwidth(sizes, sizes / 1e9 + np.tile([1e-6, -1e-6], 50))
    assert fit["regime"] == "bandwidth" and fit["B_W"] == pytest.approx(1e9, rel=1e-3) and fit["t_0"] is None
