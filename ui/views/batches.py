"""Batches: the frozen batches (debug replay) with their text and bad-text flags, a per-token strip
of the train/rollout log-prob difference, and what replaying the batch gave."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.replay import ReplayError
from rltrace.ui import charts, data, state

MAX_STRIP_TOKENS = 2048  # tokens drawn in one strip

run = state.selected()
st.title("Batches")
if not data.info(run)["batches"]:
    st.info("No frozen batches in this run — see docs/replay.md to enable freezing "
            "(`rltrace.replay.freeze(step, samples, batch_meta=...)` or a `Freezer` policy).")
    st.stop()

table = data.batches(run)
steps = state.steps()
if steps is not None:
    in_range = table[table["step"].between(*steps)]
    table = in_range if len(in_range) else table
table = table.reset_index(drop=True)
wanted = st.session_state.pop("batches_step", None)  # sent here from Reward & mismatch
with_replays = table.index[table["replays"] > 0]
ranked = table["worst_rank"].dropna()
worst = int(ranked.idxmin()) if len(ranked) else None  # holds the worst sample in the step range
default = (int(table.index[table["step"] == wanted][-1]) if wanted in set(table["step"])
           else worst if worst is not None  # as `replay show --step all --sort reward_outlier` ranks them
           else int(with_replays[-1]) if len(with_replays) else len(table) - 1)  # the latest batch that was replayed
st.caption("A frozen batch holds what the step's reward and train forward need to be recomputed bit for bit. "
           "The page opens on the run's worst sample (`rltrace replay show RUN --step all --sort reward_outlier`). "
           "Select a batch, then a sample: its reward outliers come first, the farthest from the batch's median first.")
picked = st.dataframe(
    table.assign(frozen=pd.to_datetime(table["frozen_ns"], unit="ns").dt.strftime("%H:%M:%S"))[
        ["step", "batch_id", "n_samples", "trigger", "reason", "train_version", "replays", "frozen"]],
    hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row", key="batches_table", placeholder="–",
    column_config={"train_version": st.column_config.NumberColumn("v_t"), "n_samples": st.column_config.NumberColumn("samples")},
)
at = picked.selection.rows[0] if picked.selection.rows else default
row = table.iloc[at]
step, batch_id = int(row["step"]), str(row["batch_id"])
try:
    frozen = data.batch(run, step, batch_id)
    replays = data.replays(run, step, batch_id)
except ReplayError as exc:
    st.error(fmt.md(exc))
    st.stop()

samples = frozen["samples"]
st.subheader(f"Step {step} · batch {fmt.md(batch_id)} · {len(samples)} samples")
flag_counts = pd.Series([f for names in samples["flag_names"] for f in names.split(", ") if f]).value_counts()
st.markdown(" ".join(f":red-badge[{fmt.md(name)}: {n}]" for name, n in flag_counts.items()) or ":green-badge[no bad-text flags]")
only_flagged = st.toggle("Only flagged samples", key="batches_flagged", persist_state="session", value=False)
view = samples[samples["flag_names"] != ""] if only_flagged else samples
columns = [c for c in ("sample_index", "sample_id", "group_id", "reward", "weight_version", "finish_reason", "prompt_len",
                       "response_len", "flag_names", "response_text") if c in view.columns]
chosen = st.dataframe(
    view[columns], hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
    key=f"batch_samples_{batch_id}_{only_flagged}",
    column_config={"flag_names": st.column_config.TextColumn("flags"), "weight_version": st.column_config.NumberColumn("v_s"),
                   "response_text": st.column_config.TextColumn("response", width="large")},
)
if view.empty:
    st.info("No sample of this batch is flagged.")
    st.stop()
flagged = np.flatnonzero(view["flag_names"].to_numpy() != "")
run_worst = np.flatnonzero(view["sample_index"].to_numpy() == row["worst_sample"]) if at == worst else []
sample = view.iloc[chosen.selection.rows[0] if chosen.selection.rows else
                   run_worst[0] if len(run_worst) else flagged[0] if len(flagged) else 0]
i = int(sample["sample_index"])

sample_id = sample.get("sample_id")
shown_id = sample_id if isinstance(sample_id, str) else None if fmt.missing(sample_id) else int(sample_id)  # ids may be text
st.markdown(f"#### Sample {i}" + ("" if shown_id is None else f" (id {fmt.md(str(shown_id))})"))
for name, reason in (sample["flags"] or {}).items():
    st.warning(f"**{fmt.md(name)}**: {fmt.md(reason)}", icon=":material/flag:")
left, right = st.columns(2)
left.markdown("**Prompt**")
left.code(sample.get("prompt_text") or "(no prompt text stored: freeze `prompt_text` to see it here)", language=None, wrap_lines=True)
right.markdown("**Response**")
right.code(sample.get("response_text") or "(no response text stored: freeze `response_text` to see it here)",
           language=None, wrap_lines=True)

tokens = frozen["tokens"]
rollout, train = (tokens.get(k, [None] * len(samples))[i] for k in ("rollout_log_probs", "train_log_probs"))
ids = tokens.get("response_tokens", [None] * len(samples))[i]
replayed = [(r["label"], r["log_probs"][i]) for r in replays if r["log_probs"] and r["log_probs"][i] is not None]
if rollout is not None and (train is not None or replayed):
    rows, labels = [], []
    for label, values in ([("train − rollout", train)] if train is not None else []) + [(f"{n} − rollout", v) for n, v in replayed]:
        m = min(len(values), len(rollout), MAX_STRIP_TOKENS)
        rows.append(np.asarray(values[:m], float) - np.asarray(rollout[:m], float))
        labels.append(label)
    width = max(len(r) for r in rows)
    z = np.full((len(rows), width), np.nan)
    for k, r in enumerate(rows):
        z[k, : len(r)] = np.abs(r)
    hover = np.array([[f"token {t}" + ("" if ids is None or t >= len(ids) else f" (id {ids[t]})") +
                       f" · rollout log q = {rollout[t]:.6g}" for t in range(width)] for _ in rows])
    mask = tokens.get("loss_mask", [None] * len(samples))[i]
    untrained = np.zeros(width, bool)
    if mask is not None:  # tool / environment tokens (loss mask 0): greyed, not part of the colour scale
        m = np.asarray(mask[:width], float)
        untrained[: len(m)] = m == 0
    grey = np.where(untrained, 1.0, np.nan)[None, :].repeat(len(rows), axis=0)
    z[:, untrained] = np.nan
    fig = go.Figure(([
        go.Heatmap(z=grey, y=labels, colorscale=[[0, "#d9d9d9"], [1, "#d9d9d9"]], showscale=False, xgap=1, ygap=4,
                   text=hover, hovertemplate="%{text}<br>loss mask 0: not trained, not compared<extra>%{y}</extra>",
                   name="loss mask 0"),
    ] if untrained.any() else []) + [
        go.Heatmap(z=z, y=labels, colorscale="Reds", zmin=0, text=hover, xgap=1, ygap=4,
                   hovertemplate="%{text}<br>|diff| = %{z:.3g}<extra>%{y}</extra>",  # text and y: escaped
                   colorbar={"title": {"text": "|Δ log p|", "side": "right"}, "thickness": 10,
                             "tickformat": ".1e", "len": 1.0}),
    ])
    fig.update_xaxes(title_text="response token")
    st.markdown("**Per-token log-prob difference** (darker = larger |log p − log q|"
                + ("; grey = loss mask 0, tool or environment tokens" if untrained.any() else "") + ")")
    st.plotly_chart(charts.base(fig, height=120 + 50 * len(rows)), key=f"strip_{batch_id}_{i}")
else:
    st.caption("Freeze `rollout_log_probs` and `train_log_probs` (per token) to see where the engines disagree.")

st.subheader("Replays")
if not replays:
    st.info(f"No replay of this batch yet: rltrace replay run {fmt.md(run.path)} \\-\\-step {step} \\-\\-entry module:function")
for r in replays:
    repeatable = r["repeatable"]
    verdict = ("repeated once" if repeatable is None else
               "repeatable: bit-identical repeats" if all(repeatable.values()) else
               "NOT repeatable: " + ", ".join(c for c, ok in repeatable.items() if not ok) + " differ between repeats")
    st.markdown(f"**{fmt.md(r['label'])}** · {fmt.md(r['entry'])} · {r['repeats']} repeat(s), "
                f"{fmt.seconds_text(float(np.mean(r['durations_s'])))} each · {verdict}")
    diffs = pd.DataFrame(r["diffs"])
    if len(diffs):
        st.dataframe(
            diffs[["a", "b", "samples", "tokens", "bitwise_equal", "samples_different", "mean_abs", "max_abs", "k3", "aligned"]],
            hide_index=True, width="stretch",
            column_config={"a": "recorded", "b": "replayed", "mean_abs": st.column_config.NumberColumn("mean |b − a|", format="%.3e"),
                           "max_abs": st.column_config.NumberColumn("max |b − a|", format="%.3e"),
                           "k3": st.column_config.NumberColumn("k3", format="%.3e"),
                           "aligned": st.column_config.CheckboxColumn("aligned (< 1e-6)")},
        )
