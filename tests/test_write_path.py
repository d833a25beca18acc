"""One odd value never costs its neighbours: the write path converts row by row on failure,
makes text valid UTF-8, rejects rltrace's own impossible arguments at the call site, keeps
rltrace's attributes through the attribute limit, and says why anything was dropped."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import rltrace
from rltrace import _names, store
from rltrace.cli import main
from rltrace.cli.info import collect

BAD = b"\xff".decode("utf-8", "surrogateescape")  # a lone surrogate, as os.fsdecode makes from bytes


def _reasons(run_dir) -> list[str]:
    from rltrace.store.rows import describe

    return describe(collect(str(run_dir))["drop_reasons"])


def test_a_surrogate_in_one_exception_message_loses_no_span(run_dir):
    rltrace.init(run_dir)
    for i in range(30):
        with rltrace.phase("train", step=i):
            pass
    with pytest.raises(ValueError):
        with rltrace.phase("reward", step=30):
            raise ValueError("bad byte " + BAD)
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 31
    message = con.execute("SELECT status_message FROM spans WHERE phase = 'reward'").fetchone()[0]
    assert message == "ValueError: bad byte \\udcff"  # escaped, not lost
    assert collect(str(run_dir))["spans_dropped"] == 0


def test_a_hung_phase_named_with_a_surrogate_still_writes_the_open_spans_file(run_dir):
    rltrace.init(run_dir)
    outer = rltrace.phase("step", step=1)
    outer.__enter__()
    hung = rltrace.phase("gen" + BAD)
    hung.__enter__()
    rltrace.flush()  # what a kill -9 after the next flush leaves on disk
    still_open = store.open(run_dir).execute("SELECT name FROM spans WHERE is_open ORDER BY start_ns").fetchall()
    assert still_open == [("step",), ("gen\\udcff",)]  # the hang and its innocent parent
    hung.__exit__(None, None, None)
    outer.__exit__(None, None, None)


@pytest.mark.parametrize("value, message", [(2**70, "step=2**70 does not fit"), (True, "a bool is not a step")])
def test_impossible_steps_are_refused_at_the_call_site(run_dir, value, message):
    rltrace.init(run_dir)
    for call in (
        lambda: rltrace.phase("train", step=value),
        lambda: rltrace.log_metrics(value, loss=1.0),
        lambda: rltrace.log_samples(value, [{"reward": 1.0}]),
    ):
        with pytest.raises((TypeError, ValueError), match=message.replace("*", r"\*")):
            call()
    with pytest.raises(ValueError, match="weight_version"):
        rltrace.phase("train", step=1, weight_version=-(2**64))


def test_one_bad_sample_row_drops_only_itself_and_info_says_why(run_dir, capsys):
    rltrace.init(run_dir)
    rows = [{"sample_id": i, "response_len": 10 + i, "reward": 0.5} for i in range(100)]
    rows[7]["response_len"] = 2**70
    rltrace.log_samples(3, rows)
    rltrace.log_samples(4, {"sample_id": [1, 2], "response_len": [5, "many"]})  # dict of columns
    rltrace.log_samples(5, pa.table({"sample_id": [1, 2], "response_len": pa.array([1, 2**40], pa.int64())}))
    rltrace.shutdown()
    con = store.open(run_dir)
    kept = con.execute("SELECT step, count(*) FROM samples GROUP BY step ORDER BY step").fetchall()
    assert kept == [(3, 99), (4, 1), (5, 2)]
    assert con.execute("SELECT count(*) FROM samples WHERE step = 3 AND sample_id = '7'").fetchone()[0] == 0
    reasons = _reasons(run_dir)
    assert "1 sample row: response_len 2**70 does not fit int64" in reasons
    assert any(r.startswith("1 sample row: response_len 'many' cannot be stored as int64") for r in reasons)
    assert main(["info", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "response_len 2**70 does not fit int64" in out and "RLTRACE_MAX_QUEUE" not in out


def test_text_with_surrogates_is_stored_escaped_in_samples_and_metrics(run_dir):
    rltrace.init(run_dir)
    rltrace.log_samples(1, [{"sample_id": 1, "finish_reason": "stop" + BAD, "note": BAD}, {"sample_id": 2, "finish_reason": "length"}])
    rltrace.log_metrics(1, **{"loss" + BAD: 1.0, "reward_mean": 0.5})
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT finish_reason, note FROM samples ORDER BY sample_id").fetchall() == [
        ("stop\\udcff", "\\udcff"), ("length", None)
    ]
    assert sorted(con.execute("SELECT name FROM metrics").fetchall()) == [("loss\\udcff",), ("reward_mean",)]
    assert collect(str(run_dir))["rows_dropped"] == 0


def test_a_user_column_of_mixed_types_is_stored_as_text_not_dropped(run_dir):
    rltrace.init(run_dir)
    rltrace.log_samples(1, [{"sample_id": 1, "tag": 3}, {"sample_id": 2, "tag": "x"}])
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT tag FROM samples ORDER BY sample_id").fetchall() == [("3",), ("x",)]


def test_rows_missing_from_the_first_row_keep_their_columns(run_dir):
    rltrace.init(run_dir)
    rltrace.log_samples(1, [{"sample_id": 1}, {"sample_id": 2, "reward": 1.0, "extra": "e"}])
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT sample_id, reward, extra FROM samples ORDER BY sample_id").fetchall() == [
        ("1", None, None), ("2", 1.0, "e")
    ]


def test_rltrace_attributes_survive_130_user_attributes_and_cuts_are_counted(run_dir):
    rltrace.init(run_dir)
    config = {f"cfg_{i}": i for i in range(130)}
    with rltrace.phase("train", step=4, weight_version=2, bytes=10, **config) as p:
        p.set(**{f"late_{i}": i for i in range(5)}, method="nccl")
    rltrace.shutdown()
    row = store.open(run_dir).execute("SELECT phase, step, weight_version, attributes FROM spans").fetchone()
    assert row[:3] == ("train", 4, 2)
    attrs = json.loads(row[3])
    assert attrs["rl.bytes"] == 10 and attrs["rl.method"] == "nccl"
    user = [k for k in attrs if k.startswith("rl.cfg_") or k.startswith("rl.late_")]
    assert len(user) == 128 and "rl.cfg_0" in attrs and "rl.cfg_127" in attrs  # the first ones are kept
    info = collect(str(run_dir))
    assert info["attributes_dropped"] == 2 + 5
    assert any("span attributes: over the limit of 128" in r for r in _reasons(run_dir))


def test_process_and_role_with_surrogates_write_rows(run_dir):
    rltrace.init(run_dir, role="rollout" + BAD)
    with rltrace.phase("generate", step=1):
        pass
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT role FROM spans").fetchall() == [("rollout\\udcff",)]
    assert con.execute("SELECT role FROM processes").fetchall() == [("rollout\\udcff",)]


def test_one_bad_sample_does_not_cost_a_frozen_batch(run_dir):
    from rltrace import replay

    rltrace.init(run_dir)
    samples = [{"sample_id": i, "response_text": "fine", "reward": 1.0, "prompt_tokens": [1, 2, 3]} for i in range(8)]
    samples[3]["response_text"] = "template leak " + BAD  # what the bad-text probe flags: still frozen
    samples[5]["reward"] = 2**70
    assert replay.freeze(1, samples)
    columns = {"sample_id": [1, 2], "response_text": ["ok", "odd " + BAD], "reward": [0.5, 0.25]}
    assert replay.freeze(2, columns)
    replay.flush()
    rltrace.shutdown()
    con = store.open(run_dir)
    rows = con.execute("SELECT step, sample_id, response_text FROM batches ORDER BY step, sample_index").fetchall()
    assert [r[1] for r in rows if r[0] == 1] == [0, 1, 2, 3, 4, 6, 7]
    assert ("template leak \\udcff",) in [(r[2],) for r in rows]
    assert [r[2] for r in rows if r[0] == 2] == ["ok", "odd \\udcff"]
    assert any(r.startswith("1 frozen sample: reward ") for r in _reasons(run_dir))


def test_later_rows_are_checked_on_the_writer_and_counted(run_dir):
    rltrace.init(run_dir)
    rltrace.log_samples(1, [{"sample_id": 1}, "not a row", {"sample_id": 3, "step": 99, "reward": 1.0}])
    rltrace.shutdown()
    con = store.open(run_dir)
    assert con.execute("SELECT step, sample_id, reward FROM samples ORDER BY sample_id").fetchall() == [(1, "1", None), (1, "3", 1.0)]
    reasons = _reasons(run_dir)
    assert "1 sample row: not a dict (log_samples takes one dict per sample)" in reasons
    assert any(r.startswith("1 sample value: step set by rltrace itself") for r in reasons)


def test_a_remote_carrier_with_an_impossible_step_is_ignored_not_fatal(run_dir):
    rltrace.init(run_dir, role="reward")
    for step in ("notanumber", str(2**70)):
        with rltrace.attach({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "baggage": f"rl.step={step}"}):
            with rltrace.phase("reward"):
                pass
    rltrace.shutdown()
    assert store.open(run_dir).execute("SELECT phase, step FROM spans").fetchall() == [("reward", None), ("reward", None)]


def test_set_checks_rltrace_integers_like_phase(run_dir):
    rltrace.init(run_dir)
    with rltrace.phase("train", step=1) as p:
        with pytest.raises(ValueError, match="step=2\\*\\*70"):
            p.set(step=2**70)
        with pytest.raises(TypeError, match="bool"):
            p.set(weight_version=False)
        p.set(weight_version=3)
    rltrace.shutdown()
    assert store.open(run_dir).execute("SELECT step, weight_version FROM spans").fetchall() == [(1, 3)]


def test_the_attribute_limit_follows_the_otel_setting(run_dir, monkeypatch):
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "4")
    rltrace.init(run_dir)
    with rltrace.phase("train", step=2, a=1, b=2, c=3, d=4, e=5, f=6, waiting_for="reward"):
        pass
    rltrace.shutdown()
    row = store.open(run_dir).execute("SELECT phase, step, attributes FROM spans").fetchone()
    attrs = json.loads(row[2])
    assert row[:2] == ("train", 2) and attrs["rl.waiting_for"] == "reward"
    assert sorted(k for k in attrs if k not in _names.RESERVED_ATTRS) == ["rl.a", "rl.b", "rl.c", "rl.d"]
    assert collect(str(run_dir))["attributes_dropped"] == 2


def test_non_finite_attributes_are_stored_as_strict_json(run_dir):
    """NaN/inf attributes become null with their spelling kept: every JSON reader accepts the column."""
    import json

    rltrace.init(run_dir, role="trainer")
    with rltrace.phase("train", step=0, loss=float("nan"), scale=float("inf")):
        pass
    rltrace.shutdown()
    (raw,) = rltrace.store.open(run_dir).execute("SELECT attributes FROM spans").fetchone()

    def refuse(token):
        raise ValueError(f"bare {token} in stored JSON")

    attrs = json.loads(raw, parse_constant=refuse)
    assert attrs["rl.loss"] is None and attrs["rl.loss.text"] == "NaN"
    assert attrs["rl.scale"] is None and attrs["rl.scale.text"] == "Infinity"


def test_strict_json_only_rewrites_values_that_hold_nan():
    """Finite values are written exactly as `json.dumps` writes them; NaN/inf anywhere become null."""
    import json

    from rltrace import _json

    finite = {"a": [1, 2.5, None, "x"], "b": {"c": (3, 4)}, 5: True}
    assert _json.dumps(finite, indent=2) == json.dumps(finite, indent=2)
    nested = {"a": [1, {"b": float("nan")}], "c": float("-inf")}
    assert json.loads(_json.dumps(nested)) == {"a": [1, {"b": None}], "c": None}
    assert json.loads(_json.dumps(nested, keep_text=True))["c.text"] == "-Infinity"
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        _json.dumps(loop)
