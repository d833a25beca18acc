"""The rollout long tail: how long a step waits for its slowest samples, and which ones they are."""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd
import pyarrow as pa

from rltrace.analysis import summary
from rltrace.analysis._steps import Steps, step_filter


def samples(con, steps: Steps = None) -> pa.Table:
    """The samples `long_tail` and `stragglers` read (Arrow: step, sample_id, group_id, response_len,
    gen_start, gen_end), for a caller that wants both: read once. Only samples the step waited for:
    not the earlier part of a sample carried over to a later step (`in_batch` false: aborted when
    the batch was full, so nobody waited for it)."""
    where, params = step_filter(steps)
    columns = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()}
    kept = "in_batch IS NOT false" if "in_batch" in columns else "true"
    return con.sql(  # Arrow: the ids stay text in Arrow until a straggler shows them
        f"""SELECT step, sample_id, group_id, response_len, gen_start, gen_end
            FROM samples WHERE gen_start IS NOT NULL AND gen_end IS NOT NULL AND {kept} AND {where}""",
        params=params,
    ).to_arrow_table()


def _numbers(table: pa.Table) -> pd.DataFrame:
    """The numbers of `samples()`, with each sample's generation time `gen_s`."""
    s = table.drop_columns(["sample_id", "group_id"]).to_pandas()
    s["gen_s"] = s["gen_end"] - s["gen_start"]
    return s


_MEDIANS: dict[int, tuple[weakref.ref, pd.DataFrame]] = {}  # id of a live samples() table -> its _medians()


def _medians(table: pa.Table, s: pd.DataFrame) -> pd.DataFrame:
    """Per step (the index): the median response_len, gen_s and gen_end of the samples (`s`: the
    `_numbers` of `table`). `long_tail` and `stragglers` of one table need the same three, the
    costly part of both at millions of samples: computed once while the table lives."""
    key = id(table)
    held = _MEDIANS.get(key)
    if held is not None and held[0]() is table:
        return held[1]
    g = s.groupby("step")
    found = pd.DataFrame({c: g[c].median() for c in ("response_len", "gen_s", "gen_end")})
    _MEDIANS[key] = (weakref.ref(table, lambda _, key=key: _MEDIANS.pop(key, None)), found)
    return found


def long_tail(con, steps: Steps = None, *, table: pa.Table | None = None) -> pd.DataFrame:
    """Per step, the time from the median sample's finish to the last sample's finish.

    Returns:
        step; samples; gen_s (first gen_start to last gen_end, seconds); median_finish_s and
        last_finish_s (seconds after the first gen_start); tail_s (last - median finish);
        tail_share (tail_s / the step's wall time from its spans, or / gen_s without spans);
        median_len, max_len (response tokens); median_gen_s, max_gen_s (per-sample gen_end - gen_start).
    `table`: `samples()` of the same steps, when the caller has it.
    """
    table = samples(con, steps) if table is None else table
    s = _numbers(table)
    if s.empty:
        return pd.DataFrame(columns=["step", "samples", "gen_s", "median_finish_s", "last_finish_s", "tail_s",
                                     "tail_share", "median_len", "max_len", "median_gen_s", "max_gen_s"])
    g = s.groupby("step")
    medians = _medians(table, s)
    out = pd.DataFrame(
        {
            "samples": g.size(),
            "first": g["gen_start"].min(),
            "median_end": medians["gen_end"],
            "last_end": g["gen_end"].max(),
            "median_len": medians["response_len"],
            "max_len": g["response_len"].max(),
            "median_gen_s": medians["gen_s"],
            "max_gen_s": g["gen_s"].max(),
        }
    )
    out["gen_s"] = out["last_end"] - out["first"]
    out["median_finish_s"] = out["median_end"] - out["first"]
    out["last_finish_s"] = out["last_end"] - out["first"]
    out["tail_s"] = out["last_end"] - out["median_end"]
    checks = summary.checks(con, steps).set_index("step")
    wall = ((checks["end_ns"] - checks["start_ns"]) / 1e9).reindex(out.index)
    out["tail_share"] = out["tail_s"] / wall.fillna(out["gen_s"]).where(lambda w: w > 0)
    cols = ["samples", "gen_s", "median_finish_s", "last_finish_s", "tail_s", "tail_share", "median_len",
            "max_len", "median_gen_s", "max_gen_s"]
    return out[cols].reset_index()


def stragglers(con, steps: Steps = None, *, factor: float = 2.0, per_step: int = 5,
               table: pa.Table | None = None) -> pd.DataFrame:
    """Samples that finished after the step's median and took `factor` times the median
    generation time or response length, slowest first (at most `per_step` a step).

    Returns:
        step, sample_id, group_id, response_len, len_ratio (response_len / the step's median),
        gen_s (gen_end - gen_start), time_ratio (gen_s / the step's median), after_median_s
        (seconds it finished after the median sample). `table`: `samples()` of the same steps.
    """
    table = samples(con, steps) if table is None else table
    cols = ["step", "sample_id", "group_id", "response_len", "len_ratio", "gen_s", "time_ratio", "after_median_s"]
    if not table.num_rows:
        return pd.DataFrame(columns=cols)
    s = _numbers(table)
    medians = _medians(table, s)  # each sample's step median: what groupby's transform gives
    s["len_ratio"] = s["response_len"] / s["step"].map(medians["response_len"]).where(lambda m: m > 0)
    s["time_ratio"] = s["gen_s"] / s["step"].map(medians["gen_s"]).where(lambda m: m > 0)
    s["after_median_s"] = s["gen_end"] - s["step"].map(medians["gen_end"])
    slow = (s["after_median_s"] > 0) & ((s["time_ratio"] >= factor) | (s["len_ratio"] >= factor))
    out = s[slow].sort_values(["step", "after_median_s"], ascending=[True, False]).groupby("step").head(per_step)
    ids = table.select(["sample_id", "group_id"]).take(pa.array(out.index.to_numpy())).to_pandas()
    out = out.assign(**{c: ids[c].set_axis(out.index) for c in ids})
    out = out.astype({"len_ratio": float, "time_ratio": float})
    out[["len_ratio", "time_ratio"]] = out[["len_ratio", "time_ratio"]].replace([np.inf], np.nan)
    return out[cols].reset_index(drop=True)
