"""The critical path of each step: the chain of spans across processes that set its length."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from rltrace.analysis import _groups, _who, summary
from rltrace.analysis._steps import Steps


def critical_path(con, steps: Steps = None) -> pd.DataFrame:
    """Per step, the chain of top-level busy spans that ends with the step's last span.

    Notes:
        1. Candidates are the step's busy spans (not `wait`, not containers such as `step`)
           whose parent is not a busy span of the same process.
        2. Start from the candidate that ends last.
        3. Step back to the candidate that ended last before the current one started (1 ms
           tolerance for clocks; on ties the same process wins), until none is left.

    Returns:
        step, seq (0 = first), process_id, role, rank, phase, name, span_id, start_ns, end_ns,
        seconds (duration), gap_before_s (time between the previous link's end and this start:
        untraced time on the path), ended_by (phase of this span's child that ended last, e.g.
        the slowest `generate` inside a `rollout`), ended_by_process.
    """
    rows = summary.rows(con, steps, kinds=("path",))
    out = pd.DataFrame(
        {
            "step": rows["step"],
            "seq": rows["seq"],
            "process_id": rows["process_id"],
            "phase": rows["phase"],
            "name": rows["detail"],
            "span_id": rows["span_id"],
            "start_ns": rows["start_ns"],
            "end_ns": rows["end_ns"],
            "seconds": rows["seconds"],
            "ended_by": rows["other"],
            "ended_by_process": rows["other_process_id"],
        }
    ).sort_values(["step", "seq"], ignore_index=True)
    prev_end = out.groupby("step")["end_ns"].shift()
    out["gap_before_s"] = ((out["start_ns"] - prev_end) / 1e9).fillna(0.0).clip(lower=0.0)
    out = _who.label(out, con)
    cols = ["step", "seq", "process_id", "role", "rank", "phase", "name", "span_id", "start_ns", "end_ns",
            "seconds", "gap_before_s", "ended_by", "ended_by_process"]
    return out[cols]


def common_paths(con, steps: Steps = None) -> pd.DataFrame:
    """How often each chain of phases (e.g. "rollout → reward → train → weight_sync") was the
    critical path.

    Returns: path (phases joined by " → "), steps (count), share (of the selected steps),
    seconds (median summed duration of the chain's spans).
    """
    cp = critical_path(con, steps)
    if cp.empty:
        return pd.DataFrame(columns=["path", "steps", "share", "seconds"])
    chains = cp.groupby("step").agg(seconds=("seconds", "sum"))
    chains["path"] = _paths(cp["step"].to_numpy(), cp["phase"])
    counts = Counter(chains["path"])
    out = chains.groupby("path")["seconds"].median().rename("seconds").reset_index()
    out["steps"] = out["path"].map(counts)
    out["share"] = out["steps"] / len(chains)
    return out[["path", "steps", "share", "seconds"]].sort_values("steps", ascending=False, ignore_index=True)


def _paths(steps: np.ndarray, phases: pd.Series) -> np.ndarray:
    """Each step's chain of phases joined by " → " (rows sorted by step and link): the chains are
    laid out as rows of phase codes and only the distinct ones are spelled out."""
    group, _ = _groups.codes(steps)
    code, names = pd.factorize(phases)
    sizes = np.bincount(group)
    at = np.arange(len(group)) - (np.cumsum(sizes) - sizes)[group]
    links = np.full((len(sizes), int(sizes.max())), -1, np.int64)
    links[group, at] = code
    distinct, which = np.unique(links, axis=0, return_inverse=True)
    spelled = np.array([" → ".join(names[c] for c in row if c >= 0) for row in distinct.tolist()], dtype=object)
    return spelled[which.reshape(-1)]
