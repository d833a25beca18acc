"""Weight sync broken down: its child phases (drain, gather, transfer, load, resume) per sync, and
which of them grew when syncs got slower over the run.

A child belongs to a `weight_sync` span when it descends from it, in this process or another one
(a rollout worker's `load` under the trainer's sync). When several processes run the same child
at once (every worker loads), a sync's time for that child is the largest per-process sum, not
their total: the sync waits for the slowest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rltrace._names import WEIGHT_SYNC_CHILDREN
from rltrace.analysis import summary
from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis.engine_requests import marks as serving_marks

MAX_DEPTH = 6  # levels below weight_sync searched for its children
#: SQL of a recursive CTE `below(sync_id, span_id, depth)`: every span under each span of a CTE
#: `syncs(span_id, ...)`, at most MAX_DEPTH levels down (depth 0: the sync itself)
BELOW_SYNCS = f"""below(sync_id, span_id, depth) AS (
                SELECT span_id, span_id, 0 FROM syncs
                UNION ALL
                SELECT b.sync_id, s.span_id, b.depth + 1 FROM below b JOIN _spans s ON s.parent_span_id = b.span_id
                WHERE b.depth < {MAX_DEPTH})"""


def sync_children(con, steps: Steps = None) -> pd.DataFrame:
    """One row per finished weight_sync span and child phase it contains.

    Returns: sync_span_id, step (of the weight_sync span), start_ns, sync_s (its duration), child,
    seconds (see module doc), bytes (the largest `rl.bytes` of that child in the sync, or null),
    processes (how many processes ran it). Children absent from a sync have no row.
    """
    where, params = step_filter(steps, "step")
    marks = ", ".join("?" for _ in WEIGHT_SYNC_CHILDREN)
    if serving_marks(con, "sync_child").empty:  # most runs: no broken-down syncs; skip the recursive walk
        # over every span (whether a finished part holds a child phase is read once per part)
        return pd.DataFrame(columns=["sync_span_id", "step", "start_ns", "sync_s", "child", "seconds", "bytes",
                                     "processes"])
    return con.execute(
        f"""WITH RECURSIVE syncs AS (
                SELECT span_id, step, start_ns, duration_s FROM _spans
                WHERE coalesce(phase, name) = 'weight_sync' AND NOT is_open AND {where}),
            {BELOW_SYNCS},
            kids AS (
                SELECT b.sync_id, s.process_id, coalesce(s.phase, s.name) AS child, sum(s.duration_s) AS seconds,
                       max(TRY_CAST(attr(s.attributes, 'rl.bytes') AS BIGINT)) AS bytes
                FROM below b JOIN _spans s ON s.span_id = b.span_id
                WHERE b.depth > 0 AND NOT s.is_open AND coalesce(s.phase, s.name) IN ({marks})
                GROUP BY ALL)
            SELECT span_hex(k.sync_id) AS sync_span_id, y.step, y.start_ns, y.duration_s AS sync_s, k.child,
                   max(k.seconds) AS seconds, max(k.bytes) AS bytes, count(*) AS processes
            FROM kids k JOIN syncs y ON y.span_id = k.sync_id
            GROUP BY ALL ORDER BY y.start_ns, k.child""",
        [*params, *WEIGHT_SYNC_CHILDREN],
    ).df()


def _syncs(con, steps: Steps) -> pd.DataFrame:
    """Every finished weight_sync span in start order: span_id, duration_s. Read from the per-step
    summaries (a `sync` row per span: a scan of every span's phase would cost seconds at 100M spans),
    plus the spans without a step, which no step's summary holds, when every step is selected."""
    rows = summary.rows(con, steps, kinds=("sync",))
    out = pd.DataFrame({"span_id": rows["span_id"], "start_ns": rows["start_ns"], "duration_s": rows["seconds"]})
    if steps is None:
        stepless = con.execute(
            """SELECT span_id, start_ns, duration_s FROM spans
               WHERE step IS NULL AND coalesce(phase, name) = 'weight_sync' AND NOT is_open""").df()
        if len(stepless):
            out = pd.concat([out, stepless], ignore_index=True)
    return out.sort_values(["start_ns", "span_id"], kind="stable", ignore_index=True)


WINDOW = 100  # syncs at each end of the run whose median is its first and last value, at most ...
WINDOW_SHARE = 5  # ... and a fifth of the syncs


def window(n: int) -> int:
    """How many syncs at each end a trend compares: a fifth of them, 1 to WINDOW."""
    return max(1, min(WINDOW, n // WINDOW_SHARE))


def _ends(y: np.ndarray, w: int) -> tuple[float, float]:
    """Median of the first `w` values and of the last `w`: a few stalls at either end move neither."""
    return float(np.median(y[:w])), float(np.median(y[-w:]))


def sync_growth(con, steps: Steps = None) -> dict:
    """How weight sync time changed over the run, and which child phase it came from.

    Each child's seconds over the syncs in order (a child missing from a sync counts 0 there), and
    the whole sync's, are compared at both ends: first and last are the medians of the first and
    last `window` syncs (a fifth of them, at most 100), so stalled syncs cannot make a trend;
    growth is last minus first.

    Returns a dict: syncs (count), window (syncs at each end), total ({median_s, first_s, last_s, growth_s} of the whole
    sync), children (one dict per child: child, syncs (how many had it), median_s, share (of
    the median sync), first_s, last_s, growth_s, share_of_growth (of the whole sync's growth),
    bytes (median)), grew (the child that grew most, or None when none grew), largest (the
    child with the largest median).
    """
    rows = sync_children(con, steps)
    totals = _syncs(con, steps)
    w = window(len(totals))
    out: dict = {"syncs": int(len(totals)), "window": w, "total": None, "children": [], "grew": None, "largest": None}
    if totals.empty:
        return out
    first, last = _ends(totals["duration_s"].to_numpy(float), w)
    median_sync = float(totals["duration_s"].median())
    out["total"] = {"median_s": median_sync, "first_s": first, "last_s": last, "growth_s": last - first}
    if len(rows):  # each child row's place among the syncs in start order
        order = pd.Series(np.arange(len(totals)), index=totals["span_id"].to_numpy(object))
        order = order[~order.index.duplicated(keep="last")]
        rows = rows.assign(at=order.reindex(rows["sync_span_id"].to_numpy(object)).to_numpy())
    for child in WEIGHT_SYNC_CHILDREN:
        mine = rows[rows["child"] == child]
        if mine.empty:
            continue
        y = np.zeros(len(totals))
        y[mine["at"].to_numpy(np.int64)] = mine["seconds"].to_numpy(float)
        c_first, c_last = _ends(y, w)
        growth = c_last - c_first
        median = float(mine["seconds"].median())
        out["children"].append({
            "child": child, "syncs": int(len(mine)), "median_s": median,
            "share": median / median_sync if median_sync > 0 else None,
            "first_s": c_first, "last_s": c_last, "growth_s": growth,
            "share_of_growth": growth / (last - first) if last - first > 0 else None,
            "bytes": None if mine["bytes"].isna().all() else float(mine["bytes"].median()),
        })
    if out["children"]:
        out["largest"] = max(out["children"], key=lambda c: c["median_s"])["child"]
        top = max(out["children"], key=lambda c: c["growth_s"])
        out["grew"] = top["child"] if top["growth_s"] > 0 else None
    return out
