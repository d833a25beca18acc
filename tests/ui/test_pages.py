"""Every page of the dashboard on real recorded runs (colocated sync, disaggregated async), through
Streamlit's AppTest: the page renders without an exception, shows its key elements, and shows
the same figures as `rltrace report`."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rltrace import replay, report, store
from rltrace.replay import diff, rerun
from rltrace.store import read_manifest
from rltrace.testing import RunBuilder
from rltrace.analysis import _format as fmt

from .conftest import REPLAY_LABEL, no_exceptions

PAGES = ["overview", "timeline", "waits", "reward", "metrics", "batches", "profiles", "compare", "engine", "whatif"]


def texts(at) -> str:
    """All text a page shows (markdown, captions, info boxes, headers), for content checks."""
    parts = [e.value for kind in ("title", "header", "subheader", "markdown", "caption", "info", "warning", "code")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def values(x) -> list:
    """A plotly array from a chart's JSON: plain list, or a typed array ({"dtype", "bdata"})."""
    if isinstance(x, dict) and "bdata" in x:
        return np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"])).tolist()
    return list(x)


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def charts(at) -> list:
    return at.get("plotly_chart")


def page(at, name: str):
    at.switch_page(f"views/{name}.py").run()
    no_exceptions(at)
    return at


@pytest.fixture(scope="module")
def reports(colocated_run, async_run) -> dict:
    """`rltrace report --json` of each run: what the pages must agree with."""
    return {run: report.build(store.open(run)) for run in (colocated_run, async_run)}


def name_of(run) -> str:
    return read_manifest(run)["name"]


@pytest.mark.slow  # ~40 s on 2 loaded cores: every page, each a full script run
def test_every_page_renders_without_an_exception(async_run, app):
    """On the async run; on the colocated run every page is opened after every other page
    (this order included) by test_first_page.py::test_every_page_after_every_other_page."""
    at = app(async_run)
    no_exceptions(at)
    for name in PAGES:
        page(at, name)
        assert at.title, f"{name} has no title"


def test_overview_leads_with_the_bottleneck_and_the_cost_model_of_the_report(colocated_run, async_run, app, reports):
    at = app(colocated_run, async_run)
    r = reports[colocated_run]
    assert at.title[0].value == fmt.md(name_of(colocated_run))
    assert at.info[0].value == fmt.md(r["findings"][0]) and r["findings"][0].startswith("Bottleneck: ")
    m = metrics(at)
    for key in ("t_R", "t_T", "t_W", "t_sync"):
        assert m[key] == fmt.seconds_text(r[key])  # the dashboard and `rltrace report` agree
    assert m["Async bound"] == fmt.seconds_text(r["async_bound"])
    assert m["Open spans"] == "0"
    assert "All runs" in texts(at)  # two runs given: the comparison table
    assert len(charts(at)) == 2  # step time by stage, reward


def test_overview_of_the_async_run_shows_the_hang_and_the_measured_overlap(async_run, app, reports):
    at = app(async_run)
    r = reports[async_run]
    m = metrics(at)
    assert int(m["Open spans"]) == len(r["open_spans"]) >= 1
    assert m["Overlap"] == f"{r['async']['achieved_speedup']:.2f}×"
    assert r["async"]["overlapping"] and r["async"]["achieved_speedup"] > 1.05
    assert "open span" in texts(at)
    assert any(f.startswith("Open span: generate on rollout0") for f in r["findings"])


def test_timeline_defaults_to_the_slowest_recent_step_and_draws_every_process(colocated_run, async_run, app, reports):
    at = page(app(colocated_run, async_run), "timeline")
    slowest = {run: max(reports[run]["steps"], key=lambda s: s["wall_s"])["step"] for run in (colocated_run, async_run)}
    assert at.selectbox(key="timeline_step").value == slowest[colocated_run]
    at.selectbox(key="run").set_value(str(async_run)).run()  # another run: its own slowest step
    no_exceptions(at)
    assert at.selectbox(key="timeline_step").value == slowest[async_run]
    assert metrics(at)["Processes"] == "2"  # the trainer and the Ray rollout worker
    names = {t["name"] for t in json.loads(charts(at)[0].proto.spec)["data"]}
    assert {"rollout", "train", "weight_sync", "wait", "critical path"} <= names
    assert "open (never ended)" in names  # the slowest step is the one where the worker hung
    assert at.get("download_button")  # the Chrome trace of the step


