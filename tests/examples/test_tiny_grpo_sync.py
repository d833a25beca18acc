"""The demo's weight sync in child phases: `--slow-sync` (a throttled link) shows up as `transfer`."""

from __future__ import annotations

import pytest

from rltrace import analysis, report, store


@pytest.mark.slow
def test_slow_sync_shows_which_child_grew(demo):
    slow_dir, _ = demo("slow_sync")
    base_dir, _ = demo("straggler")  # same size and steps, an unthrottled link
    con = store.open(slow_dir)
    rows = analysis.sync_children(con)
    per_sync = rows.groupby("sync_span_id")["child"].apply(set)
    assert len(per_sync) == 4  # the initial sync and one per step
    assert all(children >= {"gather", "transfer", "drain", "load"} for children in per_sync)
    assert (rows[rows["child"] == "transfer"]["bytes"] > 2e6).all()  # the model's weights, ~2.6 MB in fp32
    slow = report.build(con)
    assert slow["weight_sync_children"]["largest"] == "transfer"
    assert any(s.startswith("Of the weight sync, transfer takes the most") for s in slow["findings"]), slow["findings"]
    rows = {r["what"]: r for r in report.compare(slow, report.build(store.open(base_dir)))}
    ratios = {what.split()[1]: r["ratio"] for what, r in rows.items() if what.startswith("weight_sync ")}
    assert set(ratios) >= {"gather", "transfer", "drain", "load"}
    assert max(ratios, key=ratios.get) == "transfer" and ratios["transfer"] > 5, ratios
