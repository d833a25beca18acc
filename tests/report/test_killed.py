"""A killed process's open span is told from its last evidence (last heartbeat, last span end, how
the kill was seen), each once, and how long it was open is one figure with one wording in the
report, `rltrace info`, the text report and the pages; the Overview's process state and span
counts are those of `rltrace info`."""

from __future__ import annotations

import io
import re

import pytest
import streamlit as st
from rich.console import Console
from streamlit.testing.v1 import AppTest

from rltrace import report, store
from rltrace._config import paths_value
from rltrace.analysis import _format as fmt
from rltrace.analysis.health import open_text
from rltrace.cli import info
from rltrace.testing import RunBuilder
from tests.ui.conftest import APP, RUN_TIMEOUT_S, no_exceptions
from tests.ui.conftest import components_scanned_once  # noqa: F401  (autouse: one component scan a session)


def killed_worker(path):
    """A trainer that shut down, and a rollout worker (silent since its last heartbeat at 0 s) with 90
    finished spans, the last ending at 100 s, and a `generate` opened at 99 s on another thread."""
    b = RunBuilder(path)
    tr, ro = b.process("trainer"), b.process("rollout")
    for i in range(90):
        ro.span("rollout", 10.0 + i, 10.0 + i + 0.9 if i < 89 else 100.0, step=i // 10)
    ro.span("generate", 99.0, None, step=8, thread=2)
    for step in range(9):
        tr.span("train", 10.0 * step + 19.0, 10.0 * step + 19.5, step=step)
    b.write()
    return path


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    run_dir = killed_worker(tmp_path_factory.mktemp("killed") / "run")
    return run_dir, report.plain(report.build(store.open(run_dir)))


def test_the_sentence_tells_the_last_evidence_once(killed):
    _, r = killed
    (o,) = r["open_spans"]
    assert o["state"] == "killed" and o["killed_by"] == "silence"
    assert o["open_s"] == pytest.approx(1.0)  # until its last span end, the later sign of life
    told = [f for f in r["findings"] if f.startswith("Open span")]
    assert told == ["Open span: generate on rollout0 (thread worker-2) at step 8 never ended, open at least 1.00 s, "
                    "until its process's last sign of life: its last heartbeat came 1 min 39 s before it started, its "
                    "last span ended 1.00 s after it started, then no heartbeat for over 30.0 s; no error was recorded: "
                    "killed (e.g. SIGKILL or out of memory)."]


def test_info_the_text_report_and_the_overview_say_the_same(killed, monkeypatch):
    run_dir, r = killed
    (o,) = r["open_spans"]
    data = info.collect(str(run_dir))
    assert [s["open_s"] for s in data["open_spans"]] == [pytest.approx(o["open_s"])]
    procs = {p["role"]: p for p in data["processes"]}
    assert procs["rollout"]["state"] == "killed" and procs["rollout"]["spans"] == 90
    out = io.StringIO()
    report.render(r, Console(file=out, width=120, color_system=None))
    assert re.search(r"│\s+1\.00 s │ killed \(open at least this\) │", out.getvalue())
    out = io.StringIO()
    info.render(data, Console(file=out, width=160, color_system=None))
    assert "1.00 s" in out.getvalue() and "killed (open at least this)" in out.getvalue()
    st.cache_data.clear()
    monkeypatch.setenv("RLTRACE_UI_RUNS", paths_value([str(run_dir)]))
    at = AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)
    at.run()
    no_exceptions(at)
    frames = [d.value for d in at.dataframe]
    shown = next(f for f in frames if "pid" in f.columns).set_index("who")
    for who, p in (("rollout0", procs["rollout"]), ("trainer0", procs["trainer"])):
        assert (shown.loc[who, "state"], shown.loc[who, "spans"]) == (p["state"], p["spans"]), who
    hangs = next(f for f in frames if "open_s" in f.columns)
    assert hangs["open_s"].tolist() == [pytest.approx(o["open_s"])]
    at.switch_page("views/timeline.py").run()
    no_exceptions(at)
    assert any(fmt.md(open_text(o)) in m.value for m in at.markdown)
