"""`rltrace import metrics`: logs written by verl's own loggers (TensorBoard through the real
SummaryWriter, and its JSONL file logger) give the report's cost model the logged stage times."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rltrace import store
from rltrace.cli import main as cli
from rltrace.cli.info import collect
from rltrace.importers import frameworks
from rltrace.importers.metrics import import_metrics
from rltrace.importers.readers import MetricsImportError
from rltrace.report.build import build
from rltrace.store import rows as store_rows

pytest.importorskip("tensorboard")
torch_tb = pytest.importorskip("torch.utils.tensorboard")

# verl timings per global step (seconds): gen, reward, old_log_prob, ref, adv, update_actor, update_weights, step
RNG = np.random.default_rng(7)
STEPS = 6
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def _timings(step: int) -> dict[str, float]:
    t = {name: float(RNG.uniform(0.05, 3.0)) for name in STAGES}
    t["gen"] *= 1 + (step == 3) * 4  # one slow rollout
    t["step"] = sum(t.values()) + 0.25  # the driver's own time between blocks
    return t


LOGGED = {gs: _timings(gs) for gs in range(1, STEPS + 1)}  # verl's global_steps start at 1


def _record(gs: int) -> dict[str, float]:
    data = {f"timing_s/{k}": v for k, v in LOGGED[gs].items()}
    data.update({"critic/rewards/mean": 0.1 * gs, "response_length/mean": 100.0 + gs, "my_project/odd name": gs * 2.0,
                 "checkpoint_engine/payload_mbytes": 64.0})
    return data


def _verl_loggers(tmp_path, monkeypatch):
    """verl's Tracking with its tensorboard and file backends when verl is installed, else the same writers."""
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    try:
        from verl.utils.tracking import Tracking
    except Exception:
        Tracking = None
    if Tracking is not None:
        tracking = Tracking(project_name="p", experiment_name="e", default_backend=["tensorboard", "file"])
        for gs in LOGGED:
            tracking.log(data=_record(gs), step=gs)
        for logger in tracking.logger.values():  # verl closes them in __del__
            getattr(logger, "finish", lambda: None)()
        return
    writer = torch_tb.SummaryWriter(str(tmp_path / "tb"))
    with open(tmp_path / "log.jsonl", "w") as f:
        for gs in LOGGED:
            for key, value in _record(gs).items():
                writer.add_scalar(key, value, gs)
            f.write(json.dumps({"step": gs, "data": _record(gs)}) + "\n")
    writer.close()


@pytest.fixture
def verl_logs(tmp_path, monkeypatch):
    _verl_loggers(tmp_path, monkeypatch)
    return tmp_path


def _expected(cast) -> dict[int, dict[str, float]]:
    out = {}
    for gs, t in LOGGED.items():
        t = {k: cast(v) for k, v in t.items()}
        r = t["gen"] + t["reward"]
        tt = t["old_log_prob"] + t["ref"] + t["adv"] + t["update_actor"]
        out[gs - 1] = {"t_R": r, "t_T": tt, "t_W": t["update_weights"], "t_reward": t["reward"],
                       "async_bound": max(r, tt) + t["update_weights"], "wall_s": t["step"]}
    return out


@pytest.mark.parametrize("source,cast", [("tb", lambda v: float(np.float32(v))), ("log.jsonl", float)])
def test_cost_model_equals_logged_timings(verl_logs, tmp_path, source, cast):
    result = import_metrics([verl_logs / source], tmp_path / "run")
    assert result["framework"] == "verl" and result["steps"] == STEPS
    report = build(store.open(tmp_path / "run"))
    expected = _expected(cast)
    assert [s["step"] for s in report["steps"]] == list(range(STEPS))  # 0-based
    for row in report["steps"]:
        for key, value in expected[row["step"]].items():
            assert row[key] == pytest.approx(value, abs=1e-6), (row["step"], key)
    med = {key: float(np.median([e[key] for e in expected.values()])) for key in ("t_R", "t_T", "t_W")}
    for key in med:
        assert report[key] == pytest.approx(med[key], abs=1e-6)
    assert report["async_bound"] == pytest.approx(max(med["t_R"], med["t_T"]) + med["t_W"], abs=1e-6)  # on medians
    assert report["bottleneck"]["stage"] in ("rollout", "train")
    assert report["findings"][0].startswith("All spans come from imported metric logs")


