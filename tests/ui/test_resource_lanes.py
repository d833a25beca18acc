"""The Timeline draws utilisation lanes under the spans when the run sampled resources."""

from __future__ import annotations

import json

from rltrace.testing import RunBuilder

from .conftest import no_exceptions
from .test_pages import charts, page, values


def _run(path, *, sampled: bool):
    b = RunBuilder(path)
    tr = b.process("trainer", 3)
    for step in range(2):
        t = step * 4.0
        st = tr.span("step", t, t + 4, step=step)
        tr.span("train", t, t + 3, step=step, parent=st)
        tr.span("wait", t + 3, t + 4, step=step, parent=st)
    if sampled:
        for k in range(1, 9):
            b.resource(k, tr, device=3, util_pct=4.0)
            b.resource(k, tr, kind="cpu", util_pct=90.0, mem_bytes=1 << 30)
    b.write()
    return b.run_dir


def test_lanes_follow_the_spans_and_name_each_device(app, tmp_path):
    at = page(app(_run(tmp_path / "run", sampled=True)), "timeline")
    figures = charts(at)
    lanes = [f for f in figures if "GPU 3" in str(f.proto.spec)]
    assert len(lanes) == 1
    spec = json.loads(lanes[0].proto.spec)
    names = [t["name"] for t in spec["data"]]
    assert names == ["trainer3 GPU 3", "trainer3 CPU"]
    assert values(spec["data"][0]["y"]) == [4.0] * 4  # step 0's window (0 to 4 s) holds samples 1..4
    assert any("Utilisation under the spans" in c.value for c in at.caption)


def test_no_lanes_without_samples(app, tmp_path):
    at = page(app(_run(tmp_path / "run", sampled=False)), "timeline")
    no_exceptions(at)
    assert not any("Utilisation under the spans" in c.value for c in at.caption)


def test_overview_lists_alerts_that_hold_and_those_watch_raised(app, tmp_path):
    """A killed process (no shutdown, an old heartbeat) and an alert stored by `rltrace watch --once`."""
    from rltrace.cli import main as cli

    run = _run(tmp_path / "run", sampled=False)
    assert cli(["watch", str(run), "--once", "--rules", "heartbeat"]) == 1
    at = app(run)
    no_exceptions(at)
    (table,) = [d for d in at.dataframe if "message" in d.value.columns]
    rows = table.value
    assert list(rows["rule"]) == ["heartbeat"] and rows["when"].iloc[0] == "now"
    assert "trainer3 on node0 has not written to the store" in rows["message"].iloc[0]
