"""The dashboard and a damaged part: without `--skip-corrupt` a page says which file and how to go
on; with it (`rltrace ui --skip-corrupt`) the part is left out and named in the sidebar."""

from __future__ import annotations

import pytest

from rltrace.cli import build_parser
from rltrace.cli import ui as ui_cli
from rltrace.testing import RunBuilder
from tests.cli.test_skip_corrupt import damage_column, truncate

from .conftest import no_exceptions


@pytest.fixture
def run(tmp_path):
    b = RunBuilder(tmp_path / "run")
    for role in ("trainer", "rollout"):  # one spans part each
        proc = b.process(role)
        for step in range(3):
            proc.span(role, step * 2, step * 2 + 1, step=step, bytes=10)
    b.write()
    return b.run_dir


def test_rltrace_ui_passes_skip_corrupt_to_the_dashboard(run):
    for flags, value in (([], "0"), (["--skip-corrupt"], "1")):
        _, env = ui_cli.command(build_parser().parse_args(["ui", str(run), *flags]))
        assert env["RLTRACE_UI_SKIP_CORRUPT"] == value


@pytest.mark.parametrize("damage", ["truncated", "damaged pages"])
def test_a_damaged_part_is_named_or_skipped(run, app, monkeypatch, damage):
    part = sorted((run / "spans").glob("*.parquet"))[0]
    truncate(part) if damage == "truncated" else damage_column(part, "attributes")
    at = app(run)
    assert not at.exception
    errors = " ".join(e.value for e in at.error).replace("\\", "")  # markdown escapes off
    assert part.name in errors and "`rltrace ui --skip-corrupt RUN_DIR`" in errors

    monkeypatch.setenv("RLTRACE_UI_SKIP_CORRUPT", "1")
    at = app()
    no_exceptions(at)
    warnings = " ".join(w.value for w in at.sidebar.warning).replace("\\", "")
    assert "Skipped an unreadable part" in warnings and part.name in warnings
