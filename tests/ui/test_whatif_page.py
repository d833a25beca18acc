"""The What-if page: the knobs, the prediction beside the recorded run and the analytic bound,
the same figures as `rltrace whatif`."""

from __future__ import annotations

import pytest

from ..analysis.test_whatif import _loop
from .conftest import no_exceptions


def said(at) -> str:
    """The page's first warning as a user reads it (markdown escapes taken out)."""
    return at.warning[0].value.replace("\\", "")


@pytest.fixture
def run(tmp_path):
    _loop(tmp_path, gens=[0.3, 0.5], train=1.0, sync=0.2)  # sync step 1.7 s; async: train + sync, 1.2 s
    return tmp_path / "run"


def test_the_page_predicts_the_schedule_picked(run, app):
    at = app(run)
    at.switch_page("views/whatif.py").run()
    no_exceptions(at)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Predicted step"] == "1.20 s" and shown["Analytic bound"] == "1.20 s"
    assert shown["Staleness (mean, max)"].endswith(", 1")
    assert "Binds: t\\_T \\+ t\\_W" in at.markdown[0].value  # markdown-escaped: shown as written
    assert len(at.get("plotly_chart")) == 1
    at.number_input(key="whatif_k").set_value(0).run()
    assert {m.label: m.value for m in at.metric}["Predicted step"] == "1.70 s"
    at.segmented_control(key="whatif_placement").set_value("colocated").run()
    at.number_input(key="whatif_k").set_value(2).run()
    no_exceptions(at)
    assert {m.label: m.value for m in at.metric}["Predicted step"] == "1.70 s"  # colocated: the sum, whatever K
    at.segmented_control(key="whatif_placement").set_value("disaggregated").run()
    at.number_input(key="whatif_k").set_value(1).run()
    at.number_input(key="whatif_sync").set_value(0.5).run()
    no_exceptions(at)
    assert {m.label: m.value for m in at.metric}["Predicted step"] == "1.50 s"  # train 1.0 s + the sync asked
    at.number_input(key="whatif_partial").set_value(0.5).run()
    assert "at least 1" in said(at)


def test_a_prefill_decode_split_is_predicted_or_refused_with_the_reason(tmp_path, app, monkeypatch):
    """One unified engine recorded its requests (4 prompts, 0.1 s of prefill each, 0.3 s of decode;
    train 0.5, sync 0.1). P:D on the page: refused, with the reason, while the run lacks the model
    config (no KV bytes) or a KV link bandwidth; with both, 1:1 on a link of 0.2 s a prompt steps in
    0.9 + 0.3 + 0.6 s, the KV link holding it, as `rltrace whatif --pd 1:1` says."""
    import json

    from ..analysis.test_whatif import GQA, KV, _requests_loop

    _requests_loop(tmp_path, decode=[0.3] * 4, model=None)
    at = app(tmp_path / "run")
    at.switch_page("views/whatif.py").run()
    at.number_input(key="whatif_k").set_value(0).run()
    at.text_input(key="whatif_pd").set_value("1:1").run()
    no_exceptions(at)
    assert "cannot predict a prefill/decode split: no KV bytes per request: no model config" in said(at)
    assert not at.metric  # no figure for what cannot be predicted

    config = tmp_path / "config.json"
    config.write_text(json.dumps(GQA))
    monkeypatch.setenv("RLTRACE_UI_SERVING", json.dumps({"model": str(config)}))  # `rltrace ui --model`
    at = app()
    at.switch_page("views/whatif.py").run()
    at.number_input(key="whatif_k").set_value(0).run()
    at.text_input(key="whatif_pd").set_value("1:1").run()
    no_exceptions(at)
    assert "no KV link bandwidth" in said(at)
    at.number_input(key="whatif_kv_gbps").set_value(KV / 0.2 / 1e9).run()
    no_exceptions(at)
    assert not at.warning
    assert {m.label: m.value for m in at.metric}["Predicted step"] == "1.80 s"
    assert "Binds: KV link" in at.markdown[0].value
    at.text_input(key="whatif_pd").set_value("2-2").run()
    assert "P:D" in said(at)


def test_a_split_of_a_run_without_engine_requests_is_refused(run, app):
    at = app(run)
    at.switch_page("views/whatif.py").run()
    at.text_input(key="whatif_pd").set_value("1:1").run()
    no_exceptions(at)
    assert "no engine request spans" in said(at)
