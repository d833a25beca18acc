"""What the dashboard promises about safety: it binds to localhost unless told otherwise, it never
writes to a run, it serves no file from outside the run dir, user text never reaches SQL, and a
run still being written shows its new steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from rltrace import _names
from rltrace.analysis import _format as fmt
from rltrace.cli import build_parser
from rltrace.cli import ui as ui_cli
from rltrace.store.parts import write_part
from rltrace.testing import RunBuilder
from rltrace.ui import data, runs

from .conftest import no_exceptions, snapshot
from .test_pages import PAGES, page
from tests.conftest import python_env


def _flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def test_rltrace_ui_binds_to_localhost_headless_without_telemetry(colocated_run, async_run):
    args = build_parser().parse_args(["ui", str(colocated_run), str(async_run)])
    argv, env = ui_cli.command(args)
    flags = _flags(argv)
    assert argv[1:6] == ["-m", "rltrace.ui.serve", "--hosts", "localhost,127.0.0.1,[::1]", "run"] and argv[6].endswith("app.py")
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8501"
    assert flags["--server.headless"] == "true" and flags["--browser.gatherUsageStats"] == "false"
    assert json.loads(env["RLTRACE_UI_RUNS"]) == [str(colocated_run.resolve()), str(async_run.resolve())]
    other = build_parser().parse_args(["ui", str(colocated_run), "--host", "0.0.0.0", "--port", "9000"])
    assert _flags(ui_cli.command(other)[0])["--server.address"] == "0.0.0.0"


def test_rltrace_ui_refuses_a_folder_that_is_not_a_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rltrace", "ui", str(tmp_path)], env=python_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"rltrace: error: {tmp_path} is not an rltrace run: it has no run.json (made by rltrace.init)"]


def test_a_session_through_every_page_leaves_the_runs_byte_identical(colocated_run, async_run, app):
    before = {run: snapshot(run) for run in (colocated_run, async_run)}
    at = app(colocated_run, async_run)
    for name in PAGES:
        page(at, name)
    at.selectbox(key="run").set_value(str(async_run)).run()
    for name in PAGES:
        page(at, name)
    ref = runs.RunRef(str(colocated_run), runs.fingerprint(str(colocated_run)))
    assert json.loads(data.chrome_trace(ref, (0, 5)))["traceEvents"]  # the Timeline's download
    profiles = data.profiles(ref)
    profile = profiles[profiles["path"].notna()].iloc[0]  # a phase that ended before py-spy sampled has no file
    assert data.artefact(ref, profile["path"]).read_bytes()  # the Profiles page's download
    assert {run: snapshot(run) for run in (colocated_run, async_run)} == before


def _run_with_profile_path(tmp_path: Path, stored: str) -> Path:
    """A run whose one profile row stores `stored` as its artefact path."""
    b = RunBuilder(tmp_path / "run")
    proc = b.process("trainer")
    span = proc.span("reward", 0, 2, step=1)
    b.write()
    row = {f.name: None for f in _names.PROFILES_SCHEMA}
    row.update(profile_id="p1", trace_id=span.trace_id, span_id=span.span_id, phase="reward", step=1, kind="pyspy_record",
               trigger="slow", status="ok", path=stored, process_id=proc.process_id, role="trainer", rank=0)
    write_part(b.run_dir / _names.PROFILES.folder, "p1.parquet", pa.Table.from_pylist([row], schema=_names.PROFILES_SCHEMA),
               _names.PROFILES)
    return b.run_dir


@pytest.mark.parametrize("stored", ["../../secret.txt", "/etc/hostname", "profiles/files/link.txt"])
def test_profiles_page_serves_no_file_from_outside_the_run_dir(tmp_path, app, stored):
    (tmp_path / "secret.txt").write_text("not for the dashboard")
    run_dir = _run_with_profile_path(tmp_path, stored)
    (run_dir / "profiles" / "files").mkdir(parents=True)
    (run_dir / "profiles" / "files" / "link.txt").symlink_to(tmp_path / "secret.txt")  # a symlink out of the run
    at = app(run_dir)
    at.switch_page("views/profiles.py").run()
    assert not at.exception and not at.get("download_button")
    assert [e.value for e in at.error] == [f"Not offered for download: {fmt.md(_refusal(run_dir, stored))}"]


def _refusal(run_dir: Path, stored: str) -> str:
    root = run_dir.resolve()
    if stored.startswith(("/", "..")):
        return f"profile path {stored!r} in {root} is not a plain path inside the run dir; refusing it"
    return f"profile path {stored!r} leads outside the run dir {root} (a symlink?); refusing it"


def test_user_text_reaches_no_sql(async_run, app):
    at = page(app(async_run), "timeline")
    at.text_input(key="timeline_filter").input("'; DROP VIEW spans; --").run()
    no_exceptions(at)
    assert at.metric[1].value == "0"  # no span matches; the views are intact:
    at.text_input(key="timeline_filter").input("").run()
    assert int(at.metric[1].value) > 0


def test_a_live_run_shows_new_steps_after_reload(tmp_path, app):
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    for step in range(3):
        trainer.span("train", step * 2, step * 2 + 1, step=step)
    b.write()
    at = app(b.run_dir)
    assert at.slider(key="step_range").max == 2
    for step in range(3, 5):  # the run goes on: new parts appear
        trainer.span("train", step * 2, step * 2 + 1, step=step)
    b.write()
    at.run()
    assert at.slider(key="step_range").max == 2  # the session keeps its snapshot (fast, consistent) ...
    at.button(key="reload").click().run()  # ... until Reload (or the live watcher) moves it on
    no_exceptions(at)
    assert at.slider(key="step_range").max == 4
    assert at.slider(key="step_range").value == (0, 4)  # a range that ended at the latest step follows it
