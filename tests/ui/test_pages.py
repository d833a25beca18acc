"""Every page of the dashboard on real recorded runs (colocated sync, disaggregated async), through
Streamlit's AppTest: the page renders without an exception, shows its key elements, and shows
the same figures as `rltrace report`."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rltrace import report, store
from rltrace.ui import style

from .conftest import no_exceptions

PAGES = ["overview", "timeline", "waits", "reward", "batches", "profiles", "compare"]


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
    return {run: report.build(store.open(run)) for run in (colocated_run, async_run)}


@pytest.mark.parametrize("which", ["colocated_run", "async_run"])
def test_every_page_renders_without_an_exception(which, request, app):
    at = app(request.getfixturevalue(which))
    no_exceptions(at)
    for name in PAGES:
        page(at, name)
        assert at.title, f"{name} has no title"


def test_overview_leads_with_the_bottleneck_and_the_seed_figures_of_the_report(colocated_run, async_run, app, reports):
    at = app(colocated_run, async_run)
    r = reports[colocated_run]
    assert at.title[0].value == "colocated-sync"
    assert at.info[0].value == r["findings"][0] and r["findings"][0].startswith("Bottleneck: rollout")
    m = metrics(at)
    for key in ("t_R", "t_T", "t_W", "t_sync"):
        assert m[key] == style.seconds(r[key])  # the dashboard and `rltrace report` agree
    assert m["Async bound"] == style.seconds(r["async_bound"])
    assert m["Open spans"] == "0"
    assert "All runs" in texts(at)  # two runs given: the comparison table
    assert len(charts(at)) == 2  # step time by stage, reward


def test_overview_of_the_async_run_shows_the_hang_and_the_measured_period(async_run, app, reports):
    at = app(async_run)
    m = metrics(at)
    assert m["Open spans"] == "1"
    assert m["Measured step period"] == style.seconds(reports[async_run]["async"]["period_s"])
    assert any("Open span: generate on rollout0" in f for f in reports[async_run]["findings"])
    assert "open span" in texts(at)


def test_timeline_defaults_to_the_slowest_recent_step_and_draws_every_process(async_run, app, reports):
    at = page(app(async_run), "timeline")
    slowest = max(reports[async_run]["steps"], key=lambda s: s["wall_s"])["step"]
    assert at.selectbox(key="timeline_step").value == slowest
    assert metrics(at)["Processes"] == "2"
    gantt = json.loads(charts(at)[0].proto.spec)
    names = {t["name"] for t in gantt["data"]}
    assert {"rollout", "generate", "train", "weight_sync", "wait"} <= names
    assert at.get("download_button")  # the Chrome trace of the step


def test_picking_a_span_shows_its_attributes_and_its_profile(colocated_run, app):
    at = page(app(colocated_run), "timeline")
    at.selectbox(key="timeline_step").set_value(3).run()
    spans = at.selectbox(key="timeline_span")
    reward = next(o for o in spans.options if o.startswith("reward"))
    spans.select(reward).run()
    no_exceptions(at)
    assert "rl.profile_id" in json.dumps([j.proto.body for j in at.json])
    assert any("pyspy_record" in d.value.to_string() for d in at.dataframe)


def test_an_open_span_is_drawn_on_its_step(async_run, app):
    at = app(async_run)
    at.session_state["timeline_step"] = 6  # what Overview's open-span table sends
    page(at, "timeline")
    assert at.selectbox(key="timeline_step").value == 6
    assert metrics(at)["Open spans"] == "1"
    assert "started and never ended" in texts(at)
    bars = json.loads(charts(at)[0].proto.spec)["data"]
    generate = next(t for t in bars if t["name"] == "generate")
    assert values(generate["x"])[0] > 0  # drawn up to the run's last write, not as a zero-length bar


def test_waiting_stages_show_waits_critical_path_tail_and_sync_fit(async_run, app, reports):
    at = page(app(async_run), "waits")
    shown = texts(at)
    for heading in ("Step time by stage", "Who waits for what", "Critical path", "Rollout long tail", "Weight sync"):
        assert heading in shown
    fit = reports[async_run]["weight_sync_fit"]
    assert metrics(at)["B_W"] == f"{fit['B_W'] / 1e9:.3g} GB/s"
    assert len(charts(at)) == 4  # stages, waits, tail, sync fit


def test_reward_and_mismatch_overlay_both_runs(colocated_run, async_run, app):
    at = page(app(colocated_run, async_run), "reward")
    assert at.multiselect(key="reward_runs").value == [str(colocated_run), str(async_run)]
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    titles = [s["layout"].get("title", {}).get("text") for s in specs]
    assert "train_rollout_logprob_abs_diff" in titles and "mismatch_k3" in titles
    reward = specs[titles.index("reward_mean (band: ± reward_std)")]
    assert {t["name"] for t in reward["data"] if t.get("name")} == {"colocated-sync", "disaggregated-async"}
    assert at.selectbox(key="samples_y").value == "train_rollout_logprob_abs_diff"  # per-sample mismatch column


def test_batches_show_flags_and_the_replay_diff(colocated_run, app):
    at = page(app(colocated_run), "batches")
    shown = texts(at)
    assert "repetition: 1" in shown and "template_leak: 1" in shown
    assert any("repetition" in w.value for w in at.warning)  # the first flagged sample is open
    assert len(charts(at)) == 1  # the per-token strip


def test_pages_say_plainly_when_a_run_has_no_batches_or_profiles(async_run, app):
    at = page(app(async_run), "batches")
    assert at.info[0].value.startswith("No frozen batches in this run — see docs/replay.md")
    page(at, "profiles")
    assert at.info[0].value.startswith("No profiles in this run — see docs/profiling.md")


def test_profiles_show_the_hottest_frame_and_offer_the_file(colocated_run, app):
    at = page(app(colocated_run), "profiles")
    assert metrics(at)["Profiles"] == "1"
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
    at.slider(key="step_range").set_value((2, 3)).run()
    no_exceptions(at)
    per_step = json.loads(charts(at)[0].proto.spec)["data"][0]
    assert values(per_step["x"]) == [2, 3]
    page(at, "timeline")
    assert [o.split(" · ")[0] for o in at.selectbox(key="timeline_step").options] == ["step 2", "step 3"]