def test_picking_a_span_shows_its_attributes_and_its_profile(colocated_run, app):
    # a profile with a file, taken while its span ran: a recording that starts as the phase ends
    # (a loaded machine) cannot mark the span any more, by design (profiling/records.mark_span)
    step, span_id = store.open(colocated_run).execute(
        "SELECT p.step, p.span_id FROM profiles p JOIN spans s USING (span_id) WHERE p.path IS NOT NULL "
        "AND contains(s.attributes, 'rl.profile_id') ORDER BY p.step LIMIT 1").fetchall()[0]
    at = page(app(colocated_run), "timeline")
    at.selectbox(key="timeline_step").set_value(step).run()
    at.selectbox(key="timeline_span").set_value(span_id).run()  # that span, not another of its name
    no_exceptions(at)
    assert "rl.profile_id" in json.dumps([j.proto.body for j in at.json])
    assert any("pyspy_record" in d.value.to_string() for d in at.dataframe)


def test_an_open_span_is_drawn_on_its_step(async_run, app, reports):
    hung = next(o for o in reports[async_run]["open_spans"] if o["phase"] == "generate")
    at = app(async_run)
    at.session_state["timeline_step"] = hung["step"]  # what Overview's open-span table sends
    page(at, "timeline")
    assert at.selectbox(key="timeline_step").value == hung["step"]
    assert int(metrics(at)["Open spans"]) >= 1
    assert "started and never ended" in texts(at)
    bars = json.loads(charts(at)[0].proto.spec)["data"]
    still_open = next(t for t in bars if t["name"] == "open (never ended)")
    assert min(values(still_open["x"])) > 0  # drawn up to the run's last write, not as zero-length bars


def test_waiting_stages_show_waits_critical_path_tail_and_sync_fit(async_run, app, reports):
    at = page(app(async_run), "waits")
    shown = texts(at)
    for heading in ("Step time by stage", "Who waits for what", "Critical path", "Rollout long tail", "Weight sync"):
        assert heading in shown
    fit = reports[async_run]["weight_sync_fit"]
    assert metrics(at)["B_W"] == fmt.rate_text(fit["B_W"])
    assert metrics(at)["Syncs"].startswith(f"{fit['n']} ")
    assert len(charts(at)) == 4  # stages, waits, tail, sync fit


def test_reward_and_mismatch_overlay_both_runs(colocated_run, async_run, app):
    at = page(app(colocated_run, async_run), "reward")
    assert at.multiselect(key="reward_runs").value == [str(colocated_run), str(async_run)]
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    titles = [s["layout"].get("title", {}).get("text") for s in specs]
    assert {"train_rollout_logprob_abs_diff", "mismatch_k3", "tis_mean", "tis_clipfrac"} <= set(titles)
    reward = specs[titles.index("reward_mean (band: ± reward_std)")]
    assert {t["name"] for t in reward["data"] if t.get("name")} == {name_of(colocated_run), name_of(async_run)}
    assert at.selectbox(key="samples_y").value == "logprob_abs_diff"  # the demo's per-sample mismatch column


def test_batches_show_flags_texts_and_the_replay_diff(colocated_run, app, capsys):
    from rltrace.cli import main

    assert main(["replay", "show", str(colocated_run), "--step", "all", "--sort", "reward_outlier", "--json"]) == 0
    worst = json.loads(capsys.readouterr().out)["samples"][0]
    at = page(app(colocated_run), "batches")
    assert at.subheader[0].value.startswith(f"Step {worst['step']} · batch {worst['batch_id']}")  # the run's worst sample
    at.session_state["batches_step"] = 2  # the replayed batch, as the Reward page sends a step here
    at = page(at, "batches")
    assert at.subheader[0].value.startswith("Step 2 ")
    assert "truncated" in texts(at)  # the --straggler sample runs to its token budget
    assert "<|assistant|>" in at.code[0].value  # the prompt, with its chat template
    strip = json.loads(charts(at)[0].proto.spec)["data"][0]
    assert strip["type"] == "heatmap" and strip["y"] == [f"{REPLAY_LABEL} − rollout"]
    frozen = replay.load(colocated_run, 2)
    [expected] = diff.diff_against_record(frozen, rerun.latest_replay(colocated_run, 2)[0])  # `rltrace replay diff`
    shown = at.dataframe[-1].value.iloc[0]
    assert (shown["a"], shown["b"]) == (expected.a, expected.b) == ("rollout_log_probs", "log_probs")
    assert shown["mean_abs"] == expected.mean_abs and bool(shown["aligned"]) == expected.aligned
    assert "repeatable: bit-identical repeats" in texts(at)


