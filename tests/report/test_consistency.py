"""One truth in every view: on several run shapes, each figure reads the same in the terminal
report, in `--json` and on the dashboard pages that show it; every share lies within [0, 1];
per step × steps = total for every stage and phase; no sentence says more than 100 % of a step.

Shapes: a real TRL GRPO run generating every 4 steps with a slow reward function, a hand-built
nested run, a real Hugging Face Trainer with gradient accumulation, a Trainer that crashes, and
an imported slime run with partial rollouts (slime's own rollout code).
"""

from __future__ import annotations

import io
import json
import re
import time

import pytest
import streamlit as st
from rich.console import Console
from streamlit.testing.v1 import AppTest

import rltrace
from rltrace import report, store
from rltrace._config import paths_value
from rltrace.analysis import _format as fmt
from rltrace.cli import main
from rltrace.testing import RunBuilder
from tests.ui.conftest import APP, RUN_TIMEOUT_S, no_exceptions
from tests.ui.conftest import components_scanned_once  # noqa: F401  (autouse: one component scan a session)

SLOW_REWARD_S = 1.5


def slow_judge(completions, **kwargs) -> list[float]:
    """A reward function that calls a slow verifier."""
    time.sleep(SLOW_REWARD_S)
    return [float(len(c) % 2) for c in completions]


def trl_every_4(root):
    pytest.importorskip("trl")
    from examples import trl_grpo
    from rltrace.integrations.trl import instrument

    trainer = trl_grpo.build_trainer(str(root / "out"), steps=8, steps_per_generation=4,
                                     reward_funcs=[trl_grpo.reward_short, slow_judge])
    instrument(trainer, root / "run")
    trainer.train()
    rltrace.shutdown()
    return root / "run"


def nested(root):
    """Reward runs inside rollout on the trainer's thread (as TRL scores inside its generation)."""
    b = RunBuilder(root / "run")
    tr = b.process("trainer")
    t = 0.0
    for step in range(6):
        ro = tr.span("rollout", t, t + 3.0, step=step)
        tr.span("generate", t, t + 2.0, step=step, parent=ro)
        rw = tr.span("reward", t + 2.0, t + 3.0, step=step, parent=ro)
        tr.span("verifier", t + 2.0, t + 2.9, step=step, parent=rw)
        tr.span("train", t + 3.0, t + 4.0, step=step)
        tr.span("weight_sync", t + 4.0, t + 4.2, step=step, bytes=1e8)
        b.metric(step, "reward_mean", 0.1 * step)
        t += 4.2
    b.write()
    return b.run_dir


def hf_trainer(root):
    """In this process, as `hf_train.py --callback RUN --steps 4` trains (transformers is loaded already)."""
    from rltrace.integrations.hf import RltraceCallback
    from tests.integrations.hf_train import make_trainer

    make_trainer(steps=4, callbacks=[RltraceCallback(str(root / "run"))], output_dir=str(root / "out")).train()
    rltrace.shutdown()
    return root / "run"


def slime_partial(root):
    from rltrace.replay.slime import import_slime
    from tests.replay import slime_run

    if not slime_run.available():
        pytest.skip(slime_run.MISSING)
    slime_run.run(root / "dump", rollouts=2, partial=True)
    import_slime([root / "dump"], root / "run")
    return root / "run"


SHAPES = {"trl_every_4": None, "nested": nested, "hf_trainer": hf_trainer, "hf_crash": None,
          "slime_partial": slime_partial}
#: shapes other tests read too, made once by a fixture: trl_every_4 for this module; hf_crash, an unmodified
#: Trainer script that dies of its loss under `rltrace run` (tests/conftest.py), once a session
FROM_FIXTURE = {"trl_every_4": "trl_run", "hf_crash": "hf_crash_run"}


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    return trl_every_4(tmp_path_factory.mktemp("trl_every_4"))


