"""A lane per sample on the timeline of an imported slime rollout (dumps made by slime's own code):
the lanes, their order, the request labels, the Chrome export, the page, and a real browser."""

from __future__ import annotations

import json

import pytest

import rltrace
from rltrace import analysis
from rltrace.export import chrome
from rltrace.replay.slime import import_slime
from rltrace.ui import gantt
from tests.replay import slime_run
from tests.replay.slime_dumps import rollout_dump

from .conftest import no_exceptions

#: Tests that compare with slime's own rollout objects need slime's code (see slime_run.MISSING);
#: the page and the browser read a dump in slime's format written by the tests, and run everywhere.
needs_slime = pytest.mark.skipif(not slime_run.available(), reason=slime_run.MISSING)


@pytest.fixture(scope="module")
def written_dir(tmp_path_factory):
    """An imported rollout dump in slime's format (8 samples in 4 groups) written by the tests."""
    root = tmp_path_factory.mktemp("slime_written")
    rollout_dump(root / "dump" / "rollout_0.pt", 0, n=8)
    import_slime([root / "dump"], root / "run")
    return root / "run"


@pytest.fixture(scope="module")
def slime_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("slime_ui")
    rollouts = slime_run.run(root / "dump", rollouts=2, partial=True)
    import_slime([root / "dump"], root / "run")
    return root / "run", rollouts


def _lanes(run_dir, order):
    con = rltrace.store.open(run_dir)
    spans = analysis.step_timeline(con, 0).assign(step=0)
    laid, _ = gantt.layout(gantt.sample_lanes(spans, analysis.sample_timeline(con, 0, 0), order))
    return laid.drop_duplicates("label").sort_values("y")["label"].tolist(), laid


@needs_slime
def test_one_lane_per_sample_under_its_group(slime_dir):
    run_dir, rollouts = slime_dir
    labels, laid = _lanes(run_dir, "group")
    ran = [s for s in rollouts[0].samples] + [s for s in rollouts[1].samples if s.metadata.get("start_rollout_id") == 0]
    want = []
    for g in sorted({s.group_index for s in ran}):
        want += [f"group {g}"] + [f"group {g} · sample {s.index}" for s in sorted(ran, key=lambda s: s.index) if s.group_index == g]
    assert labels == want
    requests = laid[laid["name"] == "sglang_generate"]
    sample = rollouts[0].samples[0]
    meta = next(e["attrs"] for e in sample.trace["events"] if e["type"] == "span_end" and e["name"] == "sglang_generate")
    label = f"P:{meta['prompt_tokens']} D:{meta['completion_tokens']} cache:{meta['cached_tokens']}"
    assert label in set(requests.loc[requests["lane"] == f"group 0 · sample {sample.index}", "request"])


@needs_slime
def test_lanes_sort_by_duration_and_reward(slime_dir):
    run_dir, rollouts = slime_dir
    con = rltrace.store.open(run_dir)
    times = con.execute("SELECT CAST(sample_id AS BIGINT), gen_end - gen_start, reward FROM samples WHERE step = 0 AND in_batch").fetchall()
    labels, _ = _lanes(run_dir, "duration")
    group0 = [lab for lab in labels if lab.startswith("group 0 · ")]
    by_time = [f"group 0 · sample {i}" for i, _, _ in sorted((t for t in times if t[0] < 4), key=lambda t: -t[1])]
    assert group0 == by_time
    labels, _ = _lanes(run_dir, "reward")
    group0 = [int(lab.rsplit(" ", 1)[1]) for lab in labels if lab.startswith("group 0 · ")]
    rewards = {i: r for i, _, r in times}
    assert [rewards[i] for i in group0] == sorted((rewards[i] for i in group0), reverse=True)
    with pytest.raises(ValueError, match="order='size'"):
        gantt.sample_lanes(analysis.step_timeline(con, 0), analysis.sample_timeline(con, 0, 0), "size")


def test_chrome_export_names_a_track_per_sample(written_dir):
    trace = chrome.chrome_trace(rltrace.store.open(written_dir), steps=(0, 0))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {f"group {i // 2} · sample {i}" for i in range(8)} <= names
    assert not any(n.startswith("thread ") for n in names)


def test_the_timeline_page_draws_sample_lanes(written_dir, app):
    run_dir = written_dir
    at = app(run_dir)
    at.switch_page("views/timeline.py").run()
    no_exceptions(at)
    assert at.radio(key="timeline_rows").value == "one per sample"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    ticks = spec["layout"]["yaxis"]["ticktext"]
    assert ticks[:3] == ["group 0 · sample 0", "group 0 · sample 1", "group 1 · sample 2"]  # grouped, in order
    assert len(ticks) == 8 and all(t.startswith("group ") and " · sample " in t for t in ticks)
    at.radio(key="timeline_sample_order").set_value("duration").run()
    no_exceptions(at)
    at.radio(key="timeline_rows").set_value("one per process").run()
    no_exceptions(at)
    ticks = json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["yaxis"]["ticktext"]
    assert len(ticks) == 1 and "slime-import" in ticks[0]


