"""The report's sentences say something only when it matters, and read well in a terminal."""

import io
import json

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from rltrace import report, store
from rltrace.testing import T0_NS, RunBuilder

from ..cli.test_report import _run


def _mismatch_run(path):
    b = RunBuilder(path)
    tr = b.process("trainer")
    for step in range(6):
        tr.span("train", step, step + 0.5, step=step)
        b.metric(step, "tis_mean", 1.0 + (1e-17 if step % 2 else -1e-17))  # flat: float noise around 1
        b.metric(step, "tis_clipfrac", 0.0)
        b.metric(step, "train_rollout_logprob_abs_diff", 3e-3 + 1e-5 * (step % 2))  # flat, above the gate
        b.metric(step, "mismatch_k3", 1e-3 * (step + 1))  # rises six-fold
    b.write()
    return store.open(b.run_dir)


def test_only_material_mismatch_gets_a_sentence(tmp_path):
    data = report.build(_mismatch_run(tmp_path / "run"), now_ns=0)
    said = [s for s in data["findings"] if s.split()[0] in ("tis_mean", "tis_clipfrac", "mismatch_k3",
                                                            "train_rollout_logprob_abs_diff")]
    assert said == [
        "mismatch_k3 went from 0.001 to 0.006 (max 0.006 at step 5) over 6 steps (robust trend +0.001 per step).",
        ("train_rollout_logprob_abs_diff held at a mean of 0.00301 (max 0.00301) over 6 steps, above the 1e-06 "
         "gate for exact alignment of rollout and training."),
    ]
    trends = {t["metric"]: t for t in data["mismatch"]["trends"]}
    assert trends["tis_mean"]["mean"] == pytest.approx(1.0) and trends["tis_mean"]["min"] == pytest.approx(1.0)
    assert trends["mismatch_k3"]["max_step"] == 5