def test_every_scalar_kept_with_aliases_and_bytes(verl_logs, tmp_path):
    import_metrics([verl_logs], tmp_path / "run")  # a folder: the TensorBoard file and the JSONL
    con = store.open(tmp_path / "run")
    names = {r[0] for r in con.execute("SELECT DISTINCT name FROM metrics").fetchall()}
    assert {"my_project/odd name", "timing_s/gen", "critic/rewards/mean", "reward_mean", "response_len_mean"} <= names
    reward = con.execute("SELECT step, avg(value) FROM metrics WHERE name = 'reward_mean' GROUP BY step ORDER BY step").fetchall()
    assert [s for s, _ in reward] == list(range(STEPS))
    assert reward[2][1] == pytest.approx(0.3, rel=1e-6)
    sync = con.execute("""SELECT DISTINCT name, phase, json_extract_string(attributes, '$."rl.bytes"'),
                          json_extract_string(attributes, '$."rl.source"') FROM spans WHERE phase = 'weight_sync'""").fetchall()
    assert sync == [("update_weights", "weight_sync", str(64 * 2**20), "metrics")]
    attributes = [a for (a,) in con.execute("SELECT attributes FROM spans").fetchall()]
    assert all(a == store_rows.dumps(json.loads(a)) for a in attributes)  # the JSON every producer writes
    # stage spans are siblings under their step span and never overlap
    rows = con.execute("SELECT step, span_id, parent_span_id, phase, start_ns, end_ns FROM spans ORDER BY step, start_ns").df()
    for step, g in rows.groupby("step"):
        parent = g[g["phase"] == "step"]
        kids = g[g["phase"] != "step"].sort_values("start_ns")
        assert len(parent) == 1  # TensorBoard and JSONL log the same steps: one step span each
        assert set(kids["parent_span_id"]) == set(parent["span_id"]) and len(kids) == len(STAGES)
        assert (kids["start_ns"].to_numpy()[1:] >= kids["end_ns"].to_numpy()[:-1]).all()
        assert kids["start_ns"].min() >= parent["start_ns"].iloc[0] and kids["end_ns"].max() <= parent["end_ns"].iloc[0]


def test_cli_prints_summary(verl_logs, tmp_path, capsys):
    assert cli(["import", "metrics", str(verl_logs / "tb"), "--out", str(tmp_path / "run"), "--framework", "verl"]) == 0
    out = capsys.readouterr().out
    assert "verl:" in out and "spans over 6 steps" in out and "rl.source=metrics" in out


def _records(path) -> list[tuple[int, int, list]]:
    """(start byte, end byte, [(step, tag), ...]) of every record of an event file, by tensorboard's own parser."""
    import struct

    from tensorboard.compat.proto.event_pb2 import Event

    data, pos, out = path.read_bytes(), 0, []
    while pos + 12 <= len(data):
        n = struct.unpack_from("<Q", data, pos)[0]
        event = Event.FromString(data[pos + 12 : pos + 12 + n])
        out.append((pos, pos + 16 + n, [(event.step, v.tag) for v in event.summary.value]))
        pos += 16 + n
    return out


def _stored(run) -> list[tuple[int, str]]:
    """(logged step, name) of every scalar imported as logged (rltrace's alias rows left out)."""
    from rltrace import _names

    added = sorted({c for n in _record(1) if (c := _names.canonical_metric(n)) and c != n})
    con = store.open(run)
    return sorted(con.execute("SELECT step + 1, name FROM metrics WHERE NOT list_contains(?, name)", [added]).fetchall())


def test_a_damaged_event_file_loses_only_the_damaged_records(verl_logs, tmp_path):
    """40 bytes overwritten mid-file: the records they touch are counted with the byte where the
    damage starts; every record before and after is imported."""
    (event,) = (verl_logs / "tb").glob("*tfevents*")
    data = bytearray(event.read_bytes())
    damaged = tmp_path / "bad" / event.name
    damaged.parent.mkdir()
    lo, hi = len(data) // 2, len(data) // 2 + 40
    data[lo:hi] = b"\xff" * 40
    damaged.write_bytes(bytes(data))
    result = import_metrics([damaged], tmp_path / "run", framework="verl")
    records = _records(event)
    kept = sorted(pair for start, end, pairs in records if end <= lo or start >= hi for pair in pairs)
    assert _stored(tmp_path / "run") == kept
    hit = [start for start, end, _ in records if start < hi and end > lo]
    assert len(result["dropped"]) == 1 and str(damaged) in result["dropped"][0] and f"byte {hit[0]}" in result["dropped"][0]
    info = collect(str(tmp_path / "run"))
    assert [r["table"] for r in info["drop_reasons"]] == ["metric log records"] and info["rows_dropped"] >= 1
    assert str(damaged) in info["drop_reasons"][0]["reason"]


