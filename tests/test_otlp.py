"""The same spans reach a real OpenTelemetry backend: Arize Phoenix, started on loopback."""

from __future__ import annotations

import pytest

import rltrace
from rltrace import store

from .phoenix import phoenix_spans

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_spans_reach_phoenix_and_the_store_alike(phoenix, run_dir, monkeypatch, via):
    if via == "environment":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix)
        rltrace.init(run_dir, role="trainer", rank=0)
    else:
        rltrace.init(run_dir, role="trainer", rank=0, otlp_endpoint=phoenix)
    with rltrace.phase("step", step=4, weight_version=2):
        with rltrace.phase("weight_sync", bytes=4096, method="disk"):
            pass
    rltrace.shutdown()
    stored = store.open(run_dir).execute("SELECT trace_id, span_id, parent_span_id, name FROM spans ORDER BY start_ns").fetchall()
    found = phoenix_spans(phoenix, {stored[0][0]}, 2)
    got = {(r["context"]["span_id"], r["parent_id"], r["name"]) for r in found}
    assert got == {(s, p, n) for _, s, p, n in stored}
    sync = next(r for r in found if r["name"] == "weight_sync")
    assert sync["attributes"]["rl.step"] == 4 and sync["attributes"]["rl.bytes"] == 4096
    assert sync["attributes"]["rl.method"] == "disk" and sync["attributes"]["rl.phase"] == "weight_sync"
    assert sync["attributes"]["rl.operation.name"] == "rl.sync"  # the OTel rl.* proposal's group, alongside
