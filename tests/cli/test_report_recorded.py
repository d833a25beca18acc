"""The report and the Chrome export on a run recorded through the real API (examples/quickstart.py)."""

import json
import subprocess

from rltrace.cli import main
from tests.conftest import PYTHON, REPO, python_env
from tests.export.test_chrome import check_trace_event_format


def test_report_and_export_of_a_recorded_run(tmp_path, capsys):
    run = tmp_path / "quickstart"
    subprocess.run([PYTHON, str(REPO / "examples" / "quickstart.py"), str(run)], check=True, env=python_env(),
                   capture_output=True, timeout=120)
    assert main(["report", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["steps"]) == 60
    assert data["critical_path"][0]["path"] == "rollout → reward → train → weight_sync"
    assert data["weight_sync_fit"]["sizes"] == 1 and data["weight_sync_fit"]["effective_B_W"] > 0
    assert data["reward"]["last"] is not None and data["open_spans"] == []
    for s in data["steps"]:
        assert abs(s["t_sync"] - (s["t_R"] + s["t_T"] + s["t_W"])) < 1e-9
    out = tmp_path / "trace.json"
    assert main(["export", str(run), "--format", "chrome", "--out", str(out)]) == 0
    check_trace_event_format(json.loads(out.read_text()))
