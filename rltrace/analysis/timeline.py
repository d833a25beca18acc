"""One step's spans, for drawing a timeline."""

from __future__ import annotations

import pandas as pd


def step_timeline(con, step: int) -> pd.DataFrame:
    """Every span of one step (finished and open), in start order.

    Returns: span_id, parent_span_id, trace_id, name, phase, process_id, role, rank, host,
    thread_id, thread_name, start_ns, end_ns (None while open), duration_s, is_open, status.
    """
    return con.execute(
        """SELECT span_id, parent_span_id, trace_id, name, coalesce(phase, name) AS phase, process_id, role, rank,
                  host, thread_id, thread_name, start_ns, end_ns, duration_s, is_open, status
           FROM spans WHERE step = ? ORDER BY start_ns, span_id""",
        [int(step)],
    ).df()
