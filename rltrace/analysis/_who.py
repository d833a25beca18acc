"""Role, rank and host of processes, for labelling rows that carry only a process_id."""

from __future__ import annotations

import pandas as pd

_COLS = ["process_id", "role", "rank", "host"]


_CACHE = "_rltrace_who"


def processes(con, process_ids) -> pd.DataFrame:
    """process_id, role, rank, host for each id (from `processes`, else from the spans; cached)."""
    ids = sorted({p for p in process_ids if isinstance(p, str)})
    if not ids:
        return pd.DataFrame(columns=_COLS)
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_CACHE} (process_id VARCHAR, role VARCHAR, rank BIGINT, host VARCHAR)")
    marks = ", ".join("?" for _ in ids)
    cached = con.execute(f"SELECT * FROM {_CACHE} WHERE process_id IN ({marks})", ids).df()
    if len(cached) == len(ids):
        return cached[_COLS]
    found = _lookup(con, ids)
    con.register("_rltrace_who_new", found)
    try:
        con.execute(f"INSERT INTO {_CACHE} BY NAME SELECT * FROM _rltrace_who_new "
                    f"WHERE process_id NOT IN (SELECT process_id FROM {_CACHE})")
    finally:
        con.unregister("_rltrace_who_new")
    return found


def _lookup(con, ids: list[str]) -> pd.DataFrame:
    found = _identities(con, "processes", ids)
    missing = sorted(set(ids) - set(found["process_id"]))
    if missing:  # a process whose record is gone still names itself on its spans
        found = pd.concat([found, _identities(con, "spans", missing)], ignore_index=True)
    return found[_COLS]


def _identities(con, view: str, ids: list[str]) -> pd.DataFrame:
    """role, rank, host of these process ids from `view` (processes or spans: a fixed name)."""
    marks = ", ".join("?" for _ in ids)
    return con.execute(
        f"""SELECT process_id, any_value(role) AS role, any_value(rank) AS rank, any_value(host) AS host
            FROM {view} WHERE process_id IN ({marks}) GROUP BY process_id""",
        ids,
    ).df()


def label(frame: pd.DataFrame, con, column: str = "process_id", prefix: str = "") -> pd.DataFrame:
    """`frame` with role, rank (and host) of `column` joined in as `<prefix>role`, `<prefix>rank`."""
    who = processes(con, frame[column].dropna().unique()).rename(
        columns={"process_id": column, "role": prefix + "role", "rank": prefix + "rank", "host": prefix + "host"}
    )
    return frame.merge(who, on=column, how="left")
