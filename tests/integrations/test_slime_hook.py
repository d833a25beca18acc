"""The slime live hook on slime's own rollout code, checked against importing the dump that same run wrote.

slime's rollout (`generate_rollout`, `generate_and_rm`, its trace utilities, `Sample`) runs from the
checkout named by RLTRACE_SLIME_SRC with the stand-in SGLang engine of tests/replay/slime_run.py.
Megatron cannot run here: `train_step` stands in for slime's train actor, calling slime's own
`Timer` the way `MegatronTrainRayActor.train_actor` and `update_weights` do.
"""

from __future__ import annotations

import json
import time

import pytest

import rltrace
from rltrace import store
from rltrace.replay.slime import import_slime
from tests.replay import slime_run

pytestmark = pytest.mark.skipif(not slime_run.available(), reason=slime_run.MISSING)

COLUMNS = ["trace_id", "span_id", "parent_span_id", "name", "phase", "step", "weight_version", "start_ns", "end_ns",
           "status", "status_message", "thread_id", "thread_name", "attributes", "events"]
SAMPLE_COLUMNS = ["step", "sample_id", "group_id", "prompt_len", "response_len", "finish_reason", "reward",
                  "weight_version", "weight_versions", "train_version", "gen_start", "gen_end", "in_batch",
                  "effective_response_len", "cached_tokens", "total_prompt_tokens", "non_generation_time",
                  "repetition", "spec_accept_rate", "spec_accept_length"]
TRAIN_S = {"data_preprocess": 0.002, "log_probs": 0.004, "actor_train": 0.01, "update_weights": 0.006}


def train_step(rollout_id: int) -> None:
    """Stand-in for MegatronTrainRayActor.train + update_weights: slime's own timers, no Megatron."""
    from slime.observability.timer import inverse_timer, timer

    with timer("data_preprocess"):
        time.sleep(TRAIN_S["data_preprocess"])
    with inverse_timer("train_wait"), timer("train"):
        with timer("log_probs"):
            time.sleep(TRAIN_S["log_probs"])
        with timer("actor_train"):
            time.sleep(TRAIN_S["actor_train"])
    update_weights()


def update_weights() -> None:
    from slime.observability.timer import timer

    with timer("update_weights"):  # actor.py: `@timer def update_weights(self)`, no rollout_id in reach
        time.sleep(TRAIN_S["update_weights"])


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """One slime run with the hook on; its dumps imported into a second run dir."""
    from rltrace.integrations import slime as hook

    root = tmp_path_factory.mktemp("slime_hook")
    assert hook.instrument()
    try:
        slime_run.Slime()  # slime's modules, with the stand-ins
        from slime.observability.timer import Timer

        rltrace.init(root / "live", role="rollout")
        Timer().start("train_wait")  # as MegatronTrainRayActor.init does when it returns
        rollouts = slime_run.run(root / "dump", rollouts=2, partial=True, trainer=train_step)
        rltrace.shutdown()
    finally:
        hook.uninstrument()
    import_slime([root / "dump"], root / "import")
    return rollouts, store.open(root / "live"), store.open(root / "import"), hook


def _spans(con):
    return con.execute(f"SELECT {', '.join(COLUMNS)} FROM spans WHERE NOT is_open ORDER BY span_id").df()


def _samples(con):
    return con.execute(f"SELECT {', '.join(SAMPLE_COLUMNS)} FROM samples ORDER BY step, sample_id").df()


def _dumped(rollouts):
    ids = {s.index for r in rollouts for s in r.samples}
    groups = {s.group_index for r in rollouts for s in r.samples}
    return ids, groups


def test_live_spans_are_the_imported_spans(both):
    rollouts, live, imported, _ = both
    got, want = _spans(live), _spans(imported)
    assert len(want) > 50
    same = got[got["span_id"].isin(want["span_id"])].reset_index(drop=True)
    assert same.to_json(orient="records") == want.to_json(orient="records")  # every column, every span the dump holds
    # what the live hook saw beyond the dump: its own phases, and samples slime never dumped
    # (the group aborted at the end of the last rollout, waiting in slime's buffer; groups over the target)
    extra = got[~got["span_id"].isin(want["span_id"])]
    ids, groups = _dumped(rollouts)
    for row in extra.itertuples():
        attrs = json.loads(row.attributes)
        if "slime.group_id" not in attrs:
            assert row.name in ("rollout", *TRAIN_S, "train", "train_wait"), row.name
        elif "slime.sample_id" in attrs:
            assert attrs["slime.sample_id"] not in ids, row
        else:
            assert row.name in ("generate_and_rm_group", "group_reward_model") and attrs["slime.group_id"] not in groups


