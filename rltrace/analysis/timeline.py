"""One step's spans, for drawing a timeline."""

from __future__ import annotations

import pandas as pd

from rltrace import _names


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


#: Span attributes that name the sample / group a span works on (rltrace's `phase(..., sample_id=...)`, slime's traces).
SAMPLE_ATTRS = ("rl.sample_id", "slime.sample_id")
GROUP_ATTRS = _names.GROUP_ATTRS


def sample_timeline(con, first: int, last: int) -> pd.DataFrame:
    """The spans of steps first..last that belong to one sample (or, with only a group id, to a
    group), for a timeline with one lane per sample.

    Returns: the `step_timeline` columns plus step, sample_id, group_id (text, as recorded), reward
    (from `samples`), sample_s (the sample's own time in that step: its first span start to its
    last span end) and request (e.g. "P:58 D:23 cache:81" on spans with SGLang's prompt, completion
    and cached token counts). Empty when no span carries a sample or group id.
    """
    sid = "coalesce(" + ", ".join(f"attr(s.attributes, '{a}')" for a in SAMPLE_ATTRS) + ")"
    gid = "coalesce(" + ", ".join(f"attr(s.attributes, '{a}')" for a in GROUP_ATTRS) + ")"
    has_samples = "reward" in {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()} \
        if con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'samples'").fetchall()[0][0] else False
    rewards = ("LEFT JOIN (SELECT step, CAST(sample_id AS VARCHAR) AS sid, max(reward) AS reward FROM samples "
               f"WHERE step BETWEEN ? AND ? GROUP BY ALL) r ON r.step = s.step AND r.sid = {sid}") if has_samples else ""
    frame = con.execute(
        f"""SELECT s.span_id, s.parent_span_id, s.trace_id, s.name, coalesce(s.phase, s.name) AS phase, s.process_id,
                   s.role, s.rank, s.host, s.thread_id, s.thread_name, s.start_ns, s.end_ns, s.duration_s, s.is_open,
                   s.status, s.step, {sid} AS sample_id, {gid} AS group_id,
                   {"r.reward" if has_samples else "CAST(NULL AS DOUBLE)"} AS reward,
                   TRY_CAST(attr(s.attributes, 'prompt_tokens') AS BIGINT) AS p,
                   TRY_CAST(attr(s.attributes, 'completion_tokens') AS BIGINT) AS d,
                   TRY_CAST(attr(s.attributes, 'cached_tokens') AS BIGINT) AS c
            FROM spans s {rewards} WHERE s.step BETWEEN ? AND ? AND ({sid} IS NOT NULL OR {gid} IS NOT NULL)
            ORDER BY s.start_ns, s.span_id""",
        [int(first), int(last)] * (2 if has_samples else 1),
    ).df()
    if frame.empty:
        return frame
    ends = frame["end_ns"].fillna(frame["start_ns"])
    own = frame.assign(_end=ends)[frame["sample_id"].notna()].groupby(["step", "sample_id"])
    extent = (own["_end"].max() - own["start_ns"].min()) / 1e9
    frame["sample_s"] = [extent.get((s, i)) if i is not None and not pd.isna(i) else None
                         for s, i in zip(frame["step"], frame["sample_id"])]
    frame["request"] = [
        " ".join(f"{k}:{int(v)}" for k, v in (("P", p), ("D", d), ("cache", c)) if not pd.isna(v)) or None
        for p, d, c in zip(frame["p"], frame["d"], frame["c"])
    ]
    return frame.drop(columns=["p", "d", "c"])
