"""Metrics: any scalar the loop logged with `rltrace.log_metrics` (your `loss`, a learning rate, a
KL), over steps, several runs overlaid, with smoothing: what people open TensorBoard or W&B for."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.ui import charts, data, state

run = state.selected()
st.title("Metrics")
refs = state.runs()
labels = {r.path: data.info(r)["name"] for r in refs}
frames = {r.path: data.scalars(r) for r in refs}
names = sorted({n for f in frames.values() for n in f["name"].unique()})
if not names:
    st.info("No scalars in this run: `rltrace.log_metrics(step, loss=..., lr=...)` in the loop fills this page.")
    st.stop()
default = [run.path] + ([state.comparison().path] if state.comparison() else [])
if not set(st.session_state.get("metrics_runs") or [None]) <= set(labels):
    st.session_state["metrics_runs"] = default
chosen = st.multiselect("Runs", list(labels), key="metrics_runs", format_func=labels.get, persist_state="session",
                        help="overlay these runs")
picked = st.multiselect("Scalars", names, default=names[: min(4, len(names))], key="metrics_names",
                        help="any name logged with rltrace.log_metrics")
smooth = st.slider("Smoothing (exponential moving average)", 0.0, 0.99, 0.0, 0.01, key="metrics_smooth",
                   help="0: the values as logged; closer to 1: smoother (as TensorBoard's slider)")
steps = state.steps()
for name in picked:
    fig = go.Figure()
    for path in chosen or [run.path]:
        f = frames[path]
        f = f[f["name"] == name]
        if steps is not None and len(chosen or [run.path]) == 1:
            f = f[f["step"].between(*steps)]
        if f.empty:
            continue
        values = f["value"].ewm(alpha=1 - smooth).mean() if smooth > 0 else f["value"]
        fig.add_scatter(x=f["step"], y=values, mode="lines" if len(f) > 1 else "markers", name=html.escape(labels[path]))
    st.plotly_chart(charts.base(fig, height=280, title=html.escape(name), x="step", y=html.escape(name)), key=f"metric_{name}")
latest = pd.concat([frames[p].assign(run=labels[p]) for p in (chosen or [run.path])], ignore_index=True)
latest = latest[latest["name"].isin(picked)].sort_values("step").groupby(["run", "name"]).tail(1)
st.dataframe(latest[["run", "name", "step", "value"]].rename(columns={"step": "last step", "value": "last value"}),
             hide_index=True, width="stretch")