def test_structure_steps_versions_and_lanes(both):
    rollouts, live, _, _ = both
    spans = _spans(live)
    slime_spans = spans[spans["attributes"].str.contains("slime.group_id")]
    by_id = spans.set_index("span_id")
    for row in slime_spans.itertuples():  # every parent is a recorded span (group copies merged into one)
        if isinstance(row.parent_span_id, str):
            assert row.parent_span_id in by_id.index, row.name
    assert set(slime_spans["step"]) == {0, 1}
    engine = slime_spans[slime_spans["name"] == "sglang_generate"]
    assert set(engine["weight_version"]) == {1, 2}  # the version SGLang answered under
    assert (engine["step"] + 1 == engine["weight_version"]).all()  # the engine moves on after each train
    assert set(slime_spans["phase"]) >= {"rollout", "generate", "reward", "tool_call"}
    tools = slime_spans[slime_spans["name"] == "tool_call"]  # the custom generate function's tool turn
    assert len(tools) >= 2 and (tools["parent_span_id"].isin(slime_spans.loc[slime_spans["name"] == "generate_and_rm", "span_id"])).all()
    # each sample in its own lane: group * 10000 + 1 + its place in the group
    for row in slime_spans[slime_spans["name"] == "generate_and_rm"].itertuples():
        sid = json.loads(row.attributes)["slime.sample_id"]
        assert row.thread_name == f"group {sid // 4} · sample {sid}" and row.thread_id == (sid // 4) * 10000 + 1 + sid % 4
    # per-sample timing: the samples' own trace events, to the nanosecond
    for r in rollouts:
        for s in r.samples:
            ev = [e for e in s.trace["events"] if e["type"] == "span_start" and e["name"] == "reward_model"]
            ends = {e["span_id"]: e["ts"] for e in s.trace["events"] if e["type"] == "span_end"}
            last = max(ev, key=lambda e: e["ts"])
            mine = spans[(spans["name"] == "reward_model") & (spans["start_ns"] == round(last["ts"] * 1e9))]
            assert len(mine) == 1 and mine["end_ns"].iloc[0] == round(ends[last["span_id"]] * 1e9)


def test_live_samples_are_the_imported_samples(both):
    rollouts, live, imported, _ = both
    got, want = _samples(live), _samples(imported)
    assert len(want) == sum(len(r.samples) for r in rollouts) + 4  # + the carried-over part of 4 samples
    assert got.to_json(orient="records") == want.to_json(orient="records")  # ids, columns, values
    engine = got[got["in_batch"]]
    assert (engine["cached_tokens"] >= 0).all() and (engine["total_prompt_tokens"] > 0).all()


def test_rollout_and_timer_phases(both):
    rollouts, live, _, _ = both
    spans = live.execute("""SELECT name, phase, step, (end_ns - start_ns) / 1e9 AS s, span_id, parent_span_id, status
                            FROM spans WHERE NOT is_open AND attributes NOT LIKE '%slime.group_id%'""").df()
    rollout = spans[spans["name"] == "rollout"].sort_values("step")
    assert list(rollout["step"]) == [0, 1] and set(rollout["phase"]) == {"rollout"}
    for r, seconds in zip(rollouts, rollout["s"]):
        assert seconds == pytest.approx(r.ended - r.started, abs=0.1)
    phases = {n: p for n, p in zip(spans["name"], spans["phase"])}
    assert phases == {"rollout": "rollout", "train": "train", "actor_train": "train", "log_probs": "forward",
                      "update_weights": "weight_sync", "train_wait": "wait", "data_preprocess": "data_preprocess"}
    for name, seconds in TRAIN_S.items():
        mine = spans[spans["name"] == name]
        assert sorted(mine["step"]) == [0, 1], name  # step = the rollout id (update_weights: the latest seen)
        assert (mine["s"] >= seconds).all() and (mine["s"] < seconds + 0.5).all(), name
    train = spans[spans["name"] == "train"].set_index("step")
    inner = spans[spans["name"].isin(["log_probs", "actor_train"])]
    assert all(train.loc[s, "span_id"] == p for s, p in zip(inner["step"], inner["parent_span_id"]))
    # the wait before each train is that train's step (slime's perf/train_wait_time); the one after the
    # last train was still open when the process ended (closed then, with an error)
    waits = spans[spans["name"] == "train_wait"]
    assert sorted(waits.loc[waits["status"] != "ERROR", "step"]) == [0, 1]
    assert list(waits.loc[waits["status"] == "ERROR", "step"]) == [1]
    from rltrace.report.build import build

    report = build(live)
    assert report["t_T"] > 0 and report["t_W"] > 0 and report["t_R"] > 0


def test_a_malformed_trace_event_is_counted_not_raised(both, tmp_path):
    _, _, _, hook = both
    slime_run.Slime()
    from slime.observability import trace_utils
    from slime.utils.types import Sample

    assert hook.instrument()
    try:
        rltrace.init(tmp_path / "run")
        before = hook.live.faults
        sample = Sample(index=0, group_index=0)
        handle = trace_utils.bind_trace(sample)
        event = trace_utils._append_event(handle, kind="span_end", name="x", timestamp="not a time", span_id="a")
        assert event["ts"] == "not a time"  # slime's own result, unchanged
        trace_utils.trace_event(sample, "late")  # no span at all: an event kept for the first span
        with trace_utils.trace_span(sample, "reward_model"):
            pass
        assert hook.live.faults == before + 1
        rltrace.shutdown()
        con = store.open(tmp_path / "run")
        (reasons,) = con.execute("SELECT drop_reasons FROM processes").fetchone()
        assert "slime traces" in reasons and "not a timed span or event" in reasons
        (events,) = con.execute("SELECT events FROM spans WHERE name = 'reward_model'").fetchone()
        assert json.loads(events)[0]["name"] == "late"
    finally:
        hook.uninstrument()


def test_uninstrument_restores_slime(both, tmp_path):
    _, _, _, hook = both
    slime_run.Slime()
    from slime.observability import timer, trace_utils
    from slime.rollout import base_types, sglang_rollout

    originals = (trace_utils._append_event, trace_utils.build_sglang_meta_trace_attrs, timer.Timer.start,
                 timer.Timer.end, sglang_rollout.generate_rollout, sglang_rollout.build_sglang_meta_trace_attrs,
                 base_types.call_rollout_fn)
    assert hook.instrument()
    assert trace_utils._append_event is not originals[0] and timer.Timer.start is not originals[2]
    assert sglang_rollout.build_sglang_meta_trace_attrs is trace_utils.build_sglang_meta_trace_attrs
    hook.instrument()  # twice is once
    hook.uninstrument()
    assert (trace_utils._append_event, trace_utils.build_sglang_meta_trace_attrs, timer.Timer.start, timer.Timer.end,
            sglang_rollout.generate_rollout, sglang_rollout.build_sglang_meta_trace_attrs,
            base_types.call_rollout_fn) == originals
    from slime.utils.types import Sample

    rltrace.init(tmp_path / "run")  # nothing is recorded any more
    with trace_utils.trace_span(Sample(index=0, group_index=0), "generate_and_rm"):
        timer.Timer().start("train")
        timer.Timer().end("train")
    rltrace.shutdown()
    assert store.open(tmp_path / "run").execute("SELECT count(*) FROM spans").fetchone() == (0,)


def test_rltrace_run_instruments_an_unchanged_slime_script(tmp_path):
    """`rltrace run -- python script.py`: the instrumentor patches slime's modules as the script imports them."""
    import subprocess
    import sys

    from ..conftest import python_env

    script = ("import sys; from pathlib import Path; from tests.replay import slime_run; "
              "slime_run.run(Path(sys.argv[1]), rollouts=1, partial=False, train=False)")
    env = python_env(RLTRACE_INSTRUMENTORS="rltrace.integrations.slime:SlimeInstrumentor",
                     RLTRACE_SLIME_SRC=str(slime_run.SRC))
    argv = [sys.executable, "-m", "rltrace", "run", "--run-dir", str(tmp_path / "live"), "--",
            sys.executable, "-c", script, str(tmp_path / "dump")]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import_slime([tmp_path / "dump"], tmp_path / "import")
    live, imported = store.open(tmp_path / "live"), store.open(tmp_path / "import")
    assert _samples(live).to_json(orient="records") == _samples(imported).to_json(orient="records")
    got, want = _spans(live), _spans(imported)
    assert len(want) > 20 and want["span_id"].isin(got["span_id"]).all()
    assert live.execute("SELECT count(*) FROM spans WHERE name = 'rollout' AND step = 0").fetchone() == (1,)
    assert live.execute("SELECT DISTINCT role FROM spans").fetchall() == [("rollout",)]  # slime's rollout process


def test_an_evaluation_rollout_is_an_eval_phase_without_sample_spans(both, tmp_path):
    """slime runs evaluation through the same `call_rollout_fn`; `rltrace import slime` skips eval dumps."""
    _, _, _, hook = both
    slime_run.Slime()
    from slime.observability.trace_utils import trace_span
    from slime.rollout import base_types
    from slime.utils.types import Sample

    def evaluate(args, rollout_id, data_source, evaluation=False):
        with trace_span(Sample(index=0, group_index=0), "generate_and_rm"):
            time.sleep(0.002)
        return base_types.RolloutFnEvalOutput(data={})

    assert hook.instrument()
    try:
        rltrace.init(tmp_path / "run")
        out = base_types.call_rollout_fn(evaluate, None, 3, None, evaluation=True)
        assert isinstance(out, base_types.RolloutFnEvalOutput)
        rltrace.shutdown()
    finally:
        hook.uninstrument()
    rows = store.open(tmp_path / "run").execute("SELECT name, phase, step FROM spans").fetchall()
    assert rows == [("eval", "eval", 3)]


def test_a_rollout_function_path_named_by_the_user(both, tmp_path):
    """`--rollout-function-path rltrace.integrations.slime.generate_rollout`, loaded by slime's own `load_function`."""
    _, _, _, hook = both
    assert not hook.SlimeInstrumentor().is_instrumented
    rltrace.init(tmp_path / "live")
    try:
        slime_run.run(tmp_path / "dump", rollouts=1, partial=False, train=False,
                      rollout_function_path="rltrace.integrations.slime.generate_rollout")
        rltrace.shutdown()
    finally:
        hook.uninstrument()
    import_slime([tmp_path / "dump"], tmp_path / "import")
    live, imported = store.open(tmp_path / "live"), store.open(tmp_path / "import")
    assert _samples(live).to_json(orient="records") == _samples(imported).to_json(orient="records")
    assert _spans(imported)["span_id"].isin(_spans(live)["span_id"]).all()


def test_live_work_carried_into_the_next_rollout_is_cut_at_the_window(tmp_path):
    """slime's fully-async rollout keeps a group running from rollout 0 into rollout 1: the live hook
    counts it in each step for the time it ran there, as the importer does, and stores each group
    span once although the group outlives the rollout that opened it."""
    from rltrace.integrations import slime as hook

    assert hook.instrument()
    try:
        slime_run.Slime()
        rltrace.init(tmp_path / "live", role="rollout")
        rollouts = slime_run.run(tmp_path / "dump", rollouts=2, fully_async=True, train=False)
        rltrace.shutdown()
    finally:
        hook.uninstrument()
    con = store.open(tmp_path / "live")
    slime = "contains(attributes, 'slime.group_id')"
    (end0,) = con.execute(f"SELECT max(end_ns) FROM spans WHERE {slime} AND step = 0").fetchone()
    (start1,) = con.execute(f"SELECT min(start_ns) FROM spans WHERE {slime} AND step = 1").fetchone()
    assert start1 == end0  # step 1's slime work begins where step 0's ended: the carried group was cut there
    group2 = con.execute(f"""SELECT step, start_ns, end_ns FROM spans WHERE {slime} AND name = 'generate_and_rm_group'
                             AND attr(attributes, 'slime.group_id') = '2' ORDER BY start_ns""").fetchall()
    assert [g[0] for g in group2] == [0, 1] and group2[0][2] == group2[1][1] == end0  # once per step, end to end
    assert {s.group_index for s in rollouts[1].samples} >= {2}
    orphans = con.execute(
        f"""SELECT count(*) FROM spans c LEFT JOIN spans p ON c.parent_span_id = p.span_id
            WHERE {slime.replace('attributes', 'c.attributes')} AND c.parent_span_id IS NOT NULL
            AND (p.span_id IS NULL OR p.step <> c.step)""").fetchone()[0]
    assert orphans == 0
