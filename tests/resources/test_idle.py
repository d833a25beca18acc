"""Idle GPUs under a phase, from stored `resources` rows (hand-built: no GPU on this machine)."""

from __future__ import annotations

from rltrace import analysis, report, store
from rltrace.testing import RunBuilder


def _run(path):
    b = RunBuilder(path)
    tr = b.process("trainer", 3)
    ro = b.process("rollout", 0)
    for step in range(3):
        t = step * 10.0
        tr.span("train", t, t + 6, step=step)
        tr.span("wait", t + 6, t + 10, step=step)
        ro.span("generate", t, t + 10, step=step)
        for k in range(10):  # 1 Hz: GPU 3 nearly idle under train; rollout's GPU 0 busy
            b.resource(t + k + 1, tr, device=3, util_pct=4.0 if k < 6 else 0.0, device_name="H100")
            b.resource(t + k + 1, ro, device=0, util_pct=95.0)
            b.resource(t + k + 1, tr, kind="cpu", util_pct=100.0)
    b.write()
    return store.open(b.run_dir)


def test_idle_devices_names_the_gpu_phase_and_process(tmp_path):
    con = _run(tmp_path / "run")
    idle = analysis.idle_devices(con)
    assert len(idle) == 1
    row = idle.iloc[0]
    assert (row["device"], row["phase"], row["role"], row["rank"]) == (3, "train", "trainer", 3)
    assert row["util_mean_pct"] == 4.0 and row["samples"] == 18 and row["steps"] == 3  # wait is not work
    per = analysis.phase_resources(con, steps=(1, 1))
    assert set(per["step"]) == {1}
    gen = per[(per["phase"] == "generate")].iloc[0]
    assert gen["util_mean_pct"] == 95.0 and gen["samples"] == 10


def test_the_report_names_the_idle_gpu(tmp_path):
    data = report.build(_run(tmp_path / "run"), now_ns=0)
    assert "GPU 3 was 4 % busy during `train` on trainer3 (mean of 18 samples over 3 step(s))." in data["findings"]
    assert data["idle_devices"][0]["device"] == 3


def test_a_run_without_samples_has_no_idle_devices(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("train", 0, 1, step=0)
    b.write()
    con = store.open(b.run_dir)
    assert analysis.idle_devices(con).empty and analysis.phase_resources(con).empty
