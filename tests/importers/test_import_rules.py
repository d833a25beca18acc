"""`rltrace import metrics` keeps every good line and counts every bad one (file, line, reason:
`rltrace info` shows it), never clamps an integer, commits what one import adds together and never
imports a file twice; a log's steps are shifted only when it really counts from 1."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from rltrace import store
from rltrace.cli import main as cli
from rltrace.cli.info import collect
from rltrace.importers.metrics import import_metrics

from ..conftest import PYTHON, python_env


def _verl_line(step: int, **extra) -> str:
    return json.dumps({"step": step, "data": {"timing_s/gen": 1.0 + step, "timing_s/update_actor": 0.5,
                                              "critic/rewards/mean": 0.1 * step, **extra}})


def _steps(run) -> list[int]:
    return [s for (s,) in store.open(run).execute("SELECT DISTINCT step FROM metrics ORDER BY step").fetchall()]


def _reasons(run) -> list[tuple[str, int, str]]:
    return [(r["table"], r["count"], r["reason"]) for r in collect(str(run))["drop_reasons"]]


def test_a_cut_off_last_line_costs_only_that_line(tmp_path):
    """A writer killed mid-line: the 20 whole steps are imported, the cut line is counted."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(_verl_line(s) + "\n" for s in range(1, 21)) + _verl_line(21)[:25])
    result = import_metrics([log], tmp_path / "run")
    assert result["steps"] == 20 and _steps(tmp_path / "run") == list(range(20))
    assert result["dropped"] == [f"{log}, line 21: cut off: the file ends in the middle of this line "
                                 "(its writer was killed or is still writing)"]
    assert _reasons(tmp_path / "run") == [("metric log records", 1, result["dropped"][0])]
    assert collect(str(tmp_path / "run"))["rows_dropped"] == 1


def test_bad_lines_and_values_cost_only_themselves(tmp_path):
    log = tmp_path / "log.jsonl"
    lines = [_verl_line(1), "not json at all", "[1, 2, 3]", _verl_line(2, note="text", big=10**400),
             json.dumps({"step": 2**70, "data": {"timing_s/gen": 9.0}}), json.dumps({"step": 1.5, "data": {"timing_s/gen": 9.0}}),
             json.dumps({"step": 3, "_timestamp": 1e300, "data": {"timing_s/gen": 4.0}}), _verl_line(4)]
    log.write_text("\n".join(lines) + "\n")
    result = import_metrics([log], tmp_path / "run", framework="verl")
    assert _steps(tmp_path / "run") == [0, 1, 2, 3]  # steps 1, 2, 3, 4 shifted to 0..3: step 2**70 and 1.5 refused
    assert result["dropped"] == [
        f"{log}, line 2: not JSON (Expecting value: line 1 column 1 (char 0))",
        f"{log}, line 3: a JSON list, not an object (one record per line)",
        f"{log}, line 4: non-numeric value (str)",
        f"{log}, line 4: a huge integer does not fit a 64-bit float",
        f"{log}, line 5: step 2**70 does not fit int64",
        f"{log}, line 6: step 1.5 is not a whole number",
        f"{log}, line 7: logged time 1e+300 is not a time in seconds since 1970 (the values are kept without it)",
    ]
    kinds = {(table, count) for table, count, _ in _reasons(tmp_path / "run")}
    assert kinds == {("metric log records", 1), ("metric log values", 1)} and len(_reasons(tmp_path / "run")) == 7
    con = store.open(tmp_path / "run")
    assert con.execute("SELECT max(step) FROM metrics").fetchone()[0] == 3  # nothing clamped to 2**63 - 1
    assert con.execute("SELECT value, time_ns FROM metrics WHERE step = 2 AND name = 'timing_s/gen'").fetchall() == [(4.0, None)]