def test_pages_say_plainly_when_a_run_has_no_batches_or_profiles(tmp_path, app):
    b = RunBuilder(tmp_path / "run")  # spans only: no freezing, no profiling
    b.process("trainer").span("train", 0, 1, step=0)
    at = page(app(b.write()), "batches")
    assert at.info[0].value.startswith("No frozen batches in this run — see docs/replay.md")
    page(at, "profiles")
    assert at.info[0].value.startswith("No profiles in this run — see docs/profiling.md")


def test_profiles_show_the_hottest_frame_and_offer_the_file(colocated_run, app):
    stored = store.open(colocated_run).execute("SELECT count(*) FROM profiles").fetchone()[0]
    at = page(app(colocated_run), "profiles")
    assert metrics(at)["Profiles"] == str(stored) and stored >= 1
    assert "slow_verifier" in at.dataframe[0].value.to_string()
    assert at.get("download_button")


def test_compare_two_runs_and_two_steps(colocated_run, async_run, app):
    at = page(app(colocated_run, async_run), "compare")
    assert at.get("segmented_control")[0].value == "The same steps of two runs"
    assert set(metrics(at)) == {"wall time", "t_R", "t_T", "t_W", "t_sync"}
    assert len(charts(at)) == 4  # phase times, difference, two timelines
    at.get("segmented_control")[0].set_value("Two steps of this run").run()
    no_exceptions(at)
    assert at.selectbox(key="compare_a").value != at.selectbox(key="compare_b").value
    assert "step" not in values(json.loads(charts(at)[0].proto.spec)["data"][0]["y"])  # the container is no phase


def test_the_step_range_applies_to_every_page(colocated_run, app):
    at = app(colocated_run)
    at.slider(key="step_range").set_value((1, 2)).run()
    no_exceptions(at)
    per_step = json.loads(charts(at)[0].proto.spec)["data"][0]
    assert values(per_step["x"]) == [1, 2]
    page(at, "timeline")
    assert [o.split(" · ")[0] for o in at.selectbox(key="timeline_step").options] == ["step 1", "step 2"]


def test_the_metrics_page_draws_any_logged_scalar_and_says_what_fills_it(app, tmp_path):
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    for step in range(5):
        trainer.span("train", step, step + 0.5, step=step)
        b.metric(step, "loss", 1.0 / (1 + step))
        b.metric(step, "my_kl", 0.01 * step)
    b.write()
    at = page(app(b.run_dir), "metrics")
    drawn = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in charts(at)]
    assert drawn == ["loss", "my_kl"]
    empty = RunBuilder(tmp_path / "empty")
    empty.process("trainer").span("train", 0, 1, step=0)
    empty.write()
    at = page(app(empty.run_dir), "metrics")
    assert "log_metrics" in texts(at) and charts(at) == []


def test_batches_rank_samples_as_replay_show_sort_reward_outlier_and_open_on_the_worst(app, tmp_path):
    import rltrace
    from rltrace.replay.browse import by_reward_outlier, sample_views

    run_dir = tmp_path / "run"
    rltrace.init(run_dir)
    with rltrace.phase("train", step=1):
        pass
    rewards = [0.1, 0.2, 9.0, 0.0, -30.0, 0.15, 3.0, 0.1]
    rltrace.replay.freeze(1, [{"reward": r, "response_text": f"answer {k}"} for k, r in enumerate(rewards)])
    rltrace.replay.flush()
    rltrace.shutdown()
    cli_order = [v["reward"] for v in by_reward_outlier(sample_views(replay.load(run_dir, 1)))]  # `--sort reward_outlier`
    assert cli_order[:3] == [-30.0, 9.0, 3.0]
    at = page(app(run_dir), "batches")
    assert at.dataframe[1].value["reward"].tolist() == cli_order
    assert "#### Sample 4" in texts(at)  # the worst sample is open


