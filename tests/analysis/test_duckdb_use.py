"""How rltrace uses a DuckDB connection it shares with its caller (and with the dashboard's pages).

DuckDB 2 refuses `register` and `sql` on a connection that holds an unfinished result (a
`fetchone()` leaves one), and types an object column of Python ints and None from a sample of
its values. So: every result is fetched whole, and every frame that meets DuckDB is typed.
"""

from __future__ import annotations

import re

import pandas as pd
import pyarrow as pa

from rltrace import _names, report, store
from rltrace.analysis import summary
from tests.conftest import REPO
from tests.report.test_stalls import stalled_run

#: A partial fetch is allowed only on a cursor made for it (`cursor = con.cursor()`).
PARTIAL_FETCH = re.compile(r"(?<!cursor)\.(fetchone|fetchmany|fetch_df_chunk|fetch_record_batch)\(")


def test_the_package_never_leaves_a_result_half_fetched():
    offenders = [f"{p.relative_to(REPO)}:{i}" for folder in ("rltrace", "replay", "profiling", "ui")
                 for p in sorted((REPO / folder).rglob("*.py")) if not p.is_symlink()
                 for i, line in enumerate(p.read_text().splitlines(), 1) if PARTIAL_FETCH.search(line)]
    assert offenders == []


def test_a_report_leaves_the_connection_free_for_the_next_caller(tmp_path):
    con = store.open(stalled_run(tmp_path / "run", steps=30, slow=(20,)))
    report.build(con)
    con.register("_caller_frame", pd.DataFrame({"x": [1]}))  # refused while a result is unfinished
    assert con.sql("SELECT x FROM _caller_frame").fetchall() == [(1,)]


def test_summary_rows_are_typed_as_the_schema_types_them(tmp_path):
    frame = summary.rows(store.open(stalled_run(tmp_path / "run", steps=30, slow=(20,))))
    for field in _names.STEP_SUMMARY_SCHEMA:
        if field.name in frame and not pa.types.is_string(field.type):
            assert frame[field.name].dtype != object, field.name
