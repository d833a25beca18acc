"""Opening a run: views over every part, and a clear one-line error for every kind of bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rltrace
from rltrace import store
from rltrace.cli import main as cli
from rltrace.store import StoreError


@pytest.fixture
def recorded(run_dir):
    rltrace.init(run_dir, role="trainer", rank=0)
    for step in range(3):
        with rltrace.phase("step", step=step):
            pass
        rltrace.log_metrics(step, loss=1.0)
    rltrace.shutdown()
    return run_dir


def first_part(run_dir, folder="spans"):
    return sorted((run_dir / folder).glob("*.parquet"))[0]


def test_views_exist_with_documented_columns_even_when_empty(run_dir):
    rltrace.init(run_dir)
    rltrace.shutdown()
    con = store.open(run_dir)
    for view in ("spans", "metrics", "samples", "processes"):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone()[0] >= 0
    cols = {c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE spans)").fetchall()}
    assert {"trace_id", "span_id", "phase", "step", "weight_version", "duration_s", "is_open", "attributes"} <= cols
    cols = {c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()}
    assert {"sample_id", "reward", "weight_version", "train_version", "staleness", "gen_start"} <= cols


def test_missing_dir_and_non_run_dir(tmp_path, capsys):
    with pytest.raises(StoreError, match="does not exist"):
        store.open(tmp_path / "nope")
    with pytest.raises(StoreError, match="not an rltrace run: it has no run.json"):
        store.open(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(StoreError, match="run.json is not a readable run manifest"):
        store.open(tmp_path)
    assert cli(["info", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rltrace: error:") and "Traceback" not in err and err.count("\n") == 1


def test_truncated_part_names_the_file_and_can_be_skipped(recorded, capsys):
    part = first_part(recorded)
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match=f"{part.name}: truncated or not a Parquet file"):
        store.open(recorded)
    assert cli(["info", str(recorded)]) == 2
    err = capsys.readouterr().err
    assert part.name in err and "Traceback" not in err
    con = store.open(recorded, skip_corrupt=True)
    assert con.execute("SELECT count(*) FROM metrics").fetchone() == (3,)
    assert cli(["info", str(recorded), "--skip-corrupt"]) == 0
    assert f"skipped corrupt part: {part}" in capsys.readouterr().out.replace("\n", "")


def test_foreign_parquet_file_is_named(recorded):
    foreign = recorded / "spans" / "someone-elses.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), foreign)
    with pytest.raises(StoreError, match="someone-elses.parquet: not an rltrace part"):
        store.open(recorded)


def test_part_from_a_newer_schema_says_upgrade(recorded):
    part = first_part(recorded, "metrics")
    table = pq.read_table(part)
    meta = dict(table.schema.metadata)
    meta[b"rltrace.schema_version"] = b"99"
    pq.write_table(table.replace_schema_metadata(meta), part)
    with pytest.raises(StoreError, match="schema version 99, newer than this rltrace reads.*pip install -U rltrace"):
        store.open(recorded)


def test_part_missing_required_columns(recorded):
    part = first_part(recorded, "metrics")
    table = pq.read_table(part).drop_columns(["value"])
    pq.write_table(table, part)
    with pytest.raises(StoreError, match="missing required column\\(s\\) value"):
        store.open(recorded)


def test_part_in_the_wrong_folder(recorded):
    metrics_part = first_part(recorded, "metrics")
    metrics_part.rename(recorded / "spans" / metrics_part.name)
    with pytest.raises(StoreError, match="holds table 'metrics', expected 'spans'"):
        store.open(recorded)


def test_newer_run_manifest(recorded):
    manifest = json.loads((recorded / "run.json").read_text())
    manifest["schema_version"] = 7
    (recorded / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="schema version 7"):
        store.open(recorded)


def test_temp_files_of_writers_are_ignored(recorded):
    (recorded / "spans" / ".trainer0-x-00000099.parquet.abcd.tmp").write_bytes(b"PAR1 half written")
    assert store.open(recorded).execute("SELECT count(*) FROM spans").fetchone() == (3,)


def test_cursors_of_the_connection_see_every_view(recorded):
    """Dashboards take one cursor per query (DuckDB connections are not shared across threads)."""
    con = store.open(recorded)
    cursor = con.cursor()
    assert cursor.execute("SELECT count(*) FROM spans").fetchone() == (3,)
    assert cursor.execute("SELECT count(*) FROM samples").fetchone() == (0,)


def test_duckdb_draws_no_progress_bar_into_our_output(tmp_path):
    """DuckDB prints a progress bar on stdout for queries over ~2 s (a 100M-span report): it would
    corrupt `rltrace report --json`. Connections rltrace opens have it off."""
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("train", 0, 1, step=0)
    con = store.open(b.write())
    assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0] is False


def test_records_rewritten_in_place_while_a_report_reads_them(tmp_path):
    """A live run replaces a process's open-span and process records while readers read: a
    connection keeps the versions it opened (no DuckDB type error halfway through a report)."""
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    trainer.span("train", 0, 1, step=0)
    trainer.span("rollout", 1, None, step=1)  # still running
    run = b.write()
    con = store.open(run)
    assert con.execute("SELECT count(*) FROM spans WHERE is_open").fetchone()[0] == 1

    trainer.span("rollout", 1, None, step=1, thread=2)
    trainer.span("reward", 1, None, step=1, attr_with_text="x" * 1000)  # another layout, same file name
    b.write()
    assert con.execute("SELECT count(*) FROM spans WHERE is_open").fetchone()[0] == 1  # the snapshot
    assert con.execute("SELECT count(*) FROM processes").fetchone()[0] == 1
    assert store.open(run).execute("SELECT count(*) FROM spans WHERE is_open").fetchone()[0] == 2

    snap = store.scan(run)
    for part in (run / "open_spans").glob("*.parquet"):
        part.unlink()  # the process ended between the scan and the read
    assert store.connect(snap).execute("SELECT count(*) FROM spans WHERE is_open").fetchone()[0] == 0


def test_open_spans_rewritten_while_a_reader_opens_the_run_are_read_whole(recorded):
    """A process rewrites its open-spans record (`os.replace`) every few milliseconds; a reader
    opening the run meanwhile (the live watcher, a report) sees one version or the other, never a
    mix of two files that fails as a corrupt part."""
    import threading
    import time

    from rltrace import _names
    from rltrace.store.parts import write_part

    spans = pq.read_table(first_part(recorded)).cast(_names.SPANS_SCHEMA)
    spans = pa.concat_tables([spans] * 4)
    stop = threading.Event()
    rewrites = [0]

    def rewrite():
        n = 0
        while not stop.is_set():
            n += 1
            rewrites[0] = n
            size = 1 + n % spans.num_rows
            # dictionary columns whose dictionaries change with every version
            part = spans.slice(0, size).set_column(
                spans.schema.get_field_index("name"), "name", pa.array([f"phase-{n}-{i}" for i in range(size)]).dictionary_encode()
            )
            write_part(recorded / _names.OPEN_SPANS.folder, "trainer-1.parquet", part, _names.OPEN_SPANS)
            time.sleep(0.002)  # every few milliseconds, as a busy process does (not a loop holding the GIL)

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    while rewrites[0] < 2:  # the writer is going
        time.sleep(0.01)
    first = rewrites[0]
    try:
        for _ in range(21):  # a count, not a time: as many opens on a loaded machine as on an idle one
            con = store.open(recorded)
            counted = con.execute("SELECT count(*) FROM spans WHERE is_open").fetchone()[0]
            assert 0 <= counted <= spans.num_rows
    finally:
        stop.set()
        writer.join()
    assert rewrites[0] - first > 21  # the record was rewritten all through the opens


def test_an_open_spans_file_damaged_past_its_footer_costs_only_that_file_when_skipping(tmp_path):
    """A process's open-spans record with a sound footer and damaged data: a plain open says
    which file; the live watcher's open (`skip_corrupt=True`) skips it with the reason and still
    reads every other process's spans."""
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    trainer, worker = b.process("trainer"), b.process("rollout")
    trainer.span("train", 0.0, 1.0, step=0)
    trainer.span("train", 2.0, None, step=1)  # still open
    worker.span("rollout", 2.0, None, step=1)  # still open
    b.write()
    damaged = tmp_path / "run" / "open_spans" / f"{worker.process_id}.parquet"
    data = bytearray(damaged.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    for i in range(4, len(data) - footer - 8):  # every data page, not the footer
        data[i] = 0xFF
    damaged.write_bytes(bytes(data))
    pq.read_metadata(damaged)  # the footer still reads: the scan's check passes
    with pytest.raises(StoreError, match=f"{worker.process_id}.parquet: unreadable"):
        store.open(b.run_dir)
    con = store.open(b.run_dir, skip_corrupt=True)
    assert con.execute("SELECT process_id FROM spans WHERE is_open").fetchall() == [(trainer.process_id,)]
    assert con.execute("SELECT count(*) FROM spans WHERE NOT is_open").fetchone()[0] == 1


def test_a_reader_lists_again_later_while_parts_keep_vanishing_under_it(run_dir, monkeypatch):
    """Under load, writers merging and a compaction remove parts between a listing and its reads,
    several times in a row: the reader lists again, waiting longer each time, up to a bound."""
    from rltrace.store import views

    rltrace.init(run_dir)
    with rltrace.phase("train", step=1):
        pass
    rltrace.shutdown()
    real, calls, waits = views._scan_table, [0], []

    def vanishing(folder, *args, **kwargs):
        if folder.name == "spans":
            calls[0] += 1
            if calls[0] <= 7:
                raise FileNotFoundError(2, "No such file or directory", str(folder / "gone.parquet"))
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(views, "_scan_table", vanishing)
    monkeypatch.setattr(views.time, "sleep", waits.append)
    assert store.open(run_dir).execute("SELECT count(*) FROM spans").fetchone() == (1,)
    assert waits == sorted(waits) and len(waits) == 7 and waits[-1] > waits[0]
    calls[0] = -100  # vanishing on every listing: a one-line error after the bound, not a hang
    with pytest.raises(store.StoreError, match="parts kept disappearing on 10 listings"):
        store.open(run_dir)
    tries = []
    with pytest.raises(FileNotFoundError):
        store.reading(lambda: tries.append(1) or (_ for _ in ()).throw(FileNotFoundError(2, "No such file")))
    assert len(tries) == views.SCANS


@pytest.mark.parametrize(("err", "said"), [(28, "the disk is full"), (30, "the filesystem is read-only")])
def test_init_on_a_full_or_read_only_disk_says_so_in_one_line(run_dir, monkeypatch, err, said):
    import os
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise OSError(err, os.strerror(err), str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    with pytest.raises(StoreError) as caught:
        rltrace.init(run_dir)
    message = str(caught.value)
    assert "\n" not in message and said in message and str(run_dir) in message


def test_a_fifo_given_as_a_model_config_or_a_log_is_named_for_what_it_is(tmp_path):
    import os

    from rltrace._config import RltraceConfigError
    from rltrace._model import read_config
    from rltrace.importers.readers import MetricsImportError, find_logs

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(RltraceConfigError, match="is a FIFO .named pipe., not a regular file"):
        read_config(fifo)
    with pytest.raises(MetricsImportError, match="is a FIFO .named pipe., not a regular file"):
        find_logs([fifo])


def test_a_span_finished_and_still_in_an_open_spans_file_is_read_once(run_dir):
    """A process killed after it wrote a part of finished spans but before it rewrote its open-spans
    file leaves the span in both: readers count it once, as finished."""
    import shutil

    import os

    os.environ["RLTRACE_MERGE_PARTS"] = "0"  # the writer leaves its flush parts, for compact to merge
    try:
        rltrace.init(run_dir, flush_interval=0.01)
    finally:
        del os.environ["RLTRACE_MERGE_PARTS"]
    with rltrace.phase("warmup", step=0):
        pass
    outer = rltrace.phase("train", step=1)
    outer.__enter__()
    rltrace.flush()
    (open_file,) = (run_dir / "open_spans").iterdir()
    stale = run_dir / "stale.parquet"
    shutil.copy2(open_file, stale)  # the open-spans file as the killed process left it
    outer.__exit__(None, None, None)
    rltrace.shutdown()
    shutil.copy2(stale, open_file)
    stale.unlink()
    for _ in range(2):  # and after a compaction merged the finished part away
        con = store.open(run_dir)
        assert con.execute("SELECT count(*), count(DISTINCT span_id), bool_or(is_open) FROM spans").fetchone() == (2, 2, False)
        store.compact(run_dir, grace_s=0)
