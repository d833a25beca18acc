"""Profiles (py-spy, torch.profiler) attached to spans, when the run has a `profiles` view."""

from __future__ import annotations

import pandas as pd

from rltrace.analysis._steps import step_filter

_COLS = ["trace_id", "span_id", "profile_id", "kind", "path"]
_SHARES = ["status", "inside_share", "idle_share"]  # what of a recording is the phase's (py-spy; docs/profiling.md)


def has_profiles(con) -> bool:
    found = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'profiles'").fetchall()[0][0]
    return bool(found)


def attached(con, span_ids) -> pd.DataFrame:
    """Profiles attached to the given spans (empty when the run records none).

    Returns: trace_id, span_id, profile_id, kind, path (as stored; never opened here).
    """
    ids = sorted({s for s in span_ids if isinstance(s, str)})
    if not ids or not has_profiles(con):
        return pd.DataFrame(columns=_COLS)
    marks = ", ".join("?" for _ in ids)
    return con.execute(f"SELECT {', '.join(_COLS)} FROM profiles WHERE span_id IN ({marks})", ids).df()


def for_phase(con, phase: str, steps=None, limit: int = 5) -> pd.DataFrame:
    """Profiles attached to the longest spans of one phase (what to open next for a slow stage),
    with what of each recording is the phase's (`_SHARES`, where the run has them)."""
    if not has_profiles(con):
        return pd.DataFrame(columns=_COLS + ["duration_s", "step"])
    where, params = step_filter(steps)
    return con.execute(
        f"""SELECT * EXCLUDE (phase) FROM {_profiled(con)}
            WHERE phase = ? AND {where} ORDER BY duration_s DESC NULLS LAST LIMIT ?""",
        [phase, *params, limit],
    ).df()


_PROFILED = "_rltrace_profiled"


def _profiled(con) -> str:
    """The profiled spans with their phase, step and duration, joined once per connection (a
    snapshot): a report asks for several phases, and each join reads every span."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [_PROFILED]).fetchall()[0][0]
    if not found:
        any_profile = con.execute("SELECT count(*) FROM (SELECT 1 FROM profiles LIMIT 1)").fetchall()[0][0]
        have = {c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'profiles'").fetchall()}
        cols = _COLS + [c for c in _SHARES if c in have]
        con.execute(
            f"""CREATE TEMP TABLE {_PROFILED} AS
                SELECT {', '.join('p.' + c for c in cols)}, s.duration_s, s.step, coalesce(s.phase, s.name) AS phase
                FROM profiles p JOIN _spans s ON s.span_id = span_int(p.span_id)
                WHERE {'true' if any_profile else 'false'}"""
        )
    return _PROFILED
