"""`rltrace.store.rows`: the one place store rows are built, and how a bad row is isolated."""

from types import SimpleNamespace

import pyarrow as pa

from rltrace import _names
from rltrace.store import rows

PROCESS = SimpleNamespace(process_id="p", role="r", rank=0, host="h", pid=1)


def test_one_bad_row_of_1024_is_isolated_in_few_conversions_and_order_is_kept():
    calls = []

    def build(items, cleaned):
        calls.append(len(items))
        if any(i == 700 for i in items):
            raise ValueError("bad")
        return pa.table({"i": items})

    drops = rows.Drops()
    table = rows.convert(list(range(1024)), build, table="samples", drops=drops, why=lambda i, e: ("i", f"{i} is bad"))
    assert table["i"].to_pylist() == [i for i in range(1024) if i != 700]
    assert len(calls) <= 2 + 2 * 11  # whole batch twice, then two halves per level
    assert drops.records() == [{"table": "samples", "column": "i", "reason": "700 is bad", "count": 1}]


def test_text_is_escaped_not_lost():
    bad = b"ok\xff".decode("utf-8", "surrogateescape")
    assert rows.text(bad) == "ok\\udcff" and rows.text("plain é") == "plain é"
    assert rows.clean({bad: [bad, 1]}) == {"ok\\udcff": ["ok\\udcff", 1]}


def test_every_producer_builds_rows_in_the_store_schemas():
    span = rows.span_rows_table(
        [rows.span_row(trace_id="1" * 32, span_id="2" * 16, name="train", start_ns=1, end_ns=2, attributes={"rl.x": 1})],
        PROCESS, "svc",
    )
    assert span.schema.equals(_names.SPANS_SCHEMA)
    assert rows.metrics_table(1, {"loss": 1.0}, 5, PROCESS).schema.equals(_names.METRICS_SCHEMA)
    proc = rows.process_table(PROCESS, run_id="r", service_name="svc", started_ns=1, heartbeat_ns=2, rltrace_version="t")
    assert proc.schema.equals(_names.PROCESSES_SCHEMA)
    samples = rows.samples_table(1, [{"sample_id": 7, "reward": 1}], 5, PROCESS)
    assert samples["sample_id"].type == pa.string() and samples["reward"].type == pa.float64()


def test_the_number_of_reasons_kept_is_bounded():
    drops = rows.Drops()
    for i in range(rows.MAX_REASONS + 10):
        drops.add("samples", 1, f"reason {i}")
    assert len(drops.records()) == rows.MAX_REASONS + 1 and drops.total("samples") == rows.MAX_REASONS + 10