@pytest.mark.slow
def test_sample_lanes_in_a_real_browser(written_dir):
    from tests.ui.test_browser import ARTIFACTS, PAGE_TIMEOUT_MS, _browser, _cannot, _no_exception, _serve, _settle

    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _cannot("Playwright is not installed (pip install playwright)", exc)
    run_dir = written_dir
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = _serve(run_dir)
    url = next(server)
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            browser = _browser(p)
            page = browser.new_page(viewport={"width": 1440, "height": 1200})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{url}/timeline")
            page.wait_for_selector("h1:has-text('Timeline')", timeout=PAGE_TIMEOUT_MS)
            _settle(page)
            page.get_by_text("group 0 · sample 0").first.wait_for(timeout=PAGE_TIMEOUT_MS)  # a y-axis label
            page.get_by_text("Sort samples by").first.wait_for(timeout=PAGE_TIMEOUT_MS)
            _no_exception(page, "timeline by sample")
            page.screenshot(path=str(ARTIFACTS / "slime-sample-lanes.png"))
            page.get_by_text("reward", exact=True).first.click()
            _settle(page)
            _no_exception(page, "timeline sorted by reward")
            page.get_by_text("group 0 · sample 1").first.wait_for(timeout=PAGE_TIMEOUT_MS)
            browser.close()
    finally:
        server.close()
    assert not errors, errors


@needs_slime
def test_the_reward_page_shows_slimes_rollout_numbers(slime_dir, app):
    run_dir, rollouts = slime_dir
    at = app(run_dir)
    at.switch_page("views/reward.py").run()
    no_exceptions(at)
    assert not any("No `reward_mean` logged" in i.value for i in at.info)  # the samples' rewards stand in
    table = next(d.value for d in at.dataframe if "pass@1" in d.value.columns).set_index("step")
    assert table.loc[1, "pass@1"] == pytest.approx(rollouts[1].pass_rate["pass@1"], abs=1e-9)
    assert table.loc[0, "response_len_mean"] == pytest.approx(rollouts[0].metrics["response_len/mean"], abs=1e-9)


def test_any_run_whose_spans_name_their_sample_gets_lanes(tmp_path):
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    p = b.process("rollout")
    for i, (start, end) in enumerate([(0, 3), (0, 1), (1, 2), (0, 5)]):
        p.span("generate", start, end, step=4, sample_id=i, group_id=i // 2)
    p.span("train", 5, 6, step=4)
    b.samples(4, [{"sample_id": i, "group_id": i // 2, "reward": r} for i, r in enumerate([0.0, 1.0, 0.5, 0.2])])
    con = rltrace.store.open(b.write())
    per_sample = analysis.sample_timeline(con, 4, 4)
    assert sorted(per_sample["sample_id"].astype(int)) == [0, 1, 2, 3] and set(per_sample["reward"]) == {0.0, 1.0, 0.5, 0.2}
    spans = analysis.step_timeline(con, 4).assign(step=4)
    lanes = gantt.sample_lanes(spans, per_sample, "duration")
    laid, _ = gantt.layout(lanes)
    order = laid.drop_duplicates("label").sort_values("y")["label"].tolist()
    assert order[:4] == ["group 1 · sample 3", "group 1 · sample 2", "group 0 · sample 0", "group 0 · sample 1"]
    assert "train" in set(laid.loc[laid["lane"].isna(), "name"])  # spans of no sample keep their process row


@needs_slime
def test_the_per_token_strip_greys_tokens_under_loss_mask_0(slime_dir, app):
    from rltrace import replay

    run_dir, _ = slime_dir
    at = app(run_dir)
    at.switch_page("views/batches.py").run()
    no_exceptions(at)
    strips = [json.loads(c.proto.spec)["data"] for c in at.get("plotly_chart")]
    grey, diff = next(d for d in strips if d and d[0].get("name") == "loss mask 0")
    shown = int(at.markdown[[m.value.startswith("#### Sample") for m in at.markdown].index(True)].value.split()[2])
    step = int(at.subheader[0].value.split()[1])  # "Step 1 · batch …": the batch the page opened on
    mask = [int(m) for m in replay.load(run_dir, step)["loss_mask"][shown]]

    def cells(trace):
        z = trace["z"]
        row = z[0] if isinstance(z, list) else None
        if row is None:  # a typed array ({"dtype", "bdata", "shape"})
            import base64

            import numpy as np

            row = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"]))[: len(mask)].tolist()
        return [v is not None and v == v for v in row[: len(mask)]]

    assert cells(grey) == [m == 0 for m in mask] and 0 in mask
    assert not any(g and d for g, d in zip(cells(grey), cells(diff)))  # a greyed token has no colour
