"""The Chrome trace passes a strict check of the Trace Event Format and matches the stored spans."""

import json
from collections import Counter, defaultdict

import pytest

from rltrace import store
from rltrace.cli import main
from rltrace.export import chrome
from rltrace.testing import RunBuilder

REQUIRED = {
    "X": ("name", "ph", "pid", "tid", "ts", "dur"),
    "B": ("name", "ph", "pid", "tid", "ts"),
    "E": ("ph", "pid", "tid", "ts"),
    "M": ("name", "ph", "pid", "args"),
    "C": ("name", "ph", "pid", "ts", "args"),
    "s": ("name", "ph", "pid", "tid", "ts", "id", "cat"),
    "f": ("name", "ph", "pid", "tid", "ts", "id", "cat"),
    "i": ("name", "ph", "pid", "tid", "ts"),
}


def check_trace_event_format(trace: dict) -> None:
    """Fail on anything Perfetto or chrome://tracing would reject or draw wrongly."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    named_pids, named_threads = set(), set()
    by_thread = defaultdict(list)
    flows = defaultdict(list)
    for e in trace["traceEvents"]:
        ph = e.get("ph")
        assert ph in REQUIRED, f"unknown phase type {ph!r}: {e}"
        missing = [k for k in REQUIRED[ph] if k not in e]
        assert not missing, f"{ph} event lacks {missing}: {e}"
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if "ts" in e:
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if ph == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        if ph == "M":
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            if e["name"] in ("process_name", "thread_name"):
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
        if ph == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        if ph in ("X", "B", "E"):
            by_thread[(e["pid"], e["tid"])].append(e)
        if ph in ("s", "f"):
            flows[e["id"]].append(e)
    for (pid, tid), events in by_thread.items():
        assert pid in named_pids and (pid, tid) in named_threads, f"track {pid}/{tid} has no name"
        stack = []
        for e in (x for x in events if x["ph"] in "BE"):
            if e["ph"] == "B":
                stack.append(e)
            else:
                assert stack, f"E without B on {pid}/{tid}"
                stack.pop()
        assert not stack, f"unbalanced B/E on {pid}/{tid}"
        open_ends = []
        for e in sorted((x for x in events if x["ph"] == "X"), key=lambda x: (x["ts"], -x["dur"])):
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            assert not open_ends or end <= open_ends[-1], f"overlapping complete events on {pid}/{tid}: {e['name']}"
            open_ends.append(end)
    for fid, pair in flows.items():
        assert sorted(x["ph"] for x in pair) == ["f", "s"], f"flow {fid} is not one s and one f"
        for x in pair:  # each end binds to a slice on its thread
            assert any(
                s["ph"] == "X" and s["ts"] <= x["ts"] <= s["ts"] + s["dur"] for s in by_thread[(x["pid"], x["tid"])]
            ), f"flow {fid} {x['ph']} has no enclosing slice"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    b = RunBuilder(tmp_path_factory.mktemp("runs") / "run")
    tr, ro = b.process("trainer"), b.process("rollout", 2, host="node7")
    st = tr.span("step", 0, 10, step=1)
    t = tr.span("train", 5, 8, step=1, parent=st)
    tr.span("forward", 5, 6, step=1, parent=t)
    r = ro.span("rollout", 0, 4, step=1, parent=st)  # cross-process child: a flow arrow
    ro.span("generate", 0, 3, step=1, parent=r, thread=1, sample=1)  # nests in rollout on the same thread
    ro.span("generate", 1, 3.5, step=1, parent=r, thread=1, sample=2)  # overlaps the first: another lane
    ro.span("generate", 2, 3.8, step=1, parent=r, thread=1, sample=3)  # overlaps both: a third lane
    tr.span("weight_sync", 8, 9.000_000_4, step=1, bytes=10)  # sub-microsecond end
    tr.span("train", 11, None, step=2)  # open: drawn to the end of the trace
    b.metric(1, "reward_mean", 0.5, time=9.5)
    b.metric(2, "reward_mean", 0.7, time=12.0)
    b.write()
    con = store.open(b.run_dir)
    return b, con, chrome.chrome_trace(con)


def test_trace_passes_the_strict_check(run):
    check_trace_event_format(run[2])


def test_spans_keep_their_clock_and_open_spans_reach_the_end(run):
    b, con, trace = run
    stored = {r[0]: r[1:] for r in con.execute("SELECT span_id, start_ns, end_ns FROM spans").fetchall()}
    end_us = (b.t0_ns + 12 * 10**9) // 1000  # the last thing recorded: the step-2 metric
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(stored)
    for e in xs:
        start_ns, end_ns = stored[e["args"]["span_id"]]
        assert e["ts"] == start_ns // 1000
        if end_ns is None:
            assert e["args"]["open"] is True and e["name"] == "train (open)"
            assert e["ts"] + e["dur"] == end_us
        else:
            assert e["ts"] + e["dur"] == end_ns // 1000


def test_tracks_are_named_and_concurrent_spans_get_lanes(run):
    _, _, trace = run
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {"trainer0 @ node0 (pid 1000)", "rollout2 @ node7 (pid 1001)"}
    threads = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {"MainThread", "MainThread +1", "MainThread +2"} <= threads
    gens = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "generate"]
    assert len({e["tid"] for e in gens}) == 3


def test_flows_link_cross_process_parents_and_metrics_are_counters(run):
    _, _, trace = run
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf"]
    assert Counter(e["ph"] for e in flows) == {"s": 1, "f": 1}
    assert flows[0]["name"] == "step → rollout"
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [c["args"]["value"] for c in counters] == [0.5, 0.7]


def test_cli_writes_the_file_and_selects_steps(run, tmp_path):
    b, _, _ = run
    out = tmp_path / "t.json"
    assert main(["export", str(b.run_dir), "--format", "chrome", "--out", str(out), "--steps", "2:2"]) == 0
    trace = json.loads(out.read_text())
    check_trace_event_format(trace)
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"] == ["train (open)"]


def test_cli_errors_are_one_line(run, tmp_path, capsys):
    b, _, _ = run
    assert main(["export", str(b.run_dir), "--format", "chrome", "--out", str(tmp_path / "no" / "t.json")]) == 2
    assert "folder" in capsys.readouterr().err
    assert main(["export", str(b.run_dir), "--format", "otlp"]) == 2
    assert "--endpoint" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), "--format", "chrome"]) == 2
    assert "does not exist" in capsys.readouterr().err


def _named(*events):
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}}]
    return {"traceEvents": meta + list(events)}


@pytest.mark.parametrize(
    "events, message",
    [
        ([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
          {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10}], "overlapping"),
        ([{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 0}], "unbalanced"),
        ([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
          {"ph": "s", "name": "f", "cat": "flow", "id": 3, "pid": 1, "tid": 1, "ts": 1}], "not one s and one f"),
        ([{"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": 0, "dur": 1}], "has no name"),
        ([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}], "lacks"),
    ],
)
def test_the_check_rejects_broken_traces(events, message):
    with pytest.raises(AssertionError, match=message):
        check_trace_event_format(_named(*events))


def test_nan_and_infinite_values_become_null_with_their_spelling_kept(tmp_path):
    """Perfetto, browsers and jq refuse bare NaN/Infinity: the file is strict JSON, and a NaN stays visible."""
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    trainer.span("train", 0, 1, step=1, loss=float("nan"), grad_norm=float("inf"), lr=0.1)
    b.metric(1, "loss", float("nan"), time=0.5)
    b.metric(1, "reward_mean", float("-inf"), time=0.6)
    b.metric(1, "kl", 0.25, time=0.7)
    b.write()
    out = tmp_path / "trace.json"
    chrome.write(store.open(b.run_dir), out)
    trace = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    check_trace_event_format(trace)
    (span,) = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert span["args"]["rl.loss"] is None and span["args"]["rl.loss.text"] == "NaN"
    assert span["args"]["rl.grad_norm"] is None and span["args"]["rl.grad_norm.text"] == "Infinity"
    assert span["args"]["rl.lr"] == 0.1
    counters = {e["name"]: e["args"] for e in trace["traceEvents"] if e["ph"] == "C"}
    marks = {e["name"]: e["args"] for e in trace["traceEvents"] if e["ph"] == "i"}
    assert counters == {"kl": {"value": 0.25}}  # a counter track takes numbers only ...
    assert marks == {"loss": {"value": None, "value.text": "NaN"},  # ... a non-finite value is an instant mark
                     "reward_mean": {"value": None, "value.text": "-Infinity"}}