def test_the_batches_page_opens_on_the_run_s_worst_sample_across_every_batch(app, tmp_path, capsys):
    """Not the latest batch's worst: the batch holding the run's worst sample, ranked as
    `replay show --step all --sort reward_outlier` ranks it (read from the reward column alone)."""
    import rltrace
    from rltrace.cli import main

    run_dir = tmp_path / "run"
    rltrace.init(run_dir)
    base = [0.1, 0.2, 0.0, 0.15, 0.1, 0.3, 0.2, 0.1]
    for step, (k, bad) in enumerate([(2, 5.0), (6, -40.0), (1, 9.0), (3, 0.18)]):  # the latest: no outlier at all
        with rltrace.phase("train", step=step):
            pass
        rltrace.replay.freeze(step, [{"reward": bad if i == k else r, "response_text": f"s{step} {i}"} for i, r in enumerate(base)])
        rltrace.replay.flush()
    rltrace.shutdown()
    assert main(["replay", "show", str(run_dir), "--step", "all", "--sort", "reward_outlier", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["samples"][0]
    assert (first["step"], first["sample_index"], first["reward"]) == (1, 6, -40.0)
    at = page(app(run_dir), "batches")
    assert f"Step 1 · batch {first['batch_id']}" in at.subheader[0].value and "#### Sample 6" in texts(at)
    assert at.dataframe[1].value["reward"].tolist()[0] == -40.0


def test_pages_without_data_for_the_run_say_in_one_line_what_fills_them(tmp_path, app):
    b = RunBuilder(tmp_path / "run")  # phases only: no metrics, samples, batches, profiles, engines
    b.process("trainer").span("train", 0, 1, step=0)
    at = app(b.write())
    for name, words in (("reward", "rltrace.log_samples(step, rows)"), ("compare", "a second step"),
                        ("batches", "rltrace.replay.freeze"), ("profiles", "RLTRACE_PROFILE_SLOW"),
                        ("metrics", "rltrace.log_metrics"), ("engine", "No engine requests")):
        page(at, name)
        assert len(at.info) == 1 and words in at.info[0].value, name
        assert charts(at) == [] and len(at.dataframe) == 0 and not at.warning, name


def test_the_profiles_page_draws_the_phase_profile_from_its_stored_stacks(tmp_path, app):
    from types import SimpleNamespace

    from rltrace.profiling import pyspy, records

    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("reward", 0, 1, step=0)
    run_dir = b.write()
    inside = {(("loop", "/u/loop.py", 1), ("reward", "/u/r.py", 2), ("judge", "/u/r.py", 3)): 80.0,
              (("loop", "/u/loop.py", 1), ("reward", "/u/r.py", 2)): 20.0}  # samples inside the phase, per stack
    capture = records.Capture(kind="pyspy_record", trigger="slow", reason="slow reward", span=None, trace_id="ab" * 16,
                              span_id="cd" * 8, span_name="reward", phase="reward", step=0, native_thread_id=7,
                              status="ok", samples=100, stacks=pyspy.folded_stacks(inside),
                              frames=[pyspy.Frame("judge", "/u/r.py", 3, 0.8, 1.0, 80, "MainThread (7)")])
    process = SimpleNamespace(process_id="trainer0", role="trainer", rank=0, host="node0", pid=1)
    records.write(run_dir, process, capture)
    at = page(app(run_dir), "profiles")
    icicle = json.loads(charts(at)[0].proto.spec)["data"][0]
    assert icicle["type"] == "icicle"
    shown = dict(zip(values(icicle["labels"]), values(icicle["values"])))
    assert shown == {"all (100 samples)": 100, "loop (loop.py)": 100, "reward (r.py)": 100, "judge (r.py)": 80}


def test_a_hung_run_shows_its_blocking_edge_with_the_stack_one_click_away(tmp_path, app, capsys):
    """A real process hung in a queue no one fills (tests/stacks/hung.py), its stacks asked for as a
    user would (`rltrace stacks`): the Overview, and the Timeline once the open span is picked,
    say who waits on what, and the expander under it holds that thread's stack."""
    from rltrace.cli import main
    from rltrace.stacks import edges
    from rltrace.ui import state
    from tests.stacks.test_hangs import _start, _until

    run_dir = tmp_path / "run"
    proc = _start(run_dir, "queue")
    try:
        _until(proc, "HUNG")
        assert main(["stacks", str(run_dir), "--wait", "15"]) == 0
        capsys.readouterr()
        con = store.open(run_dir)
        try:
            (edge,) = edges(con)
        finally:
            con.close()
        assert "waiting" in edge.text and "in queue.Queue.get in consume (rollout, step 0)" in edge.text
        at = app(run_dir)
        for where in ("overview", "timeline"):
            if where == "timeline":
                at.session_state[state.TIMELINE_STEP] = 0
                at.session_state[state.TIMELINE_SPAN] = edge.span_id  # the open span, picked
                at = page(at, "timeline")
            no_exceptions(at)
            shown = [w.value.replace("\\", "") for w in at.warning]  # markdown-escaped on the page
            before, after = edge.text.split(" has been waiting ")[0], edge.text.split(" s in ")[1]
            assert [t for t in shown if t.startswith(before + " has been waiting ") and t.endswith(after)], (where, shown)
            (box,) = [x for x in at.expander if x.label == "Stack of trainer0, innermost call last"]
            stack = box.get("code")[0].value.splitlines()
            assert any("queue.py" in line and "get" in line for line in stack), (where, stack)
            assert any("hung.py" in line and "consume" in line for line in stack), (where, stack)
    finally:
        proc.kill()
        proc.wait(timeout=10)
