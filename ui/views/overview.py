"""Overview: what the run is, where its step time goes (the report's sentences and the async
cost model), whether it is healthy, and how the runs given to the dashboard compare."""

from __future__ import annotations

import datetime as dt
import time

import pandas as pd
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.ui import charts, data, edges, state

run = state.selected()
info = data.info(run)
steps = state.steps()
report = data.report(run, steps)

st.title(fmt.md(info["name"]))
span_text = "no steps yet" if steps is None else f"steps {steps[0]}–{steps[1]} of {info['first_step']}–{info['last_step']}"
live = data.is_live(info, time.time_ns())
status = ":red-badge[:material/circle: live]" if live else ":gray-badge[finished]"
now_ns = time.time_ns()
open_spans = data.open_spans_now(report, now_ns)
stuck = [o for o in open_spans if not o["in_progress"]]  # in progress: a live step's spans
if stuck:
    status += f" :orange-badge[:material/warning: {len(stuck)} open span(s)]"
created = dt.datetime.fromisoformat(info["created"]).strftime("%Y-%m-%d %H:%M UTC") if info["created"] else "?"
n_procs = len(info["processes"])
st.markdown(f"{status} &nbsp; {span_text} · {info['spans']:,} spans · {n_procs} process{'es' if n_procs != 1 else ''} · "
            f"created {created} · run id {fmt.md(info['run_id'])}")

findings = list(dict.fromkeys(report["findings"]))  # a metric logged both per step and per sample reads twice
if findings:
    st.info(fmt.md(findings[0]), icon=":material/bolt:")
    if len(findings) > 1:  # a box that only says nothing else stands out says nothing
        with st.container(border=True):
            st.markdown("**What stands out**")
            st.markdown("\n".join(f"- {fmt.md(f)}" for f in findings[1:]))

st.subheader("Cost model (median seconds per step)")
cols = st.columns(6)
speedup = report["async_speedup_bound"]
def term(key: str) -> str:
    return "not recorded" if report[key] is None else fmt.seconds_text(report[key])


every = report.get("amortised") or {}
cols[0].metric("t_R", term("t_R"), help="rollout + reward: union of rollout, generate and reward spans per step "
               "(own time: a stage nested in another counts once, for the innermost)"
               + (f"; runs every {every['t_R']} steps, spread over them" if "t_R" in every else ""))
cols[1].metric("t_T", term("t_T"), help="training: train, forward, backward, optimizer spans (own time)")
cols[2].metric("t_W", term("t_W"), help="weight sync spans; not recorded when the run has none")
cols[3].metric("t_sync", fmt.seconds_text(report["t_sync"]), help="t_R + t_T + t_W: one synchronous step")
cols[4].metric("Async bound", fmt.seconds_text(report["async_bound"]),
               delta=None if fmt.missing(speedup) else f"≤ {speedup:.2f}× faster", delta_color="off",
               help="max(t_R, t_T) + t_W: the optimistic bound for fully async training (after slime's "
                    "async analysis); terms not recorded are left out")
overlap = report["figures"]["achieved_speedup"]
achieved = overlap["value"]
cols[5].metric("Overlap", "not recorded" if fmt.missing(achieved) else f"{achieved:.2f}×",
               delta=None if fmt.missing(report["async"]["concurrent_s"]) else
               f"{fmt.seconds_text(report['async']['concurrent_s'])} concurrent", delta_color="off",
               help=f"{overlap['kind']}: stage time / time with any stage running: 1.00× when no two stages ever "
                    "ran at once")
with st.expander("What each figure rests on"):
    st.dataframe(pd.DataFrame([{"figure": k, "value": v["value"], "kind": v["kind"], "from": v["basis"],
                                "in words": data.kind_text(v)}
                               for k, v in report["figures"].items()]),
                 hide_index=True, width="stretch", key="overview_figures",
                 column_config={"value": st.column_config.NumberColumn("value", format="%.4g")})

per_step = pd.DataFrame(report["steps"])
left, right = st.columns([3, 2])
with left:
    st.markdown("**Step time by stage**")
    if per_step.empty:
        st.caption("No finished steps in this range.")
    else:
        st.plotly_chart(charts.stage_times(per_step, height=320), key="overview_stages")
with right:
    st.markdown("**Reward**")
    reward = pd.DataFrame(report["reward"]["per_step"])
    if reward.empty:
        st.caption("No reward logged (rltrace.log_metrics(step, reward_mean=...); TRL's `reward`, verl's "
                   "`critic/rewards/mean` and slime's `rollout/raw_reward` count too).")
    else:
        st.plotly_chart(charts.metric_lines({info["name"]: reward}, title="", y="reward_mean", height=320),
                        key="overview_reward")

