"""Training-vs-rollout mismatch per step and its trend (how far the rollout engine's log-probs drift from the trainer's).

Three sources, each named in the `source` column: step scalars the run logged (`metrics`), the
mean of per-sample columns with a mismatch metric's name (`samples`), and frozen or imported
batches that hold both engines' per-token log-probs (`batches`: computed here, see `batch_mismatch`).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa

from rltrace import _names
from rltrace._names import MISMATCH_METRICS
from rltrace.analysis import _parts, _who
from rltrace.analysis._robust import theil_sen
from rltrace.analysis._steps import Steps, step_filter
from rltrace.analysis.metrics import step_metrics

ROLLOUT, TRAIN, MASK = "rollout_log_probs", "train_log_probs", "loss_mask"
TIS_CLIP, TIS_CLIP_LOW = 2.0, 0.0  # slime's --tis-clip / --tis-clip-low defaults (slime/utils/arguments.py)
_READABLE = {"native", "bf16"}  # codec storages whose stored values are the numbers (not raw bits)


def mismatch(con, steps: Steps = None) -> pd.DataFrame:
    """Mismatch values per step from step metrics and, where samples carry them, per-sample columns.

    Returns: step, metric, value, source (`metrics`, or `samples` for the mean of a sample
    column with a mismatch metric's name).
    """
    out = [step_metrics(con, MISMATCH_METRICS, steps).rename(columns={"name": "metric"}).assign(source="metrics")]
    columns = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE samples)").fetchall()}
    where, params = step_filter(steps)
    for metric in MISMATCH_METRICS:
        if metric in columns:
            out.append(
                con.execute(
                    f"""SELECT step, ? AS metric, avg(TRY_CAST("{metric}" AS DOUBLE)) AS value
                        FROM samples WHERE {where} GROUP BY step HAVING value IS NOT NULL ORDER BY step""",
                    [metric, *params],
                ).df().assign(source="samples")
            )
    per_batch = batch_mismatch(con, steps)
    if len(per_batch):
        long = per_batch.groupby("step")[list(MISMATCH_METRICS)].mean().reset_index().melt(
            id_vars="step", var_name="metric", value_name="value").dropna(subset=["value"])
        out.append(long.assign(source="batches"))
    frame = pd.concat([f for f in out if len(f)], ignore_index=True) if any(len(f) for f in out) else out[0]
    return frame[["step", "metric", "value", "source"]].sort_values(["source", "metric", "step"], ignore_index=True)


def batch_mismatch(con, steps: Steps = None) -> pd.DataFrame:
    """Per sample of every frozen batch holding `rollout_log_probs` and `train_log_probs`.

    Returns: step, batch_id, sample_index, tokens (masked response tokens compared), and per
    sample, over its tokens with `loss_mask` (all tokens without one), r = log p_train − log q_rollout:
    train_rollout_logprob_abs_diff (mean |r|), mismatch_k3 (mean of e^r − 1 − r, the k3 estimate
    of KL(q‖p)), tis_mean (mean of e^r), tis_clipfrac (share of tokens whose e^r lies outside
    [TIS_CLIP_LOW, TIS_CLIP]).

    Notes:
        The step value of each metric is the mean of these per-sample values, as slime reports
        `train/train_rollout_logprob_abs_diff` (sum of per-sample masked means / samples; a sample
        with no masked token counts 0). Samples whose two arrays differ in length are left out.
        Columns stored as raw bits (float8 and other dtypes DuckDB cannot read) are skipped.
    """
    cols = ["step", "batch_id", "sample_index", "tokens", *MISMATCH_METRICS]
    columns = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE batches)").fetchall()}
    if not {ROLLOUT, TRAIN} <= columns:
        return pd.DataFrame(columns=cols)
    where, params = step_filter(steps)
    mask = f", {MASK}" if MASK in columns else ""
    table = con.sql(
        f"""SELECT step, batch_id, sample_index, codec, {ROLLOUT}, {TRAIN}{mask} FROM batches
            WHERE {where} AND {ROLLOUT} IS NOT NULL AND {TRAIN} IS NOT NULL ORDER BY step, batch_id, sample_index""",
        params=params,
    ).to_arrow_table()
    if not table.num_rows:
        return pd.DataFrame(columns=cols)
    readable = np.array([_readable(c) for c in table["codec"].to_pylist()], dtype=bool)
    keep = readable & (_flat(table[ROLLOUT])[1] == _flat(table[TRAIN])[1])
    if not keep.all():
        table = table.filter(pa.array(keep))
        if not table.num_rows:
            return pd.DataFrame(columns=cols)
    q, _ = _flat(table[ROLLOUT])
    p, lp = _flat(table[TRAIN])
    m, lm = _flat(table[MASK]) if mask else (np.ones_like(p), lp)
    m_ok = lm == lp
    frame = table.select(["step", "batch_id", "sample_index"]).to_pandas()
    starts = np.concatenate([[0], np.cumsum(lp)[:-1]]).astype(np.int64)
    r = p - q
    weight = np.ones_like(r)
    mask_rows = np.repeat(m_ok, lp)
    if mask:
        mstart = np.concatenate([[0], np.cumsum(lm)[:-1]]).astype(np.int64)
        idx = np.repeat(mstart - starts, lp) + np.arange(len(r))  # token j of row i in the mask's flat array
        weight = np.where(mask_rows, m[np.where(mask_rows, idx, 0)] if len(m) else 0.0, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(r)
        per_token = {
            "train_rollout_logprob_abs_diff": np.abs(r),
            "mismatch_k3": ratio - 1.0 - r,
            "tis_mean": ratio,
            "tis_clipfrac": ((ratio > TIS_CLIP) | (ratio < TIS_CLIP_LOW)).astype(float),
        }
    tokens = _row_sums(weight, starts, lp)
    frame["tokens"] = tokens
    for name, values in per_token.items():
        frame[name] = _row_sums(values * weight, starts, lp) / np.maximum(tokens, 1.0)
    return frame[cols]


def _readable(codec_json) -> bool:
    try:
        spec = json.loads(codec_json or "{}")
    except ValueError:
        return False
    return all(spec.get(c, {}).get("storage", "native") in _READABLE for c in (ROLLOUT, TRAIN))


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat float values and per-row lengths of a list column."""
    arr = column.combine_chunks()
    if isinstance(arr, pa.ChunkedArray):
        arr = pa.concat_arrays(arr.chunks) if arr.num_chunks else pa.array([], arr.type)
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False).astype(np.float64)[offsets[0]:offsets[-1]]
    return values, np.diff(offsets).astype(np.int64)


