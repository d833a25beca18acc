"""Reading profiles back: `rltrace profile list/show`, `profiles_for_spans` for reports, and paths
from the store that are never trusted."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

import rltrace
from rltrace import _names
from rltrace import store
from rltrace.cli import main
from rltrace.profiling import UnsafePathError, artefact_path, dump_stacks, profiles_for_spans
from rltrace.store.parts import write_part

from .conftest import PYSPY, wait_for_profiles


@pytest.fixture
def dumped_run(tmp_path):
    """A run with one real py-spy dump attached to an eval phase."""
    run_dir = tmp_path / "run"
    rltrace.init(run_dir, profile={"pyspy": PYSPY, "hang_timeout": 600})
    with rltrace.phase("eval", step=4) as p:
        profile_id = dump_stacks("test")
        wait_for_profiles(run_dir, lambda rows: rows and rows[0]["status"] == "ok")
        span = (p.trace_id, p.span_id)
    rltrace.shutdown()
    return run_dir, profile_id, span


def test_profiles_for_spans_names_the_profile_of_each_span(dumped_run):
    run_dir, profile_id, (trace_id, span_id) = dumped_run
    con = store.open(run_dir)
    frame = profiles_for_spans(con)
    assert list(frame[["trace_id", "span_id", "profile_id", "kind", "status"]].itertuples(index=False, name=None)) == [
        (trace_id, span_id, profile_id, "pyspy_dump", "ok")
    ]
    assert frame.loc[0, "top_frame"] and frame.loc[0, "top_self_share"] == 1.0
    joined = con.execute(
        "SELECT s.phase, s.step FROM spans s JOIN profiles p USING (trace_id, span_id) WHERE p.profile_id = ?",
        [profile_id],
    ).fetchall()
    assert joined == [("eval", 4)]


def test_profile_list_and_show(dumped_run, capsys):
    run_dir, profile_id, _ = dumped_run
    assert main(["profile", "list", str(run_dir)]) == 0
    listing = capsys.readouterr().out
    assert profile_id[:8] in listing and "pyspy_dump" in listing and "manual" in listing
    assert main(["profile", "show", str(run_dir), profile_id[:6]]) == 0
    shown = capsys.readouterr().out
    assert "dumped_run" in shown  # the stack of the fixture that asked for the dump
    assert "less " in shown and str(run_dir.resolve()) in shown
    assert main(["profile", "show", "--json", str(run_dir), profile_id]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["profile_id"] == profile_id and os.path.isfile(data["file"]) and data["frames"]


def test_unknown_profile_id_is_a_one_line_error(dumped_run, capsys):
    run_dir, _, _ = dumped_run
    assert main(["profile", "show", str(run_dir), "zz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rltrace: error: no profile id starts with 'zz'") and err.count("\n") == 1


def test_empty_run_says_how_to_turn_profiling_on(tmp_path, capsys):
    rltrace.init(tmp_path / "run", profile=False)
    rltrace.shutdown()
    assert main(["profile", "list", str(tmp_path / "run")]) == 0
    assert "RLTRACE_PROFILE_SLOW" in capsys.readouterr().out


@pytest.mark.parametrize("stored", ["../outside.txt", "/etc/passwd", "profiles/files/../../../x", "escape/link.txt"])
def test_paths_leaving_the_run_dir_are_refused(tmp_path, stored):
    run_dir = tmp_path / "run"
    (run_dir / "escape").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("not yours")
    (run_dir / "escape" / "link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(UnsafePathError, match="refusing"):
        artefact_path(run_dir, stored)


def test_show_refuses_a_tampered_path(dumped_run, capsys):
    run_dir, _, _ = dumped_run
    row = store.open(run_dir).sql("SELECT * EXCLUDE (path, profile_id) FROM profiles").to_arrow_table()
    row = row.append_column("path", pa.array(["../../../etc/passwd"])).append_column(
        "profile_id", pa.array(["feedface"])
    )
    write_part(run_dir / "profiles", "tampered.parquet", row.select(_names.PROFILES_SCHEMA.names), _names.PROFILES)
    assert main(["profile", "show", str(run_dir), "feedface"]) == 2
    assert "refusing" in capsys.readouterr().err