def test_a_foreign_file_costs_only_itself(verl_logs, tmp_path, capsys):
    foreign = tmp_path / "events.out.tfevents.123.host"
    foreign.write_bytes(b"PK\x03\x04 this is a zip file, not an event file" * 10)
    assert cli(["import", "metrics", str(foreign), "--out", str(tmp_path / "run2")]) == 2  # nothing to import: an error
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(foreign) in err and "not a TensorBoard event file" in err
    assert not (tmp_path / "run2").exists()
    assert cli(["import", "metrics", str(foreign), str(verl_logs / "log.jsonl"), "--out", str(tmp_path / "run3")]) == 1
    out = capsys.readouterr().out
    assert "not imported" in out and "not a TensorBoard event file" in out and "spans over 6 steps" in out
    assert store.open(tmp_path / "run3").execute("SELECT count(DISTINCT step) FROM metrics").fetchone()[0] == STEPS


@pytest.mark.parametrize("byte,why", [(5, "a length far past the end"), (8, "a checksum bit")])
def test_a_damaged_record_header_costs_that_record_not_the_rest_of_the_file(verl_logs, tmp_path, byte, why):
    """A damaged length cannot be followed: reading goes on from the next record whose header and
    payload checksums hold, so only the damaged record is lost (never every record after it)."""
    import struct

    (event,) = (verl_logs / "tb").glob("*tfevents*")
    data = bytearray(event.read_bytes())
    pos = 0
    for _ in range(5):  # the sixth record
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    data[pos + byte] ^= 0x40
    damaged = tmp_path / "bad" / event.name
    damaged.parent.mkdir()
    damaged.write_bytes(bytes(data))
    result = import_metrics([damaged], tmp_path / "run", framework="verl")
    records = _records(event)
    assert _stored(tmp_path / "run") == sorted(p for start, _, pairs in records if start != pos for p in pairs), why
    (line,) = result["dropped"]
    assert line == f"{damaged}, byte {pos}: damaged record header (fails its checksum); {records[5][1] - pos:,} bytes skipped to the next record", line


def test_truncated_tail_is_counted_not_fatal(verl_logs, tmp_path):
    (event,) = (verl_logs / "tb").glob("*tfevents*")
    cut = tmp_path / "cut" / event.name
    cut.parent.mkdir()
    cut.write_bytes(event.read_bytes()[:-7])  # a writer killed mid-record
    result = import_metrics([cut], tmp_path / "run")
    assert result["skipped"] == {"truncated record at the end of the file": 1}
    assert result["steps"] == STEPS


def test_unknown_framework_is_a_clear_error(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 1, "loss_of_something": 1.0}) + "\n")
    with pytest.raises(MetricsImportError, match="--framework"):
        import_metrics([log], tmp_path / "run")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(MetricsImportError, match=r"bad.jsonl, line 2: not JSON"):
        import_metrics([bad], tmp_path / "run", framework="verl")


@pytest.mark.parametrize("name,names", [
    ("slime", ["perf/rollout_time", "perf/train_time", "rollout/response_len/mean", "train/loss"]),
    ("openrlhf", ["train/timing/generation", "train/timing/ppo_train", "train/timing/step_total", "train/policy_loss"]),
    ("trl", ["train/reward", "train/completions/mean_length", "profiling/Time taken: GRPOTrainer.compute_loss"]),
    ("verl", ["timing_s/gen", "critic/rewards/mean"]),
])
def test_detects_each_framework(name, names):
    assert frameworks.detect(names) == name


