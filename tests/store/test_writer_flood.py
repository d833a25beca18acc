"""The background writer under a steady flood: a part per cycle, not one part when the flood stops."""

import threading
import time

import pyarrow as pa

from rltrace import _names
from rltrace.store import layout
from rltrace.store.writer import BackgroundWriter, ProcessInfo


def test_a_steady_flood_still_gets_parts_while_it_lasts(tmp_path):
    run_id = layout.create_or_join(tmp_path, run_name=None, config=None)["run_id"]
    writer = BackgroundWriter(tmp_path, ProcessInfo(run_id, "t", 0, "t"), interval=0.05, max_pending_rows=10**6)
    table = pa.table({"step": [1], "name": ["x"], "value": [1.0], "time_ns": [1]})

    def slow():  # converting takes longer than the producer waits between rows
        time.sleep(0.01)
        return table

    stop, parts_during = threading.Event(), []

    def produce():
        while not stop.is_set():
            writer.submit(_names.METRICS_TABLE, 1, slow)
            time.sleep(0.004)

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(2.0)
    parts_during.append(len(list((tmp_path / _names.METRICS_TABLE.folder).glob("*.parquet"))))
    stop.set()
    producer.join()
    writer.close()
    assert parts_during[0] >= 1  # before the fix: none until the flood stopped
    assert writer.rows_dropped == 0 and writer.rows_written > 100


def test_two_writers_of_one_process_never_name_a_part_alike(tmp_path):
    """The span exporter and the row writer both write span parts for one process: one counter,
    so neither replaces the other's part."""
    from rltrace.store.writer import PartNamer

    process = ProcessInfo("run", "trainer", 0, "svc")
    exporter, rows = PartNamer(process), PartNamer(process)
    names = [exporter.next(), rows.next(), exporter.next(), rows.next()]
    assert len(set(names)) == 4 and names == sorted(names)  # distinct, in write order
    process.renew()  # a forked child: new id, its own numbering
    assert PartNamer(process).next().endswith("-00000000.parquet")
