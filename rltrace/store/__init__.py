"""The run store: Parquet parts in a run directory, read through DuckDB views.

    con = rltrace.store.open("runs/exp1")
    con.execute("SELECT phase, sum(duration_s) FROM spans GROUP BY phase").df()

Layout and every column: docs/store.md.
"""

from rltrace.store.compact import compact
from rltrace.store.layout import StoreError
from rltrace.store.views import (CorruptPartError, Snapshot, check_pages, connect, open, read_manifest, reading, scan,
                                 skipping_damaged)

__all__ = ["open", "reading", "scan", "connect", "check_pages", "skipping_damaged", "compact", "read_manifest", "Snapshot", "StoreError",
           "CorruptPartError"]
