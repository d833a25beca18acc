"""Reward & mismatch: reward, train/rollout log-prob mismatch, TIS and staleness over steps, several
runs overlaid; per-sample scatter with drill-down to one sample."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.report import findings
from rltrace.ui import charts, data, state

MAX_POINTS = 20_000  # samples drawn in the scatter (latest steps first)
PANELS = [  # (metric, title, y label, log axis)
    ("train_rollout_logprob_abs_diff", "train_rollout_logprob_abs_diff", "mean |log p − log q|", True),
    ("mismatch_k3", "mismatch_k3", "k3 estimate of KL(q‖p)", True),
    ("tis_mean", "tis_mean", "mean importance weight", False),
    ("tis_clipfrac", "tis_clipfrac", "fraction clipped", False),
]

run = state.selected()
steps = state.steps()
st.title("Reward & mismatch")
refs = state.runs()
labels = {r.path: data.info(r)["name"] for r in refs}
default = [run.path] + ([state.comparison().path] if state.comparison() else [])
if not set(st.session_state.get("reward_runs") or [None]) <= set(labels):
    st.session_state["reward_runs"] = default
chosen = st.multiselect("Runs", list(labels), key="reward_runs", format_func=labels.get, persist_state="session",
                        help="overlay these runs (all steps of each)")
chosen_refs = [state.ref(p) for p in chosen] or [run]
overlay = len(chosen_refs) > 1
rng = None if overlay else steps  # overlaid runs share no step range: show each run whole
st.caption("Throughput alone is not the goal: watch reward and mismatch move together. "
           + ("Overlaid runs are shown over all their steps." if overlay else f"Steps {steps[0]}–{steps[1]}." if steps else ""))


reward, reward_std, mism, stale, trends = {}, {}, {}, {}, []
for ref in chosen_refs:
    label = labels[ref.path]
    r = data.report(ref, rng)
    reward[label] = data.table(r["reward"], "per_step", ["step", "value"])
    scalars = data.table(r, "metrics", ["step", "name", "value"])
    reward_std[label] = scalars.loc[scalars["name"] == "reward_std", ["step", "value"]]
    values = data.table(r["mismatch"], "per_step", ["step", "metric", "value", "source"])
    for t in r["mismatch"]["trends"]:  # one series per metric: its leading computation, the others compared in its name
        mine = values[(values["metric"] == t["metric"]) & (values["source"] == t["source"])]
        mism.setdefault(t["metric"], {})[f"{label}{fmt.mismatch_label(t)}"] = mine[["step", "value"]]
        trends.append(t | {"run": label, "computed": fmt.mismatch_label(t).strip(" ()") or "logged"})
    stale[label] = data.table(r["staleness"], "per_step", ["step", "mean", "max"])

for ref in chosen_refs:  # why mismatch is missing, said whether or not anything else is logged
    for sentence in findings.mismatch_missing_sentences(data.report(ref, rng)):
        st.warning(fmt.md((f"{labels[ref.path]}: " if overlay else "") + sentence))

if (not any(len(f) for f in [*reward.values(), *stale.values()]) and not any(len(f) for m in mism.values() for f in m.values())
        and (steps is None or data.samples(run, steps[0], steps[1], MAX_POINTS).empty) and data.batch_mismatch(run, steps).empty):
    st.info("Nothing logged for this page yet: `rltrace.log_metrics(step, reward_mean=...)` draws the reward, and "
            "`rltrace.log_samples(step, rows)` with `reward`, `weight_version` and log-probs the samples, staleness and mismatch.")
    st.stop()

left, right = st.columns(2)
with left:
    if any(len(f) for f in reward.values()):
        st.plotly_chart(charts.metric_lines(reward, title="reward_mean (band: ± reward_std)", y="reward", band=reward_std),
                        key="reward_reward")
    else:
        st.info("No `reward_mean` logged: `rltrace.log_metrics(step, reward_mean=...)`.")
with right:
    if any(len(s) for s in stale.values()):
        frames = {f"{k} mean": s.rename(columns={"mean": "value"})[["step", "value"]] for k, s in stale.items()}
        frames |= {f"{k} max": s.rename(columns={"max": "value"})[["step", "value"]] for k, s in stale.items()}
        st.plotly_chart(charts.metric_lines(frames, title="staleness (v_t − v_s, weight versions)", y="versions"),
                        key="reward_staleness")
    else:
        st.info("No staleness: log `weight_version` and `train_version` per sample, or `staleness_mean`.")

cols = st.columns(2)
for i, (metric, title, unit, log) in enumerate(PANELS):
    frames = mism.get(metric, {})
    with cols[i % 2]:
        if any(len(f) for f in frames.values()):
            st.plotly_chart(charts.metric_lines(frames, title=title, y=unit, log=log), key=f"reward_{metric}")
        else:
            st.caption(f"`{metric}` not recorded.")

if trends:
    with st.expander("Trends (first, last, mean, max, slope per step)"):
        st.caption("One row per quantity: when a metric is both logged and computed from frozen batches or samples, "
                   "the row shows the logged one and says whether the other computations agree.")
        st.dataframe(pd.DataFrame(trends)[["run", "metric", "computed", "steps", "first", "last", "mean", "max",
                                           "slope_per_step"]],
                     hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(c, format="%.4g")
                                    for c in ("first", "last", "mean", "max", "slope_per_step")})

per_rollout = data.table(data.report(run, rng), "rollout")
if len(per_rollout) and len(per_rollout.columns) > 2:
    with st.expander(f"Rollout numbers of {fmt.md(labels[run.path])} per step, from its samples", expanded=True):
        shown = per_rollout.copy()
        if "pass_at_k" in shown:
            ks = sorted({k for d in shown["pass_at_k"] if isinstance(d, dict) for k in d}, key=int)
            for k in ks:
                shown[f"pass@{k}"] = [d.get(k) if isinstance(d, dict) else None for d in shown["pass_at_k"]]
            shown = shown.drop(columns=["pass_at_k"])
        if "zero_std" in shown:
            shown["zero_std"] = [", ".join(f"{k}: {v}" for k, v in d.items()) if isinstance(d, dict) else "" for d in shown["zero_std"]]
        st.dataframe(shown, hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(c, format="%.4g")
                                    for c in shown.columns if c != "step" and shown[c].dtype.kind == "f"})
        st.caption("Response lengths count trained tokens (loss mask 1); pass@k counts a reward of 1 as a pass; "
                   "engine columns summarise the engine's per-request numbers. See docs/analysis.md.")
per_sample = data.batch_mismatch(run, steps)
if len(per_sample):
    with st.expander(f"Per-sample mismatch from frozen batches ({len(per_sample):,} samples)"):
        st.caption("Computed from the rollout and train log-probs each frozen or imported batch holds, over "
                   "loss-masked tokens; a step's value is the mean over its samples (as slime reports it).")
        metric = st.selectbox("metric", [p[0] for p in PANELS], key="batch_mismatch_metric", persist_state="session")
        fig = px.strip(per_sample.assign(step=per_sample["step"].astype(str)), x="step", y=metric,
                       hover_data=["batch_id", "sample_index", "tokens"])
        st.plotly_chart(charts.base(fig, height=320, x="step", y=metric), key=f"batch_mismatch-{metric}")

st.subheader(f"Samples of {fmt.md(labels[run.path])}")
if steps is None:
    st.info("No steps yet.")
    st.stop()
samples = data.samples(run, steps[0], steps[1], MAX_POINTS)
if samples.empty:
    st.info("No per-sample rows in these steps: `rltrace.log_samples(step, rows)` records them.")
    st.stop()
numeric = [c for c in samples.columns if pd.api.types.is_numeric_dtype(samples[c])
           and c not in ("logged_ns", "pid", "rank", "gen_start", "gen_end") and samples[c].notna().any()]
mismatch_cols = [c for c in numeric if any(word in c for word in ("logprob", "mismatch", "k3", "tis"))]
x_default = "response_len" if "response_len" in numeric else numeric[0]
y_default = mismatch_cols[0] if mismatch_cols else ("reward" if "reward" in numeric else numeric[-1])
c1, c2, c3 = st.columns(3)
x = c1.selectbox("x", numeric, index=numeric.index(x_default), key="samples_x", persist_state="session")
y = c2.selectbox("y", numeric, index=numeric.index(y_default), key="samples_y", persist_state="session")
color_options = [c for c in ("staleness", "reward", "finish_reason", "step") if c in samples.columns]
telling = [c for c in color_options if samples[c].nunique() > 1]  # a colour that varies says something
state.choose("samples_color", color_options, (telling or color_options or [None])[0])
color = c3.selectbox("colour", color_options, key="samples_color", persist_state="session") if color_options else None
if len(samples) == MAX_POINTS:
    st.caption(f"The latest {MAX_POINTS:,} samples of the range.")
points = samples.reset_index(names="row")
if color and points[color].nunique() <= 1:
    color = None  # one value: a colour says nothing
if color and points[color].nunique() <= 12:
    points[color] = points[color].astype(str)  # few values: one colour each, not a scale
fig = px.scatter(points, x=x, y=y, color=color, custom_data=["row"],
                 hover_data={c: True for c in ("step", "sample_id", "reward", "response_len") if c in samples.columns},
                 color_continuous_scale="Viridis", opacity=0.75)
fig.update_traces(marker={"size": 7})
event = st.plotly_chart(charts.base(fig, height=380, x=x, y=y), key=f"samples-{run.version}-{x}-{y}-{color}",
                        on_select="rerun", selection_mode="points")
picked = event.selection.points if event and event.selection else []
rows = [p["customdata"][0] for p in picked if p.get("customdata")]
st.caption("Click a point for the whole sample.")
if rows:
    sample = samples.iloc[int(rows[0])]
    st.markdown(f"#### Sample {fmt.md(sample.get('sample_id'))} of step {fmt.md(sample['step'])}")
    st.dataframe(pd.DataFrame({"column": sample.index, "value": [str(v) for v in sample.values]}),
                 hide_index=True, width="stretch")
    if data.info(run)["batches"]:
        if st.button("Look for it in the frozen batches", icon=":material/data_table:"):
            st.session_state["batches_step"] = int(sample["step"])
            st.switch_page(state.PAGES["batches"])
    if not fmt.missing(sample["step"]) and st.button("Open its step on the Timeline", icon=":material/view_timeline:"):
        state.open_timeline(int(sample["step"]))
