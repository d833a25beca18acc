"""`--skip-corrupt` on every command that reads a run: without it a damaged part stops the command
with one line naming the file and the flag; with it the part is named and the command goes on.
`info` reads every page, so it finds whatever damage a report would meet."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import replay
from rltrace.cli import main


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # file names on one line


@pytest.fixture
def run(tmp_path) -> Path:
    """Two span parts, metrics, and frozen batches at steps 1 and 2 (one part each)."""
    run_dir = tmp_path / "run"
    rltrace.init(run_dir)
    for step in range(6):
        with rltrace.phase("train", step=step, note="x" * 50):
            pass
        rltrace.log_metrics(step, loss=1.0 / (step + 1))
        if step == 2:
            rltrace.flush()
    for step in (1, 2):
        assert replay.freeze(step, [{"reward": float(i), "response": f"answer {i}"} for i in range(4)])
    replay.flush()
    rltrace.shutdown()
    return run_dir


def first_part(run: Path, table: str) -> Path:
    return sorted((run / table).glob("*.parquet"))[0]


def truncate(part: Path) -> None:
    part.write_bytes(part.read_bytes()[:200])


def damage_column(part: Path, column: str) -> None:
    """Overwrite the pages of one column chunk; the footer stays sound."""
    meta = pq.read_metadata(part)
    chunk = meta.row_group(0).column(meta.schema.names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(part.read_bytes())
    data[start + 3:start + chunk.total_compressed_size] = b"\xff" * (chunk.total_compressed_size - 3)
    part.write_bytes(bytes(data))
    assert pq.read_metadata(part).num_rows == meta.num_rows


def run_cli(capsys, caplog, args) -> tuple[int, str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out + err + caplog.text


COMMANDS = {
    "info": ("spans", ["info", "{run}"]),
    "report": ("spans", ["report", "{run}", "--json"]),
    "whatif": ("spans", ["whatif", "{run}", "--json"]),
    "compact": ("spans", ["compact", "{run}", "--grace", "0"]),
    "export chrome": ("spans", ["export", "{run}", "--format", "chrome", "--out", "{tmp}/trace.json"]),
    "profile list": ("spans", ["profile", "list", "{run}"]),
    "profile show": ("spans", ["profile", "show", "{run}", "nosuchid"]),
    "watch": ("spans", ["watch", "{run}", "--once"]),
    "replay list": ("batches", ["replay", "list", "{run}"]),
    "export slime": ("batches", ["export", "{run}", "--format", "slime", "--out", "{tmp}/{{rollout_id}}.pt"]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", ["truncated", "damaged pages"])
def test_every_reader_stops_at_a_damaged_part_or_skips_it(run, tmp_path, capsys, caplog, command, damage):
    table, template = COMMANDS[command]
    args = [a.format(run=run, tmp=tmp_path) for a in template]
    part = first_part(run, table)
    truncate(part) if damage == "truncated" else damage_column(part, "attributes" if table == "spans" else "reward")
    code, text = run_cli(capsys, caplog, args)
    if command in ("profile list", "profile show", "watch", "replay list") and damage == "damaged pages":
        # these never read the damaged column (span attributes, a batch's samples): what they show is whole
        assert code in (0, 1) or "no profile" in text, text
        return
    assert code == 2 and part.name in text and "rerun with --skip-corrupt" in text and "Traceback" not in text, text
    error = [line for line in text.splitlines() if line.startswith("rltrace: error:")]
    assert len(error) == 1
    code, text = run_cli(capsys, caplog, [*args, "--skip-corrupt"])
    assert part.name in text, text
    if command == "profile show":  # the part is skipped; the profile asked for is still not there
        assert code == 2 and "no profile id starts with 'nosuchid'" in text
    else:
        assert code in (0, 1) and "rltrace: error" not in text, text  # watch --once: 1 when an alert holds
    assert part.exists()  # never deleted, compaction included


def test_info_reads_what_report_reads_and_both_skip_the_same(run, capsys, caplog):
    part = first_part(run, "spans")
    damage_column(part, "attributes")  # a column `info` itself never shows
    code, text = run_cli(capsys, caplog, ["info", run])
    assert code == 2 and f"{part.name}: damaged data pages" in text
    code, text = run_cli(capsys, caplog, ["report", run])
    assert code == 2 and f"{part.name}: damaged data pages" in text

    code, text = run_cli(capsys, caplog, ["info", run, "--json", "--skip-corrupt"])
    assert code == 0
    info = json.loads(text[:text.rindex("}") + 1])
    assert [s.split(": ")[0] for s in info["skipped_parts"]] == [str(part)]
    code, text = run_cli(capsys, caplog, ["report", run, "--json", "--skip-corrupt"])
    assert code == 0
    report = json.loads(text[:text.rindex("}") + 1])
    kept = 6 - pq.read_metadata(part).num_rows  # the rows of the other part
    assert [s.split(": ")[0] for s in report["skipped_parts"]] == [str(part)]  # the report says what it lacks
    assert report["findings"][0].startswith("1 damaged part(s) left out (--skip-corrupt): every figure here misses")
    assert info["spans"]["finished"] == kept
    assert sum(p["spans"] for p in report["phases"] if p["phase"] == "train") == kept