def test_json_keeps_seconds_as_numbers_while_text_uses_units(tmp_path):
    data = report.build(store.open(_run(tmp_path / "run", reward_s=6.0)), now_ns=0)
    assert json.loads(json.dumps(report.plain(data)))["t_R"] == pytest.approx(9.0)
    trainer = next(w for w in data["waits"] if w["role"] == "trainer")
    assert trainer["seconds"] == pytest.approx(6.0) and isinstance(trainer["seconds"], float)
    assert trainer["text"] == "trainer0 idle 6.00 s (52% of step 1) waiting for reward on reward0"
    text = " ".join(data["findings"])
    assert "t_R = 9.00 s (rollout 3.00 s + reward 6.00 s), t_T = 2.00 s, t_W = 500 ms" in text
    assert "does not grow with payload" in text and "latency-bound, median t_0 ≈ 500 ms" in text
    assert "need several sizes" not in text  # four sizes were there: the data say latency-bound


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_report_fits_the_width_without_cutting_values(tmp_path, width):
    data = report.build(store.open(_run(tmp_path / "run", reward_s=6.0, hang=True)))
    data["run"] = {"name": "run", "run_dir": str(tmp_path / "run")}
    out = io.StringIO()
    report.render(data, Console(file=out, width=width, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text  # no cell truncated
    assert "Open span: rollout on rollout0 at step 5" in " ".join(text.split())
    assert "│ t_W         │ 500 ms │ measured │ weight sync" in text


def test_an_occasional_slow_stage_is_named_with_its_profile(tmp_path):
    """One slow reward in six steps: the medians hide it, the outlier sentence names it and its profile."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(6):
        o = 2.0 * step
        tr.span("rollout", o, o + 0.5, step=step)
        tr.span("reward", o + 0.5, o + (1.7 if step == 3 else 0.51), step=step)
        tr.span("train", o + 1.8, o + 2.0, step=step)
    hung = tr.span("generate", 12.0, None, step=6)
    b.write()
    con = store.open(b.run_dir)
    slow = con.execute("SELECT span_id FROM spans WHERE phase = 'reward' AND step = 3").fetchone()[0]
    assert slow.isalnum() and hung.span_id.isalnum()  # safe to inline: views cannot take parameters
    con.execute(
        "CREATE OR REPLACE VIEW profiles AS SELECT * FROM (VALUES "
        f"('t', '{slow}', 'p1', 'pyspy_record', 'profiles/files/p1.json'), "
        f"('t', '{hung.span_id}', 'p2', 'pyspy_dump', 'profiles/files/p2.txt')) "
        "AS v(trace_id, span_id, profile_id, kind, path)")
    data = report.build(con)
    assert data["bottleneck"]["stage"] == "rollout"  # the median step is not slowed by reward
    [outlier] = data["outliers"]
    assert (outlier["stage"], outlier["step"], outlier["steps_over"]) == ("reward", 3, 1)
    assert outlier["seconds"] == pytest.approx(1.2) and outlier["median_s"] == pytest.approx(0.01)
    assert [p["profile_id"] for p in outlier["profiles"]] == ["p1"]
    assert [p["profile_id"] for p in data["open_spans"][0]["profiles"]] == ["p2"]
    said = " ".join(data["findings"])
    assert ("Outlier: reward took 1.20 s at step 3 against a median of 10.0 ms per step (1 of 6 steps took over "
            "3x the median). Profile: pyspy_record p1 at profiles/files/p1.json.") in said
    assert "killed (e.g. SIGKILL or out of memory). Profile: pyspy_dump p2 at profiles/files/p2.txt." in said


def test_plain_frames_equal_plain_of_each_record():
    """`plain` converts a frame a column at a time; each row must equal `plain` of its record."""
    from rltrace.report.build import plain

    frame = pd.DataFrame({
        "i": np.array([1, 2, 3], np.int64), "u": np.array([1, 2, 3], np.uint8), "b": [True, False, True],
        "f": [1.5, float("nan"), float("inf")], "s": ["a", None, "c"], "o": [{"x": np.float64(1.0)}, [np.int64(2)], None],
        "n": pd.array([1, None, 3], dtype="Int64"), "t": pd.to_datetime([0, None, 2]),
        "m": [np.nan, np.int64(4), "z"], 7: [0.0, -0.0, 2.0],
    })
    got = plain(frame)
    want = [plain(r) for r in frame.to_dict("records")]
    assert got == want
    assert [type(v) for v in got[1].values()] == [type(v) for v in want[1].values()]
    assert got[1]["f"] is None and got[1]["s"] is None and got[1]["n"] is None and got[1]["t"] is None
    assert plain(frame.iloc[:, :0]) == [{}, {}, {}] and plain(frame.iloc[:0]) == []


def test_a_live_runs_young_open_spans_are_work_in_progress_not_hangs(tmp_path):
    """A live process's span open for less than the hang limit of `rltrace watch` (10x its phase's
    median, at least 300 s) is work in progress: listed, not a finding. One open past the limit,
    or whose process's watchdog dumped its stacks, is named."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(6):
        tr.span("generate", 2.0 * step - 420, 2.0 * step - 419, step=step)  # median 1 s
    young = tr.span("generate", 2.0, None, step=7)
    old = tr.span("generate", -400.0, None, step=6)
    b.write()
    con = store.open(b.run_dir)
    data = report.build(con, now_ns=T0_NS + 10 * 10**9)  # its heartbeat (at t0) is 10 s old: alive
    state = {o["span_id"]: (o["state"], o["in_progress"]) for o in data["open_spans"]}
    assert state == {young.span_id: ("running", True), old.span_id: ("running", False)}
    from rltrace.analysis import health  # a cached report read later: in progress while the heartbeat is fresh

    kept = next(o for o in data["open_spans"] if o["span_id"] == young.span_id)
    assert health.in_progress_now(kept, T0_NS + 29 * 10**9) and not health.in_progress_now(kept, T0_NS + 31 * 10**9)
    said = [f for f in data["findings"] if f.startswith("Open span")]
    assert len(said) == 1 and "at step 6" in said[0]  # the young one gets no sentence
    con.execute(  # the process's watchdog dumped its stacks 5 s into the young span: it is hung
        "CREATE OR REPLACE VIEW profiles AS SELECT * FROM (VALUES "
        f"('t', '{young.span_id}', 'p1', 'pyspy_dump', 'profiles/files/p1.txt', 'hang', 5.0)) "
        "AS v(trace_id, span_id, profile_id, kind, path, trigger, elapsed_s)")
    data = report.build(con, now_ns=T0_NS + 10 * 10**9)
    assert not any(o["in_progress"] for o in data["open_spans"])
    assert sum(f.startswith("Open span") for f in data["findings"]) == 2
    out = io.StringIO()
    report.render(report.build(store.open(b.run_dir), now_ns=T0_NS + 10 * 10**9), Console(file=out, width=120))
    assert "alive: in progress" in out.getvalue()


def test_only_the_innermost_open_work_past_its_limit_is_a_hang_as_rltrace_watch_says(tmp_path):
    """A live run whose step has been open 400 s: the step, the rollout around requests that keep
    finishing, and the trainer's wait for it are work in progress; only a request open past its
    limit is named, and it is the one `rltrace watch` alerts on."""
    from rltrace.alerts import Settings, evaluate

    b = RunBuilder(tmp_path / "run")
    ro, tr = b.process("rollout"), b.process("trainer")
    step = ro.span("step", -400.0, None, step=9)
    rollout = ro.span("rollout", -399.0, None, step=9, parent=step)
    for i in range(6):
        ro.span("generate", -390.0 + 2 * i, -389.0 + 2 * i, step=9, parent=rollout)  # finished: median 1 s
    ro.span("generate", 5.0, None, step=9, parent=rollout, thread=2)  # young: in progress
    stuck = ro.span("generate", -380.0, None, step=9, parent=rollout, thread=3)  # 390 s > 300 s: hung
    tr.span("wait", -400.0, None, step=9, waiting_for="rollout")
    b.write()
    now = T0_NS + 10 * 10**9
    data = report.build(store.open(b.run_dir), now_ns=now)
    flagged = [o["span_id"] for o in data["open_spans"] if not o["in_progress"]]
    assert flagged == [stuck.span_id]
    said = [f for f in data["findings"] if f.startswith("Open span")]
    assert len(said) == 1 and said[0].startswith("Open span: generate on rollout0 (thread worker-3) at step 9")
    hangs = [a for a in evaluate(store.open(b.run_dir), Settings(rules=("hang",)), now_ns=now)]
    assert [a.key for a in hangs] == [f"hang:{stuck.span_id}"]  # the same one, and only it
