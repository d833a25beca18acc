"""Timeline: every span of a step (or a few) across processes, coloured by phase; pick a span to
see its attributes and the profiles attached to it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.ui import charts, data, edges, gantt, state

MAX_SPAN_CHOICES = 300  # longest spans offered in the span picker
DEFAULT_RECENT = 20  # the default step is the slowest of this many latest steps

run = state.selected()
info = data.info(run)
steps = state.steps()
st.title("Timeline")
if steps is None:
    st.info("This run has no spans with a step yet. Phases recorded with `rltrace.phase(..., step=N)` appear here.")
    st.stop()

report = data.report(run, steps)
walls = data.table(report, "steps", ["step", "start_ns", "end_ns", "wall_s"])
hung = data.table(report, "open_spans", ["span_id", "step", "name", "role", "rank", "start_ns", "open_s", "state"])
hung = hung[hung["step"].between(*steps)]
choices = sorted(set(walls["step"].astype(int)) | set(hung["step"].dropna().astype(int)))
if not choices:
    st.info(f"No spans in steps {steps[0]}–{steps[1]}; widen the step range in the sidebar.")
    st.stop()
wall_of = dict(zip(walls["step"], walls["wall_s"]))
recent = walls.tail(DEFAULT_RECENT)
slowest = int(recent.loc[recent["wall_s"].idxmax(), "step"]) if len(recent) else choices[-1]
state.choose(state.TIMELINE_STEP, choices, slowest)


def _step_label(s: int) -> str:
    text = f"step {s} · {fmt.seconds_text(wall_of[s])}" if s in wall_of else f"step {s} · open spans only"
    return text + ("  (slowest recent)" if s == slowest else "")


left, mid, right = st.columns([3, 2, 2], vertical_alignment="bottom")
step = left.selectbox(
    "Step", choices, key=state.TIMELINE_STEP, persist_state="session",
    format_func=_step_label,
    help=f"defaults to the slowest of the last {DEFAULT_RECENT} steps in the sidebar's range",
)
count = mid.number_input("Steps shown", 1, data.TIMELINE_MAX_STEPS, 1, key="timeline_count", persist_state="session",
                         help="show this step and the next ones together")
last = min(step + int(count) - 1, steps[1])
shown = (step, last)
right.download_button(
    "Chrome trace (Perfetto)", data=lambda: data.chrome_trace(run, shown), icon=":material/download:",
    file_name=f"{info['name']}-steps-{step}-{last}.json", mime="application/json",
    help="the spans of these steps in Trace Event Format: open in ui.perfetto.dev or chrome://tracing",
)

spans = data.timeline(run, step, last)
per_sample = data.sample_timeline(run, step, last)
if len(per_sample):  # spans that name their sample (slime traces, phase(..., sample_id=...)): a lane per sample
    a, b = st.columns([2, 3])
    rows_by = a.radio("Rows", ["one per sample", "one per process"], horizontal=True, key="timeline_rows",
                      persist_state="session", help="samples are grouped by their group (its own span on top)")
    order = b.radio("Sort samples by", list(gantt.SAMPLE_ORDERS), horizontal=True, key="timeline_sample_order",
                    persist_state="session", disabled=rows_by != "one per sample",
                    help="group: by id; duration: longest first; reward: highest first (groups too)")
    if rows_by == "one per sample":
        spans = gantt.sample_lanes(spans, per_sample, order)
path = data.critical_path(run, shown)
critical = set(path["span_id"].dropna())
flt = st.text_input("Filter", key="timeline_filter", persist_state="session", placeholder="only spans whose name, phase or process contains…")
if flt:
    hay = spans["name"].fillna("") + " " + spans["phase"].fillna("") + " " + spans["role"].fillna("")
    spans = spans[hay.str.contains(flt, case=False, regex=False)]

span_label = f"step {step}" if last == step else f"steps {step}–{last}"
waits = data.table(report, "waits", ["step", "seconds", "text"])
waits = waits[waits["step"].between(step, last)]
waited = data.table(report, "waits_by_step", ["step", "seconds"])
waited = waited[waited["step"].between(step, last)]  # every wait of the steps shown, not only the longest
m = st.columns(5)
m[0].metric("Wall time", fmt.seconds_text(walls.loc[walls["step"].between(step, last), "wall_s"].sum()),
            help="first span start to last span end, summed over the steps shown")
m[1].metric("Spans", f"{len(spans):,}")
m[2].metric("Processes", spans["process_id"].nunique())
m[3].metric("Open spans", int((spans["is_open"].astype(bool) | spans["span_id"].isin(hung["span_id"])).sum()),
            help="started and never ended (running, hung or killed), or ended only when their process exited")
m[4].metric("Waiting", fmt.seconds_text(waited["seconds"].sum()) if len(waited) else "0 s",
            help="every wait of the steps shown, summed over processes (idle time and wait spans, see Waiting stages)")

open_until = dict(zip(hung["span_id"], hung["start_ns"] + (hung["open_s"] * 1e9).astype("int64")))
laid, left_out = gantt.layout(spans, keep=critical, open_until=open_until)
t0 = int(spans["start_ns"].min()) if len(spans) else 0
starts = {int(s): (int(walls.loc[walls["step"] == s, "start_ns"].iloc[0]) - t0) / 1e9
          for s in range(step, last + 1) if s in wall_of} if last > step else None
selected = st.session_state.get(state.TIMELINE_SPAN)
st.subheader(f"{fmt.md(info['name'])} · {span_label}")
st.caption("Bars are spans, coloured by phase; hatched grey = `wait` spans, red cross-hatch = open spans "
           "(started, never ended), thick outline = the critical path. Click a bar to inspect it; drag to zoom.")
for text in waits["text"]:  # the report's own sentences
    st.markdown(f"- :orange[:material/hourglass_top:] {fmt.md(text)}")
for _, h in hung[hung["step"].between(step, last)].iterrows():
    st.markdown(f"- :red[:material/warning:] **{fmt.md(h['name'])}** on {fmt.md(fmt.process_name(h['role'], h['rank']))} started and never ended "
                f"({fmt.md(data.open_text(h.to_dict()))})")
if left_out:
    st.caption(f"Showing the {len(laid):,} longest spans; {left_out:,} shorter ones are left out to keep the chart fast.")
event = st.plotly_chart(gantt.figure(laid, critical=critical, selected=selected, step_starts=starts),
                        key=f"gantt-{run.version}-{step}-{last}-{flt}", on_select="rerun", selection_mode="points")
if len(laid):
    end_ns = t0 + int(float(laid["x1_s"].max()) * 1e9)
    usage = data.resource_samples(run, t0, end_ns)
    if len(usage):
        st.caption("Utilisation under the spans (sampled with `init(resources=True)`): each process's CPU "
                   "(100 % = one core) and the GPUs it uses (share of time busy).")
        st.plotly_chart(charts.utilisation_lanes(usage, t0, (0.0, float(laid["x1_s"].max()))),
                        key=f"lanes-{run.version}-{step}-{last}")
points = event.selection.points if event and event.selection else []
clicked = next((p["customdata"][0] for p in points if p.get("customdata")), None)
if clicked and clicked != st.session_state.get("_timeline_clicked"):
    st.session_state["_timeline_clicked"] = clicked
    st.session_state[state.TIMELINE_SPAN] = clicked
    st.rerun()

longest = spans.sort_values("duration_s", ascending=False, na_position="first").head(MAX_SPAN_CHOICES)
options = [state.NO_SPAN] + longest["span_id"].tolist()
if selected and selected not in options and selected in set(spans["span_id"]):
    options.append(selected)
state.choose(state.TIMELINE_SPAN, options, state.NO_SPAN)
by_id = spans.drop_duplicates("span_id").set_index("span_id")


def _describe(span_id) -> str:
    if span_id == state.NO_SPAN:
        return "— pick a span (or click one above) —"
    r = by_id.loc[span_id]
    length = "open" if r["is_open"] else fmt.seconds_text(r["duration_s"])
    return f"{r['name']} · {fmt.process_name(r['role'], r['rank'])} · step {r['step']} · {length}"


span_id = st.selectbox("Span", options, key=state.TIMELINE_SPAN, format_func=_describe, persist_state="session",
                       help="the longest spans first")
if span_id != state.NO_SPAN:
    detail = data.span(run, span_id)
    if detail is None:
        st.warning("That span is not in this snapshot of the run.")
    else:
        a, b = st.columns([2, 3])
        with a:
            st.markdown(f"#### {fmt.md(detail['name'])}")
            facts = {
                "phase": detail["phase"], "step": detail["step"], "weight version": detail["weight_version"],
                "process": f"{fmt.process_name(detail['role'], detail['rank'])} on {detail['host']} (pid {detail['pid']})",
                "thread": detail["thread_name"], "duration": "open (never ended)" if detail["is_open"] else fmt.seconds_text(detail["duration_s"]),
                "status": detail["status"] + (f": {detail['status_message']}" if detail["status_message"] else ""),
                "span id": detail["span_id"], "trace id": detail["trace_id"], "parent": detail["parent_span_id"] or "—",
            }
            st.dataframe(pd.DataFrame({"": list(facts), "value": [str(v) for v in facts.values()]}),
                         hide_index=True, width="stretch")
            if span_id in critical:
                st.caption(":material/route: on the critical path of its step")
            edge = edges.of_span(report, span_id)
            if edge is not None:  # the process's own stack says what this open span waits on
                edges.show(edge, key="timeline_edge")
        with b:
            st.markdown("#### Attributes")
            if detail["attributes"]:
                st.json(detail["attributes"], expanded=True)
            else:
                st.caption("No attributes beyond phase, step and weight version.")
            if detail["events"]:
                st.markdown("#### Events")
                st.json(detail["events"], expanded=False)
            profiles = detail["profiles"]
            st.markdown("#### Profiles")
            if len(profiles):
                st.dataframe(profiles, hide_index=True, width="stretch")
                if st.button("Open in Profiles", icon=":material/local_fire_department:"):
                    st.session_state["profiles_span"] = span_id
                    st.switch_page(state.PAGES["profiles"])
            else:
                st.caption("No profile is attached to this span.")

if len(path):
    with st.expander(f"Critical path ({len(path)} spans)", expanded=False):
        st.dataframe(
            path.assign(who=[fmt.process_name(r, k) for r, k in zip(path["role"], path["rank"])])[
                ["step", "seq", "phase", "name", "who", "seconds", "gap_before_s", "ended_by"]],
            hide_index=True, width="stretch",
            column_config={"seconds": st.column_config.NumberColumn("seconds", format="%.4f"),
                           "gap_before_s": st.column_config.NumberColumn("gap before (s)", format="%.4f")},
        )