def _row_sums(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    totals = np.concatenate([[0.0], np.cumsum(values)])
    return totals[starts + lengths] - totals[starts]


def trends(values: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, source) of a `mismatch()`-shaped frame: how it moved over the steps.

    Returns: metric, source, steps, first, last, mean, min, max, max_step (the step of the
    max), slope_per_step (Theil–Sen slope of value against step, robust to a few outlying steps;
    NaN with one step).
    """
    rows = []
    for (metric, source), g in values.groupby(["metric", "source"]):
        g = g.sort_values("step")
        slope = theil_sen(g["step"], g["value"])[0] if g["step"].nunique() > 1 else float("nan")
        rows.append(
            {"metric": metric, "source": source, "steps": len(g), "first": g["value"].iloc[0],
             "last": g["value"].iloc[-1], "mean": g["value"].mean(), "min": g["value"].min(),
             "max": g["value"].max(), "max_step": g["step"].iloc[int(g["value"].to_numpy().argmax())],
             "slope_per_step": slope}
        )
    cols = ["metric", "source", "steps", "first", "last", "mean", "min", "max", "max_step", "slope_per_step"]
    return pd.DataFrame(rows, columns=cols)


#: the rollout spans marked, read once per span part (a sidecar), and not at all from a part whose
#: writer found no span marked (`_names.META_MISMATCH_MISSING`): the attribute text is the run's largest column
_MISSING_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("size", pa.int64()),
                             ("process_id", pa.string()), ("step", pa.int64()), ("reason", pa.string())])
_MISSING_SQL = f"""SELECT filename, process_id, step, attr(attributes, '{_names.MISMATCH_MISSING}') AS reason
                   FROM part_spans WHERE phase = 'rollout' AND contains(attributes, '{_names.MISMATCH_MISSING}')"""


def missing(con, steps: Steps = None) -> pd.DataFrame:
    """Where mismatch could not be recorded, and why: rollout spans an integration marked with
    `rl.mismatch_missing` (e.g. TRL with `model.generate` wrapped by a plain function, so no
    sampling log-probs reached rltrace).

    Returns: process_id, role, rank, reason, steps (distinct steps), first_step, last_step; one
    row per process and reason.
    """
    where, params = step_filter(steps)
    marked = _parts.table(con, "mismatch_missing", _MISSING_SCHEMA, _MISSING_SQL, only="mismatch_missing IS NOT false")
    frame = con.execute(
        f"""SELECT process_id, reason, count(DISTINCT step) AS steps, min(step) AS first_step, max(step) AS last_step
            FROM {marked} WHERE reason IS NOT NULL AND {where}
            GROUP BY process_id, reason ORDER BY first_step, process_id, reason""", params).df()
    frame = _who.label(frame, con)
    return frame[["process_id", "role", "rank", "reason", "steps", "first_step", "last_step"]]