def test_a_step_past_int64_in_a_file_of_plain_numbers_is_refused_not_clamped(tmp_path):
    """Arrow's fast reader reads 2**70 as a float: the file goes record by record, and that record is refused."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"_step": s, "timing_s/gen": 1.0}) + "\n" for s in (1, 2, 2**70, 3)))
    result = import_metrics([log], tmp_path / "run", framework="verl")
    assert _steps(tmp_path / "run") == [0, 1, 2]
    assert result["dropped"] == [f"{log}, line 3: step 2**70 does not fit int64"]


def test_csv_rows_that_do_not_match_the_header_are_counted(tmp_path):
    csv = tmp_path / "wandb.csv"
    csv.write_text("_step,timing_s/gen,timing_s/step\n1,2.0,3.0\n2,2.5\n3,2.0,3.0,9\n4,1.0,2.0\n5,1.")
    result = import_metrics([csv], tmp_path / "run")
    assert _steps(tmp_path / "run") == [0, 3]
    assert result["dropped"] == [f"{csv}, line 3: 2 fields, but the header has 3", f"{csv}, line 4: 4 fields, but the header has 3",
                                 f"{csv}, line 6: cut off: the file ends in the middle of this line (its writer was killed "
                                 "or is still writing)"]


def _timed_log(path, steps) -> None:
    path.write_text("".join(json.dumps({"step": s, "data": {"timing_s/gen": 1.0, "timing_s/update_actor": 0.5}}) + "\n"
                            for s in steps))


def test_steps_are_shifted_only_when_the_log_counts_from_1(tmp_path):
    """verl counts from 1, but a log whose timed steps start at 0 did not: it keeps its steps, and says so."""
    _timed_log(tmp_path / "zero.jsonl", range(0, 5))
    result = import_metrics([tmp_path / "zero.jsonl"], tmp_path / "a", framework="verl")
    assert _steps(tmp_path / "a") == [0, 1, 2, 3, 4] and result["step_shift"] == 0
    assert result["steps_note"] == "steps kept as logged: verl counts from 1, but this log's first timed step is 0"
    _timed_log(tmp_path / "one.jsonl", range(1, 6))
    result = import_metrics([tmp_path / "one.jsonl"], tmp_path / "b", framework="verl")
    assert _steps(tmp_path / "b") == [0, 1, 2, 3, 4] and result["step_shift"] == 1
    assert "steps shifted by -1" in result["steps_note"] and "first timed step is 1" in result["steps_note"]


def test_negative_step_ranges_parse_on_the_command_line(tmp_path, capsys):
    """verl's validation at global step 0 lands at step -1; `--steps -1:2` must reach the range parser."""
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 0, "data": {"val-core/acc": 0.5}}) + "\n")
    with open(log, "a") as f:
        f.writelines(_verl_line(s) + "\n" for s in range(1, 6))
    assert cli(["import", "metrics", str(log), "--out", str(tmp_path / "run")]) == 0
    assert "Steps shifted by -1" in capsys.readouterr().out
    assert _steps(tmp_path / "run") == [-1, 0, 1, 2, 3, 4]
    assert cli(["report", str(tmp_path / "run"), "--steps", "-1:2", "--json"]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)["steps"]] == [0, 1, 2]  # step -1 has no timings
    assert cli(["export", str(tmp_path / "run"), "--steps", "-1:0", "--format", "chrome", "--out", str(tmp_path / "t.json")]) == 0
    assert cli(["report", str(tmp_path / "run"), "--steps", "-3:x"]) == 2
    assert "invalid step range '-3:x'" in capsys.readouterr().err


