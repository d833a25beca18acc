"""Waiting stages: per step, where the time goes and who waits for whom; the critical path; the
rollout long tail and its stragglers; what a weight sync costs per byte."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.ui import charts, data, state, style

run = state.selected()
steps = state.steps()
st.title("Waiting stages")
if steps is None:
    st.info("This run has no steps yet.")
    st.stop()

report = data.report(run, steps)
costs = data.table(report, "steps")
overlap = report["async"]
st.caption(f"Steps {steps[0]}–{steps[1]}. Stage times are unions of each stage's spans across processes; "
           "waits are time a process spent idle or inside `wait` spans, attributed to what ran elsewhere meanwhile.")

st.subheader("Step time by stage")
if costs.empty:
    st.info("No finished steps in this range.")
else:
    st.plotly_chart(charts.stage_times(costs), key="waits_stages")
    if overlap.get("overlapping"):
        st.caption(f"Stages ran at once for {fmt.seconds_text(overlap['concurrent_s'])} of {fmt.seconds_text(overlap['stage_s'])} "
                   f"of stage time ({overlap['achieved_speedup']:.2f}× measured overlap), so stacked stage times exceed "
                   "the time a step really adds.")

st.subheader("Who waits for what")
waits = data.table(report, "waits_by_step")
if waits.empty:
    st.info("No waiting recorded: every process was busy throughout each step's window.")
else:
    st.plotly_chart(charts.waits_by_step(waits), key="waits_by_step")
    top = data.table(report, "waits")
    worst = top.sort_values("seconds", ascending=False).head(10).reset_index(drop=True)
    st.markdown("**Longest waits** — select one to open its step on the Timeline")
    picked = st.dataframe(
        worst.rename(columns={"text": "wait"})[["step", "wait", "seconds", "share"]],
        hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row", key="waits_top",
        column_config={"wait": st.column_config.TextColumn("who waited, for what", width="large"),
                       "seconds": st.column_config.NumberColumn("seconds", format="%.4f"),
                       "share": st.column_config.ProgressColumn("share of step", format="percent", min_value=0, max_value=1)},
    )
    if picked.selection.rows:
        state.open_timeline(int(worst.iloc[picked.selection.rows[0]]["step"]))

st.subheader("Critical path")
paths = data.table(report, "critical_path")
if paths.empty:
    st.info("No critical path: the steps have no busy spans.")
else:
    st.dataframe(paths, hide_index=True, width="stretch",
                 column_config={"path": st.column_config.TextColumn("chain of phases that set the step's length", width="large"),
                                "share": st.column_config.ProgressColumn("share of steps", format="percent", min_value=0, max_value=1),
                                "seconds": st.column_config.NumberColumn("median seconds", format="%.4f")})
    slow = costs.sort_values("wall_s", ascending=False).head(1)
    if len(slow):
        s = int(slow["step"].iloc[0])
        chain = data.critical_path(run, (s, s))
        st.markdown(f"**Slowest step ({s}, {fmt.seconds_text(slow['wall_s'].iloc[0])})**: " + " → ".join(
            fmt.md(f"{p} on {fmt.process_name(r, k)}") + f" ({fmt.seconds_text(sec)})"
            for p, r, k, sec in zip(chain["phase"], chain["role"], chain["rank"], chain["seconds"])))
        if st.button(f"Open step {s} on the Timeline", icon=":material/view_timeline:"):
            state.open_timeline(s)

st.subheader("Rollout long tail")
tail = data.table(report, "long_tail", ["step", "tail_s", "tail_share"])
tail = tail[tail["tail_s"].notna()]
if tail.empty:
    st.info("No per-sample generation times: log `gen_start` and `gen_end` with rltrace.log_samples to see the tail.")
else:
    st.plotly_chart(charts.tail(tail), key="waits_tail")
    strag = data.table(report, "stragglers")
    if len(strag):
        st.markdown(f"**Stragglers** ({len(strag)}: finished after the median and took ≥ 2× its time or length)")
        st.dataframe(strag, hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(c, format="%.3g")
                                    for c in ("len_ratio", "gen_s", "time_ratio", "after_median_s")})

st.subheader("Weight sync: t_W ≈ S_W / B_W + t_0")
points, fit = data.table(report, "weight_sync_points"), report["weight_sync_fit"]
if report.get("t_W") is None:
    st.info("No weight sync recorded: nothing to fit (a run that generates with the trained module itself has none).")
elif points.empty:
    st.info("No `weight_sync` span carries a payload size: record it with `rltrace.phase('weight_sync', bytes=n)`.")
else:
    left, right = st.columns([3, 1])
    left.plotly_chart(charts.sync_fit(points, fit), key="waits_sync")
    with right:
        st.metric("B_W", fmt.rate_text(fit.get("B_W")), help="fitted bandwidth")
        st.metric("t_0", fmt.seconds_text(fit.get("t_0")), help="fitted fixed overhead per sync ('-': not separable "
                  "from the payload's time)")
        st.metric("R²", fmt.number_text(fit.get("r2")))
        st.metric("Syncs", f"{fit['n']} ({style.plural(fit['sizes'], 'size')})")
        st.caption(f"B_W: {fmt.md(data.kind_text(report['figures']['B_W']))}. "
                   f"t_0: {fmt.md(data.kind_text(report['figures']['t_0']))}.")
        if fit.get("regime") == "latency":
            st.caption("Sync time does not grow with payload over the sizes seen: latency-bound, t_0 is the mean time.")
        elif not fit.get("B_W") and fit.get("effective_B_W"):
            st.caption(f"One payload size: effective {fmt.rate_text(fit['effective_B_W'])}. B_W and t_0 need several sizes.")
        if fit.get("set_aside"):
            stalls = fit["set_aside"]
            st.caption(f"{len(stalls)} stalled sync(s) set aside from the fit (steps "
                       + ", ".join(str(x["step"]) for x in stalls[:5]) + (", ..." if len(stalls) > 5 else "") + ").")
        if fit.get("methods"):
            st.caption("methods: " + ", ".join(fit["methods"]))

with st.expander("Per-step numbers"):
    st.dataframe(pd.DataFrame(costs), hide_index=True, width="stretch")
