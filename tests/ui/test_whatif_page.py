"""The What-if page: the knobs, the prediction beside the recorded run and the analytic bound,
the same figures as `rltrace whatif`."""

from __future__ import annotations

import pytest

from ..analysis.test_whatif import _loop
from .conftest import no_exceptions


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
    assert "at least 1" in at.warning[0].value