def test_importing_a_file_again_adds_nothing(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(_verl_line(s) + "\n" for s in range(1, 4)))
    first = import_metrics([log], tmp_path / "run")
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(log.read_bytes())
    again = import_metrics([log, copy], tmp_path / "run")
    assert again["files"] == [] and again["metrics"] == 0 and len(again["already"]) == 2
    assert f"{log}: already imported into this run" in again["already"][0]
    assert f"{copy}: already imported into this run (same content as {log}" in again["already"][1]
    con = store.open(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == first["metrics"]
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == first["spans"]
    assert len(collect(str(tmp_path / "run"))["processes"]) == 1
    assert cli(["import", "metrics", str(log), "--out", str(tmp_path / "run")]) == 0
    assert "nothing new to import" in capsys.readouterr().out


def test_a_failed_import_leaves_nothing_and_its_retry_stores_each_row_once(tmp_path, monkeypatch):
    """A full disk while the parts are written: nothing of the import is visible; run again, every
    row is stored exactly once (never the rows of the failed try twice)."""
    import pyarrow.parquet as pq

    from rltrace.importers import metrics

    monkeypatch.setattr(metrics, "_PART_ROWS", 4)  # several parts: the failure comes after some are written
    log = tmp_path / "log.jsonl"
    log.write_text("".join(_verl_line(s) + "\n" for s in range(1, 6)))
    real, calls = pq.write_table, []

    def full_disk(table, where, **kwargs):
        calls.append(where)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(OSError, match="No space left"):
        import_metrics([log], tmp_path / "run")
    monkeypatch.setattr(pq, "write_table", real)
    con = store.open(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == 0
    assert not [p for p in (tmp_path / "run").rglob("*") if p.name.startswith(".") and p.is_file()]  # no temp files left
    result = import_metrics([log], tmp_path / "run")
    con = store.open(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == result["metrics"] == 5 * 4  # 3 scalars + 1 alias
    assert con.execute("SELECT count(*) FROM (SELECT DISTINCT step, name FROM metrics)").fetchone()[0] == 20


def test_a_kill_during_the_commit_is_healed_by_the_retry(tmp_path):
    """Killed after some parts were renamed into place (no ledger record yet): the retry writes the
    same part names, so the run holds every row exactly once."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(_verl_line(s) + "\n" for s in range(1, 6)))
    code = textwrap.dedent(f"""
        import os
        from rltrace.importers import metrics
        from rltrace.store import imports
        metrics._PART_ROWS = 4
        real, done = os.replace, []
        def replace(a, b):
            real(a, b)
            done.append(b)
            if len(done) == 3:
                os._exit(9)  # killed mid-commit: no cleanup runs
        imports.os.replace = replace
        metrics.import_metrics([{str(log)!r}], {str(tmp_path / 'run')!r})
    """)
    proc = subprocess.run([PYTHON, "-c", code], env=python_env(), timeout=120)
    assert proc.returncode == 9
    partial = store.open(tmp_path / "run").execute("SELECT count(*) FROM metrics").fetchone()[0]
    assert 0 < partial < 20  # the crash window the retry has to heal
    import_metrics([log], tmp_path / "run")
    con = store.open(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == 20
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 5 * 3  # a step span and two stages per step
    assert len(os.listdir(tmp_path / "run" / "imports")) == 1


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_sparse_log_with_a_line_of_64_mb_is_streamed_and_the_line_counted(tmp_path, suffix):
    """A log file with a hole of 64 MB of zero bytes and no newline (a sparse file, a disk error):
    read as a stream, the line left out unread and counted, the records around it kept."""
    import time

    from rltrace.importers import readers

    path = tmp_path / f"log{suffix}"
    first, last = ((b'{"step": 1, "loss": 0.5}\n', b'\n{"step": 2, "loss": 0.25}\n') if suffix == ".jsonl"
                   else (b"step,loss\n1,0.5\n", b"\n2,0.25\n"))
    with open(path, "wb") as f:
        f.write(first)
        f.seek(len(first) + 64 * 2**20)  # a hole: no bytes on disk, 64 MB of zeros when read
        f.write(last)
    started = time.perf_counter()
    got = readers.read(path)
    assert time.perf_counter() - started < 10
    assert sorted(got.step.tolist()) == [1, 2] and sorted(got.value.tolist()) == [0.25, 0.5]
    [why] = [r for r in got.refused.records() if "longer than" in r["reason"]]
    assert why["where"] == ("line 2" if suffix == ".jsonl" else "line 3")
