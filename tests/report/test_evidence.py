"""Each figure carries its evidence (measured, imported, derived, not recorded) and every view
renders it from the report's one record: the text report, `--json` and the Overview page."""

from __future__ import annotations

import io
import json
import re

import pytest
import streamlit as st
from rich.console import Console
from streamlit.testing.v1 import AppTest

from rltrace import report, store
from rltrace._config import paths_value
from rltrace.analysis import _format as fmt
from rltrace.cli import main
from rltrace.importers.metrics import import_metrics
from rltrace.report import evidence
from rltrace.testing import RunBuilder
from tests.ui.conftest import APP, RUN_TIMEOUT_S, no_exceptions
from tests.ui.conftest import components_scanned_once  # noqa: F401  (autouse: one component scan a session)

#: slime's own metric log: rollout, train and weight-sync timers, no reward timer
SLIME = {"perf/rollout_time": 3.2, "perf/train_time": 2.0, "perf/actor_train_time": 1.5,
         "perf/update_weights_time": 0.5, "perf/train_wait_time": 4.5, "perf/step_time": 6.5, "rollout/raw_reward": 0.5}


def slime_import(root):
    log = root / "slime.jsonl"
    log.write_text("\n".join(json.dumps({"rollout/step": i, **SLIME}) for i in range(4)))
    import_metrics([log], root / "run")
    return root / "run"


