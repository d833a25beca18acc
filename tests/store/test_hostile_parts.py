"""Part names and files the writer would never make, placed by hand or by accident: each is
read exactly once, refused with its name, or ignored; never expanded, merged silently or hung on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import _names, store
from rltrace.cli import main as cli
from rltrace.store import CorruptPartError, StoreError


def _record(run_dir, role="trainer", steps=3):
    rltrace.init(run_dir, role=role)
    for step in range(steps):
        with rltrace.phase("train", step=step):
            pass
        rltrace.log_metrics(step, loss=1.0)
    rltrace.shutdown()
    return run_dir


def _spans(run_dir, **kw):
    return store.open(run_dir, **kw).execute("SELECT count(*) FROM spans").fetchall()[0][0]


@pytest.mark.parametrize("role", [".worker", "./w", "..", "*", "[t]rainer", "a?b{c,d}"])
def test_any_role_makes_visible_parts(run_dir, role):
    _record(run_dir, role=role)
    names = [p.name for p in (run_dir / "spans").iterdir()] + [p.name for p in (run_dir / "processes").iterdir()]
    assert names and not any(n.startswith(".") or set(n) & set("*?[]{}/") for n in names)
    con = store.open(run_dir)
    assert con.execute("SELECT count(*), min(role) FROM spans").fetchall() == [(3, role)]
    assert con.execute("SELECT role FROM processes").fetchall() == [(role,)]


@pytest.mark.parametrize("name", ["*.parquet", "[t]rainer-1.parquet", "a{b,c}.parquet", "q?.parquet"])
def test_glob_characters_in_part_names_are_read_once_and_compact_keeps_every_row(run_dir, name):
    _record(run_dir)
    part = pq.read_table(sorted((run_dir / "spans").iterdir())[0])
    ids = pa.array([i + 1 for i in part.column("span_id").to_pylist()], pa.int64())
    # a hand-placed part of 3 other spans (same rows, new span ids: a copy of the same spans is one span each)
    pq.write_table(part.set_column(part.schema.get_field_index("span_id"), "span_id", ids), run_dir / "spans" / name)
    assert _spans(run_dir) == 6
    assert cli(["compact", str(run_dir), "--grace", "0"]) == 0
    assert _spans(run_dir) == 6
    assert len(list((run_dir / "spans").iterdir())) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_like_a_part_does_not_hang_info(run_dir, tmp_path):
    _record(run_dir)
    os.mkfifo(run_dir / "spans" / "x.parquet")
    os.mkdir(run_dir / "spans" / "dir.parquet")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-m", "rltrace", "info", str(run_dir), "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["spans"]["finished"] == 3
    assert any("x.parquet: not a regular file" in s for s in data["skipped_parts"])


def test_a_part_linked_in_from_another_run_is_refused_by_name(tmp_path):
    ours, theirs = _record(tmp_path / "ours"), _record(tmp_path / "theirs")
    foreign = sorted((theirs / "spans").iterdir())[0]
    os.symlink(foreign, ours / "spans" / "linked.parquet")
    with pytest.raises(CorruptPartError, match="linked.parquet: belongs to run"):
        store.open(ours)
    assert _spans(ours, skip_corrupt=True) == 3
    os.unlink(ours / "spans" / "linked.parquet")
    os.symlink(sorted((ours / "spans").iterdir())[0], ours / "spans" / "same-run-link.parquet")
    assert _spans(ours) == 6  # a link within the run is an ordinary part


def test_a_column_of_the_wrong_type_is_named_at_open(run_dir, capsys):
    _record(run_dir)
    part = sorted((run_dir / "spans").iterdir())[0]
    table = pq.read_table(part)
    table = table.set_column(table.schema.get_field_index("step"), "step", table["step"].cast(pa.string()))
    pq.write_table(table, part)  # keeps the rltrace footer keys: only the type is wrong
    with pytest.raises(CorruptPartError, match="column 'step' holds string"):
        store.open(run_dir)
    assert cli(["report", str(run_dir)]) == 2
    assert "column 'step'" in capsys.readouterr().err
    assert cli(["report", str(run_dir), "--skip-corrupt"]) == 0


def test_a_malformed_replaces_key_is_named(run_dir):
    _record(run_dir)
    part = sorted((run_dir / "spans").iterdir())[0]
    table = pq.read_table(part)
    meta = {**table.schema.metadata, _names.META_REPLACES: b"[not json"}
    pq.write_table(table.replace_schema_metadata(meta), part)
    with pytest.raises(CorruptPartError, match="rltrace.replaces"):
        store.open(run_dir)
    assert _spans(run_dir, skip_corrupt=True) == 0


def test_damaged_pages_behind_a_valid_footer_are_named_and_skippable(run_dir, capsys):
    rltrace.init(run_dir)
    for step in range(200):
        with rltrace.phase("train", step=step, note="x" * 50):
            pass
        rltrace.flush() if step == 99 else None
    rltrace.shutdown()
    part = sorted((run_dir / "spans").iterdir())[0]
    data = bytearray(part.read_bytes())
    meta = pq.read_metadata(part)
    start = meta.row_group(0).column(0).data_page_offset
    end = start + meta.row_group(0).column(meta.num_columns - 1).total_compressed_size
    for i in range(start + 4, min(len(data) - 8 - meta.serialized_size, start + 4000)):
        data[i] = 0xFF  # pages overwritten, footer intact
    part.write_bytes(bytes(data))
    assert pq.read_metadata(part).num_rows == meta.num_rows  # the footer still reads
    code = cli(["info", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and part.name in err and "--skip-corrupt" in err
    assert cli(["info", str(run_dir), "--skip-corrupt", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spans"]["finished"] == 200 - meta.num_rows and any(part.name in s for s in out["skipped_parts"])


@pytest.mark.parametrize("version, ok", [("1", True), (1, True), ("one", False), (True, False), (0, False)])
def test_schema_version_as_written_by_hand(run_dir, version, ok):
    _record(run_dir)
    path = run_dir / "run.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = version
    path.write_text(json.dumps(manifest))
    if ok:
        assert _spans(run_dir) == 3
    else:
        with pytest.raises(StoreError, match="not a version number") as err:
            store.open(run_dir)
        assert "newer" not in str(err.value)
