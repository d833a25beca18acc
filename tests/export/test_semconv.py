"""Names of the OpenTelemetry `rl.*` proposal written alongside rltrace's own (docs/store.md)."""

from __future__ import annotations

import json

import rltrace
from rltrace import _names, store
from rltrace.export import otlp
from rltrace.testing import RunBuilder


def test_live_spans_and_the_resource_carry_the_proposals_names(run_dir):
    run = rltrace.init(run_dir, role="trainer", rank=0)
    with rltrace.phase("step", step=1):
        with rltrace.phase("rollout"):
            pass
        with rltrace.phase("my_phase"):
            pass
    rltrace.shutdown()
    con = store.open(run_dir)
    rows = dict(con.execute("SELECT name, attributes FROM spans").fetchall())
    assert json.loads(rows["step"])["rl.operation.name"] == "rl.loop"
    assert json.loads(rows["rollout"])["rl.operation.name"] == "rl.sample"
    assert "rl.operation.name" not in json.loads(rows["my_phase"])  # no mapping: nothing invented
    assert con.execute("SELECT phase, step FROM spans WHERE name = 'rollout'").fetchone() == ("rollout", 1)  # own columns
    resource = json.loads(con.execute("SELECT resource FROM processes").fetchone()[0])
    assert resource["rl.run.id"] == resource["rl.run_id"] == run.run_id


def test_export_adds_them_to_runs_recorded_before(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("weight_sync", 0, 1, step=0, bytes=10)
    b.write()
    con = store.open(b.run_dir)
    resources = otlp._resources(con)
    row = next(con.execute("SELECT * FROM spans").df().itertuples(index=False))
    span = otlp.to_readable(row, otlp._resource_for(resources, row))
    assert span.attributes["rl.operation.name"] == "rl.sync" and span.attributes["rl.phase"] == "weight_sync"


def test_every_weight_sync_child_is_in_the_sync_group():
    assert all(_names.SEMCONV_GROUP_OF_PHASE[c] == "rl.sync" for c in _names.WEIGHT_SYNC_CHILDREN)
