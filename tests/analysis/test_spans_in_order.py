"""`Spans.from_arrow(table, order=...)` (how a batch's spans are loaded: sorted by index, the text
never moved) equals the table taken in that order, whatever the columns hold."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rltrace.analysis._compute import Spans


def _table(process_ids: list) -> pa.Table:
    n = len(process_ids)
    return pa.table({
        "span_id": pa.array([3, 1, 2, None][:n], pa.int64()),
        "parent_span_id": pa.array([None, 3, 3, 1][:n], pa.int64()),
        "phase": pa.array(["train", "forward", "backward", "forward"][:n]),
        "name": pa.array(["train", "forward", "backward", "forward"][:n]),
        "step": pa.array([0, 0, None, 1][:n], pa.int64()),
        "process_id": pa.array(process_ids, pa.string()),
        "thread_id": pa.array([1, 1, None, 2][:n], pa.int64()),
        "start_ns": pa.array([10, 30, 20, 20][:n], pa.int64()),
        "end_ns": pa.array([50, 40, 30, 25][:n], pa.int64()),
        "waiting_for": pa.nulls(n, pa.string()),
        "sync_bytes": pa.nulls(n, pa.float64()),
        "sync_method": pa.nulls(n, pa.string()),
    })


@pytest.mark.parametrize("process_ids", [["b", "a", "b", None], [None, None, None, None], ["a", "a", "a", "a"]])
def test_spans_in_a_given_order_equal_the_table_taken_in_it(process_ids):
    table = _table(process_ids)
    order = np.array([0, 2, 3, 1])  # by start, ties as given
    got, want = Spans.from_arrow(table, order=order), Spans.from_arrow(table.take(pa.array(order)))
    for field in ("step", "has_step", "phase", "proc", "thread", "start", "end", "prow", "count", "total"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert list(got.phase_names) == list(want.phase_names) and list(got.proc_names) == list(want.proc_names)
    assert list(got.strings("name", np.arange(4))) == list(want.strings("name", np.arange(4)))