st.subheader("Health")
h = st.columns(3)
h[0].metric("Open spans", len(stuck), help="started and never ended: hung, or the process was killed (not counted: "
            "spans of a live process within the hang limit of `rltrace watch`, work in progress)")
h[1].metric("Dropped spans", report["dropped"]["spans"], help="lost before reaching the store (full queue, failed write)")
h[2].metric("Dropped rows", report["dropped"]["rows"], help="metric and sample rows lost before the store")
for i, edge in enumerate(report.get("blocking") or []):  # who waits on whom, from the processes' own stacks
    edges.show(edge, key=f"overview_edge_{i}")
if report["open_spans"]:
    hangs = pd.DataFrame(open_spans)
    hangs["who"] = [fmt.process_name(r, k) for r, k in zip(hangs["role"], hangs["rank"])]
    st.markdown("**Open spans** — select one to see it on the Timeline")
    picked = st.dataframe(
        hangs[["who", "phase", "name", "step", "state", "in_progress", "open_s", "ended_cleanly", "span_id"]],
        hide_index=True,
        on_select="rerun", selection_mode="single-row", key="overview_hangs", width="stretch",
        column_config={"open_s": st.column_config.NumberColumn("open for (s)", format="%.3f",
                                                               help="until its process exited or crashed; killed: "
                                                                    "until its last heartbeat or span end (at least); "
                                                                    "running: until the report"),
                       "state": st.column_config.TextColumn("state", help="crashed: its process died of an uncaught "
                                                            "exception; killed: it stopped without one; running: still "
                                                            "alive (hung, or still going); exited: it shut down"),
                       "in_progress": st.column_config.CheckboxColumn("in progress", help="its process is alive and "
                                                                      "it is within the hang limit of rltrace watch"),
                       "ended_cleanly": st.column_config.CheckboxColumn("process shut down")},
    )
    if picked.selection.rows:
        row = hangs.iloc[picked.selection.rows[0]]
        if not fmt.missing(row["step"]):
            state.open_timeline(int(row["step"]), row["span_id"])

alerts = data.alerts(run)
if len(alerts):
    alerts["who"] = [fmt.process_name(r, k) for r, k in zip(alerts["role"], alerts["rank"])]
    st.markdown(f"**Alerts** ({len(alerts)}) — `rltrace watch`'s rules with their default limits, and what it raised")
    st.dataframe(alerts[["when", "rule", "who", "phase", "step", "seconds", "message", "profile_id"]], hide_index=True,
                 width="stretch", key="overview_alerts",
                 column_config={"seconds": st.column_config.NumberColumn("how long (s)", format="%.1f")})

procs = info["processes"].copy()
if not procs.empty:
    now = time.time_ns()
    procs["who"] = [fmt.process_name(r, k) for r, k in zip(procs["role"], procs["rank"])]
    procs["last heard"] = ["-" if pd.isna(v) else f"{fmt.seconds_text(round((now - v) / 1e9))} ago" for v in procs["heartbeat_ns"]]
    procs["state"] = data.process_states_now(info, now)
    st.markdown("**Processes**")
    st.dataframe(procs[["who", "host", "pid", "spans", "open_spans", "spans_dropped", "rows_written", "rows_dropped",
                        "last heard", "state", "process_id"]], hide_index=True, width="stretch", key="overview_processes",
                 column_config={"spans": st.column_config.NumberColumn("spans", help="finished spans in the store"),
                                "open_spans": st.column_config.NumberColumn("open"),
                                "state": st.column_config.TextColumn("state", help="crashed, ended (shut down), "
                                                                     "killed (silent for over 30 s, or its writer "
                                                                     "lock freed) or running, as rltrace info says")})

refs = state.runs()
if len(refs) > 1:
    st.subheader("All runs")
    rows = []
    for ref in refs:
        i, r = data.info(ref), data.report(ref, None)
        rows.append({"run": i["name"], "steps": i["steps"], "t_R (s)": r["t_R"], "t_T (s)": r["t_T"],
                     "t_W (s)": r["t_W"], "t_sync (s)": r["t_sync"], "async bound (s)": r["async_bound"],
                     "step period (s)": r["async"]["period_s"], "reward (last)": r["reward"]["last"],
                     "open spans": sum(not o["in_progress"] for o in data.open_spans_now(r, now_ns)),
                     "path": i["path"]})
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(c, format="%.4g") for c in
                                ("t_R (s)", "t_T (s)", "t_W (s)", "t_sync (s)", "async bound (s)", "step period (s)",
                                 "reward (last)")})

with st.expander("Run configuration (run.json)"):
    st.caption(fmt.md(info["path"]))
    st.json(info["config"], expanded=True)