def test_slime_and_openrlhf_maps(tmp_path):
    """slime logs rollout ids from 0 with train nested timers; OpenRLHF's TensorBoard tags are train/<key> from 1."""
    slime = tmp_path / "slime.jsonl"
    slime.write_text("\n".join(json.dumps({"rollout/step": i, "perf/rollout_time": 4.0, "perf/train_time": 2.0,
                                           "perf/actor_train_time": 1.5, "perf/update_weights_time": 0.5,
                                           "perf/train_wait_time": 4.5, "perf/step_time": 6.5,
                                           "rollout/raw_reward": 0.5}) for i in range(3)))
    import_metrics([slime], tmp_path / "s")
    r = build(store.open(tmp_path / "s"))
    assert [s["step"] for s in r["steps"]] == [0, 1, 2]
    assert (r["t_R"], r["t_T"], r["t_W"]) == pytest.approx((4.0, 2.0, 0.5))  # actor_train is inside train
    w = torch_tb.SummaryWriter(str(tmp_path / "orl"))
    for gs in (1, 2):
        for k, v in {"timing/generation": 3.0, "timing/make_experience": 1.0, "timing/ppo_train": 2.0,
                     "timing/broadcast": 0.25, "timing/step_total": 6.25, "rollout/reward_mean": 0.7}.items():
            w.add_scalar(f"train/{k}", v, gs)
    w.close()
    assert import_metrics([tmp_path / "orl"], tmp_path / "o")["framework"] == "openrlhf"
    r = build(store.open(tmp_path / "o"))
    assert [s["step"] for s in r["steps"]] == [0, 1]
    assert (r["t_R"], r["t_T"], r["t_W"]) == pytest.approx((3.0, 3.0, 0.25))
    assert r["reward"]["mean"] == pytest.approx(0.7, rel=1e-6)


def test_csv_export(tmp_path):
    csv = tmp_path / "wandb.csv"
    csv.write_text("_step,timing_s/gen,timing_s/update_actor,timing_s/step,note\n1,2.0,1.0,3.5,hello\n2,2.5,1.0,3.5,\n")
    result = import_metrics([csv], tmp_path / "run")
    assert result["skipped"] == {"non-numeric value (str)": 1}
    r = build(store.open(tmp_path / "run"))
    assert [s["t_R"] for s in r["steps"]] == pytest.approx([2.0, 2.5])


@pytest.fixture(autouse=True)
def _quiet_tf(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def test_tensor_scalars_and_histograms_from_tensorboards_own_writer(tmp_path):
    """TF2 writes scalars as `scalars`-plugin tensors; histograms are not scalars (counted, not stored)."""
    import time

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    writer = EventFileWriter(str(tmp_path / "tf2"))
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    for gs in (1, 2):
        values = [summary_pb2.Summary.Value(tag="timing_s/gen", metadata=meta,
                                            tensor=tensor_util.make_tensor_proto(1.5 * gs)),
                  summary_pb2.Summary.Value(tag="timing_s/update_actor", simple_value=0.0),  # a real zero
                  summary_pb2.Summary.Value(tag="weights", histo=summary_pb2.HistogramProto(min=0, max=1, num=3))]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=gs, summary=summary_pb2.Summary(value=values)))
    writer.close()
    result = import_metrics([tmp_path / "tf2"], tmp_path / "run")
    assert result["skipped"] == {"non-scalar histo": 2}
    con = store.open(tmp_path / "run")
    rows = con.execute("SELECT step, name, value FROM metrics ORDER BY name, step").fetchall()
    assert rows == [(0, "timing_s/gen", 1.5), (1, "timing_s/gen", 3.0), (0, "timing_s/update_actor", 0.0),
                    (1, "timing_s/update_actor", 0.0)]


def test_imported_spans_beside_traced_ones_are_counted_by_their_writer(verl_logs, tmp_path):
    """Metrics imported into a traced run: the report counts the spans the importer wrote, not a
    traced span that happens to carry the same `rl.source` attribute."""
    from rltrace.testing import RunBuilder

    run = tmp_path / "run"
    b = RunBuilder(run)
    trainer = b.process("trainer")
    for step in range(3):
        trainer.span("train", 10.0 * step, 10.0 * step + 4, step=step)
    trainer.span("train", 40.0, 41.0, step=4, source="metrics")  # a user's own attribute
    b.write()
    result = import_metrics([verl_logs / "log.jsonl"], run)
    imported = build(store.open(run))["imported_spans"]
    assert imported == {"metrics": result["spans"], "total": result["spans"] + 4}
    assert result["spans"] > 0