def traced(root):
    b = RunBuilder(root / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    t = 0.0
    for step in range(4):
        ro.span("rollout", t, t + 2.0, step=step)
        ro.span("reward", t + 2.0, t + 2.5, step=step)
        tr.span("train", t + 2.5, t + 3.5, step=step)
        size = 1e8 * (1 + step % 2)  # 50 ms + size at 2 GB/s
        tr.span("weight_sync", t + 3.5, t + 3.55 + size / 2e9, step=step, bytes=size)
        t += 3.6
    b.write()
    return b.run_dir


SHAPES = {"slime_import": slime_import, "traced": traced}


@pytest.fixture(scope="module", params=list(SHAPES))
def shaped(request, tmp_path_factory):
    run_dir = SHAPES[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, run_dir, report.plain(report.build(store.open(run_dir)))


def test_an_imported_run_without_a_reward_timer_says_not_recorded_never_zero(tmp_path):
    r = report.plain(report.build(store.open(slime_import(tmp_path))))
    f = r["figures"]
    assert r["t_reward"] is None and all(s["t_reward"] is None for s in r["steps"])
    assert f["t_reward"] == {"value": None, "kind": "not recorded", "basis": "no reward span"}
    assert f["t_R"] == {"value": pytest.approx(3.2), "kind": "imported", "basis": "perf/rollout_time"}
    assert f["t_W"]["kind"] == "imported" and f["t_W"]["basis"] == "perf/update_weights_time"
    assert f["t_sync"] == {"value": pytest.approx(5.7), "kind": "derived", "basis": "t_R + t_T + t_W"}
    text = " ".join(r["findings"])
    assert "reward 0 s" not in text and "(rollout 3.20 s + reward not recorded)" in text
    # the importer lays stages end to end: their overlap is not evidence of anything
    assert f["achieved_speedup"]["kind"] == "not recorded" and r["async"]["achieved_speedup"] is None
    assert "measured" not in text and "Overlap of stages not recorded" in text


def test_a_run_with_reward_but_no_rollout_spans_says_rollout_not_recorded_never_zero(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(4):
        tr.span("reward", step * 1.0, step * 1.0 + 0.2, step=step)
        tr.span("train", step * 1.0 + 0.2, step * 1.0 + 0.7, step=step)
    b.write()
    r = report.plain(report.build(store.open(b.run_dir)))
    assert r["t_rollout"] is None and r["t_R"] == pytest.approx(0.2)
    assert r["figures"]["t_rollout"]["kind"] == "not recorded"
    text = " ".join(r["findings"])
    assert "rollout 0 s" not in text and "(rollout not recorded + reward 200 ms)" in text


def test_a_traced_run_is_measured_and_its_formulas_derived(tmp_path):
    f = report.plain(report.build(store.open(traced(tmp_path))))["figures"]
    assert {k: v["kind"] for k, v in f.items()} == {
        "t_R": "measured", "t_rollout": "measured", "t_reward": "measured", "t_T": "measured", "t_W": "measured",
        "wall_s": "measured", "t_sync": "derived", "async_bound": "derived", "async_speedup_bound": "derived",
        "achieved_speedup": "measured", "B_W": "derived", "t_0": "derived"}


def _cost_rows(text: str) -> dict[str, tuple[str, str]]:
    """The text report's cost-model rows: name -> (value, kind)."""
    rows = re.findall(r"│ (t_R|t_T|t_W|t_sync|async bound|achieved)\s*│\s*([^│]+?)\s*│\s*([^│]+?)\s*│", text)
    return {name: (value, kind) for name, value, kind in rows}


TEXT_ROWS = {"t_R": "t_R", "t_T": "t_T", "t_W": "t_W", "t_sync": "t_sync", "async bound": "async_bound",
             "achieved": "achieved_speedup"}


def test_text_json_and_the_overview_give_each_figure_the_same_value_and_kind(shaped, capsys, monkeypatch):
    _, run_dir, r = shaped
    assert main(["report", str(run_dir), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["figures"] == r["figures"]
    out = io.StringIO()
    report.render(r, Console(file=out, width=100, color_system=None))
    rows = _cost_rows(out.getvalue())
    for name, key in TEXT_ROWS.items():
        fig = r["figures"][key]
        if name == "achieved" and name not in rows:
            continue
        value = ("not recorded" if fig["value"] is None else f"{fig['value']:.2f}x" if name == "achieved"
                 else fmt.seconds_text(fig["value"]))
        assert rows[name] == (value, fig["kind"]), name
    st.cache_data.clear()
    monkeypatch.setenv("RLTRACE_UI_RUNS", paths_value([str(run_dir)]))
    at = AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)
    at.run()
    no_exceptions(at)
    shown = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    for row in shown.itertuples():
        fig = r["figures"][row.figure]
        assert row.kind == fig["kind"] and getattr(row, "_4") == fig["basis"], row.figure
        assert (fmt.missing(row.value) and fig["value"] is None) or row.value == pytest.approx(fig["value"])
    assert sorted(shown["figure"]) == sorted(r["figures"])
    at.switch_page("views/waits.py").run()  # the weight-sync fit's figures, with their kinds
    no_exceptions(at)
    if r["weight_sync_points"]:
        m = {x.label: x.value for x in at.metric}
        assert m["B_W"] == fmt.rate_text(r["figures"]["B_W"]["value"]) and m["t_0"] == fmt.seconds_text(r["figures"]["t_0"]["value"])
        said = " ".join(c.value for c in at.caption)
        for key in ("B_W", "t_0"):
            assert f"{key}: {fmt.md(evidence.text(r['figures'][key]))}." in said
    at.switch_page("views/overview.py").run()
    m = {x.label: x.value for x in at.metric}
    for key in ("t_R", "t_T", "t_W"):
        assert m[key] == ("not recorded" if r[key] is None else fmt.seconds_text(r[key]))
    overlap = r["figures"]["achieved_speedup"]["value"]
    assert m["Overlap"] == ("not recorded" if overlap is None else f"{overlap:.2f}×")


def test_an_imported_step_keeps_its_logged_time_when_its_stages_overlapped(tmp_path):
    """slime async: perf/step_time 1.7 s is shorter than rollout + train + weight sync (2.7 s): the
    stages ran at once, so the step is not made 2.7 s long by laying them end to end."""
    log = tmp_path / "slime.jsonl"
    log.write_text("\n".join(json.dumps({"rollout/step": i, "perf/rollout_time": 1.5, "perf/train_time": 1.0,
                                         "perf/update_weights_time": 0.2, "perf/step_time": 1.7}) for i in range(4)))
    import_metrics([log], tmp_path / "run")
    r = report.plain(report.build(store.open(tmp_path / "run")))
    assert [s["wall_s"] for s in r["steps"]] == pytest.approx([1.7] * 4)
    assert r["figures"]["wall_s"] == {"value": pytest.approx(1.7), "kind": "imported", "basis": "perf/step_time"}
    assert (r["t_R"], r["t_T"], r["t_W"]) == pytest.approx((1.5, 1.0, 0.2))
    assert r["figures"]["achieved_speedup"]["kind"] == "not recorded"
    assert not any("overlap (measured)" in f or "Stages overlap" in f for f in r["findings"])


def test_a_tensorboard_log_gives_imported_stage_times_and_no_measured_overlap(tmp_path):
    """What users bring: an event file written by torch's own SummaryWriter with slime's timers and
    its logged step time, no reward timer. The step keeps its logged 1.7 s, the stages are imported
    with their tags, reward is not recorded, and nothing claims a measured overlap."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(4):
        for tag, value in (("perf/rollout_time", 1.5), ("perf/train_time", 1.0), ("perf/update_weights_time", 0.2),
                           ("perf/step_time", 1.7)):
            writer.add_scalar(tag, value, step)
    writer.close()
    import_metrics([tmp_path / "tb"], tmp_path / "run")
    r = report.plain(report.build(store.open(tmp_path / "run")))
    f = r["figures"]
    assert f["wall_s"] == {"value": pytest.approx(1.7), "kind": "imported", "basis": "perf/step_time"}
    assert f["t_T"]["kind"] == "imported" and f["t_T"]["value"] == pytest.approx(1.0)
    assert f["t_reward"]["value"] is None and f["t_reward"]["kind"] == "not recorded"
    assert f["achieved_speedup"]["kind"] == "not recorded"
    assert not any("Stages overlap" in s for s in r["findings"])
