"""OTLP replay against a real backend (Arize Phoenix) on loopback: the spans arrive with their ids."""

import pytest

from rltrace import store
from rltrace.cli import main
from rltrace.export import otlp
from rltrace.testing import RunBuilder

from ..phoenix import free_port, phoenix_spans

pytestmark = pytest.mark.slow


def test_replay_sends_every_finished_span_with_its_ids(phoenix, tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    st = tr.span("step", 0, 10, step=4, weight_version=3)
    ro.span("rollout", 0, 4, step=4, parent=st, n=64)
    tr.span("weight_sync", 8, 9, step=4, parent=st, bytes=2048, method="nccl")
    tr.span("train", 10, None, step=5)  # open: left out
    b.write()
    result = otlp.replay(store.open(b.run_dir), phoenix)
    assert (result.sent, result.open_skipped) == (3, 1)
    stored = {r[0]: r for r in store.open(b.run_dir).execute(
        "SELECT span_id, parent_span_id, trace_id, name, start_ns FROM spans WHERE NOT is_open").fetchall()}
    got = phoenix_spans(phoenix, {r[2] for r in stored.values()}, 3)
    by_id = {s["context"]["span_id"]: s for s in got}
    assert set(by_id) == set(stored)
    for span_id, (_, parent, trace_id, name, start_ns) in stored.items():
        s = by_id[span_id]
        assert s["name"] == name and s["context"]["trace_id"] == trace_id
        assert s.get("parent_id") == parent
    sync = by_id[[k for k, v in stored.items() if v[3] == "weight_sync"][0]]
    assert sync["attributes"]["rl.bytes"] == 2048 and sync["attributes"]["rl.step"] == 4
    assert sync["attributes"]["rl.operation.name"] == "rl.sync"  # added on export: the hand-built run predates it


def test_cli_replay_and_an_unreachable_backend(phoenix, tmp_path, capsys):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("train", 0, 1, step=1)
    b.write()
    assert main(["export", str(b.run_dir), "--format", "otlp", "--endpoint", phoenix]) == 0
    assert "sent 1 spans" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(otlp.OtlpExportError, match="did not accept spans"):
        otlp.replay(store.open(b.run_dir), dead, timeout_s=1)