@pytest.fixture(scope="module", params=list(SHAPES))
def shaped(request, tmp_path_factory):
    if request.param in FROM_FIXTURE:
        made = request.getfixturevalue(FROM_FIXTURE[request.param])
        run_dir = made[0] if isinstance(made, tuple) else made
    else:
        run_dir = SHAPES[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, run_dir, report.plain(report.build(store.open(run_dir)))


def _shares(value, path=""):
    """Every number under a key naming a share (share, tail_share, queue_share ...)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if "share" in k and isinstance(v, (int, float)) and not isinstance(v, bool):
                yield f"{path}.{k}", v
            else:
                yield from _shares(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _shares(v, f"{path}[{i}]")


def _text(r: dict) -> str:
    out = io.StringIO()
    report.render(r, Console(file=out, width=80, color_system=None), full=True)
    return out.getvalue()


def _cost_row(text: str, key: str) -> str:
    return re.search(rf"│ {re.escape(key)}\s*│\s*([^│]+?)\s*│", text).group(1)


def test_every_share_is_a_fraction(shaped):
    _, _, r = shaped
    shares = list(_shares(r))
    assert shares, "no share at all: the report lost its figures"
    bad = [(p, v) for p, v in shares if not 0.0 <= v <= 1.0 + 1e-9]
    assert bad == []


def test_per_step_times_steps_is_the_total(shaped):
    _, _, r = shaped
    assert r["stages"], "no stage figures"
    for s in r["stages"]:
        assert s["per_step_s"] * s["steps"] == pytest.approx(s["total_s"], rel=1e-9)
        assert s["per_run_s"] * s["runs"] == pytest.approx(s["total_s"], rel=1e-9)
        assert s["steps"] == len(r["steps"])
    for p in r["phases"]:
        assert p["per_step_s"] * len(r["steps"]) == pytest.approx(p["total_s"], rel=1e-9)


def test_the_text_report_and_json_say_the_same(shaped, capsys):
    _, run_dir, r = shaped
    assert main(["report", str(run_dir), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    for key in ("t_R", "t_T", "t_W", "t_sync", "async_bound", "bottleneck", "stages", "phases"):
        assert cli[key] == r[key], key
    text = _text(r)
    for key in ("t_R", "t_T", "t_W", "t_sync"):
        want = "not recorded" if key != "t_sync" and r[key] is None else fmt.seconds_text(r[key])
        assert _cost_row(text, key) == want, key
    b = r["bottleneck"]
    if b:
        assert f"median {fmt.seconds_text(b['median_s'])} per step" in " ".join(r["findings"])
        assert f"{b['share']:.0%} of step time" in " ".join(r["findings"])
    over = [int(p) for p in re.findall(r"(\d+)% of", text.replace("\n", " ")) if int(p) > 100]
    assert over == []


def _page(run_dir, name: str, monkeypatch) -> AppTest:
    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.setenv("RLTRACE_UI_RUNS", paths_value([str(run_dir)]))
    at = AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)
    at.switch_page(f"views/{name}.py").run()
    no_exceptions(at)
    return at


def test_the_dashboard_shows_the_reports_figures(shaped, monkeypatch):
    _, run_dir, r = shaped
    m = {x.label: x.value for x in _page(run_dir, "overview", monkeypatch).metric}
    for key in ("t_R", "t_T", "t_W"):
        assert m[key] == ("not recorded" if r[key] is None else fmt.seconds_text(r[key])), key
    assert m["t_sync"] == fmt.seconds_text(r["t_sync"])
    if len(r["steps"]) < 2:
        return
    at = _page(run_dir, "compare", monkeypatch)  # two steps of the run: each step's own times
    a, b = at.selectbox(key="compare_a").value, at.selectbox(key="compare_b").value
    row = {s["step"]: s for s in r["steps"]}
    shown = {x.label: x.value for x in at.metric}
    assert shown["wall time"] == fmt.seconds_text(row[b]["wall_s"])
    for key in ("t_T",):
        if row[b][key] is not None:
            assert shown[key] == fmt.seconds_text(row[b][key])
    table = at.dataframe[-1].value
    t_t = table[table["what"] == "t_T"].iloc[0]
    for side, step in zip(t_t.index[2:4], (a, b)):
        assert t_t[side] == pytest.approx(row[step]["t_T"]) if row[step]["t_T"] is not None else fmt.missing(t_t[side])


def test_a_slow_reward_function_is_named_in_the_one_screen_report(trl_run):
    """TRL: generation every 4 steps, two reward functions, one of them slow."""
    r = report.plain(report.build(store.open(trl_run)))
    reward = next(s for s in r["stages"] if s["stage"] == "reward")
    assert reward["culprit"]["phase"] == "slow_judge" and reward["runs"] == 2 and reward["serves_steps"] == 4
    assert reward["per_run_s"] == pytest.approx(reward["per_step_s"] * 4, rel=0.05)
    out = io.StringIO()
    report.render(r, Console(file=out, width=80, color_system=None))
    assert "(most in slow_judge)" in " ".join(out.getvalue().replace("│", " ").split())
    if r["bottleneck"]["stage"] == "reward":  # the usual case; train can take longer on a loaded machine
        assert "most of it in slow_judge" in r["findings"][0] and "runs every 4 steps" in r["findings"][0]


def test_the_headline_names_the_child_that_holds_the_bottleneck(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    t = 0.0
    for step in range(5):
        tr.span("rollout", t, t + 0.5, step=step)
        rw = tr.span("reward", t + 0.5, t + 2.5, step=step)
        tr.span("judge_with_verifier", t + 0.5, t + 2.49, step=step, parent=rw)
        tr.span("format_check", t + 2.49, t + 2.5, step=step, parent=rw)
        tr.span("train", t + 2.5, t + 3.0, step=step)
        t += 3.0
    b.write()
    r = report.plain(report.build(store.open(b.run_dir)))
    assert r["findings"][0].startswith("Bottleneck: reward on trainer0, median 2.00 s per step, 67% of step time; "
                                       "most of it in judge_with_verifier (99%);"), r["findings"][0]
    reward = next(s for s in r["stages"] if s["stage"] == "reward")
    assert [c["phase"] for c in reward["children"]] == ["judge_with_verifier", "format_check"]
    assert reward["children"][0]["per_step_s"] == pytest.approx(1.99)


def test_a_stage_that_ran_once_is_not_given_a_period(tmp_path):
    """A run cut short after one generation (a crash at step 3 of a run generating every 4 steps):
    how many steps that generation serves is only known to be at least the steps recorded."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    tr.span("rollout", 0.0, 4.0, step=0)
    for step in range(3):
        tr.span("train", 4.0 + step, 4.5 + step, step=step)
    b.write()
    r = report.plain(report.build(store.open(b.run_dir)))
    text = " ".join(r["findings"])
    assert "rollout and reward ran once, at step 0, in these steps" in text and "runs every" not in text
    assert "ran once, spread over 3 steps" in r["findings"][0]


def test_each_figure_says_what_it_rests_on(shaped):
    """Traced runs are measured; slime's imported traces are imported, never measured; absent is
    not recorded, never 0; the record holds the report's own value."""
    name, _, r = shaped
    f = r["figures"]
    for key, record in f.items():
        assert (record["value"] is None) == (record["kind"] == "not recorded"), key
        if key in r:
            assert record["value"] == r[key], key
    if name == "slime_partial":
        assert f["t_R"]["kind"] == "imported" and f["achieved_speedup"]["kind"] == "imported"
        assert f["t_T"] == {"value": None, "kind": "not recorded", "basis": "no train span"}
    else:
        assert f["t_T"]["kind"] == "measured" and f["achieved_speedup"]["kind"] == "measured"
