"""Profiles: the py-spy and torch.profiler captures attached to slow or hung spans, their hottest
frames, the span each explains, and the artefact to download."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from rltrace import profiling
from rltrace.analysis import _format as fmt
from rltrace.ui import charts, data, state

run = state.selected()
info = data.info(run)
st.title("Profiles")
if not info["profiles"]:
    st.info("No profiles in this run — see docs/profiling.md to capture py-spy or torch.profiler on slow phases "
            "(e.g. `RLTRACE_PROFILE_SLOW=3` or `rltrace.init(..., profile={'after': {'reward': 2}})`).")
    st.stop()

table = data.profiles(run)
steps = state.steps()
if steps is not None:
    table = table[table["step"].isna() | table["step"].between(*steps)].reset_index(drop=True)
st.caption("Each profile explains one span: a phase that ran slow (py-spy record), stayed open (py-spy dump of the "
           "process and its children) or fell in a torch.profiler window.")
m = st.columns(4)
m[0].metric("Profiles", len(table))
m[1].metric("py-spy recordings", int((table["kind"] == "pyspy_record").sum()))
m[2].metric("Stack dumps", int((table["kind"] == "pyspy_dump").sum()))
m[3].metric("Not usable", int((~table["status"].isin(["ok", "running"])).sum()),
            help="no samples, py-spy missing, permission denied or failed: the status says which")
if table.empty:
    st.info("No profile in the sidebar's step range.")
    st.stop()

table["who"] = [fmt.process_name(r, k) for r, k in zip(table["role"], table["rank"])]
wanted = st.session_state.pop("profiles_span", None)  # sent here from the Timeline
usable = table.index[table["status"] == "ok"]
first = (table.index[table["span_id"] == wanted][0] if wanted in set(table["span_id"])
         else usable[0] if len(usable) else 0)  # the first profile with frames
shown = table[["step", "phase", "who", "kind", "trigger", "status", "top_frame", "top_self_share", "reason", "size_bytes"]]
picked = st.dataframe(
    shown, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row", key="profiles_table",
    placeholder="–",
    column_config={"top_frame": st.column_config.TextColumn("hottest frame", width="medium"),
                   "top_self_share": st.column_config.ProgressColumn("its self share", format="percent", min_value=0, max_value=1),
                   "reason": st.column_config.TextColumn("why it was taken", width="large"),
                   "size_bytes": st.column_config.NumberColumn("file bytes", format="%d")},
)
row = table.iloc[picked.selection.rows[0] if picked.selection.rows else first]

st.subheader(fmt.md(f"{row['kind']} of {row['phase']} (step {'?' if fmt.missing(row['step']) else int(row['step'])}) on {row['who']}"))
st.markdown(f":gray-badge[{fmt.md(row['trigger'])}] :{'green' if row['status'] == 'ok' else 'orange'}-badge[{fmt.md(row['status'])}] "
            f"{fmt.md(row['reason'] or '')} {'' if fmt.missing(row['message']) else '— ' + fmt.md(row['message'])}")
stacks = data.profile_stacks(run, row["profile_id"])
if stacks:
    st.markdown("**Where the phase's time went** (root on top; a frame's width is its share of the samples inside "
                "the phase; click a frame to zoom)")
    st.plotly_chart(charts.icicle(stacks), key=f"profile_icicle_{row['profile_id']}")
left, right = st.columns([3, 2])
frames = data.profile_frames(run, row["profile_id"])
with left:
    if frames.empty:
        st.info("This profile has no frames (see its status).")
    else:
        top = frames.head(15).iloc[::-1]
        labels = [f"{f}  ({str(p).rsplit('/', 1)[-1]}:{'' if pd.isna(n) else int(n)})" for f, p, n in
                  zip(top["frame"], top["file"].fillna("?"), top["line"])]
        fig = go.Figure()
        fig.add_bar(y=labels, x=top["total_share"], orientation="h", name="on the stack (total)", marker_color="#cbd5e1",
                    hovertemplate="%{y}<br>on the stack in %{x:.0%} of samples<extra></extra>")
        fig.add_bar(y=labels, x=top["self_share"], orientation="h", name="innermost (self)", marker_color="#e4572e",
                    hovertemplate="%{y}<br>innermost in %{x:.0%} of samples<extra></extra>")
        fig.update_layout(barmode="overlay")
        fig.update_xaxes(tickformat=".0%", range=[0, 1])
        st.plotly_chart(charts.base(fig, height=max(260, 26 * len(top) + 90), x="share of samples"), key="profile_frames")
with right:
    top_frame = "–" if fmt.missing(row["top_frame"]) else (
        f"{row['top_frame']} ({row['top_file'] or '?'}:{'?' if fmt.missing(row['top_line']) else int(row['top_line'])})")
    facts = {"profile id": row["profile_id"], "span": f"{row['span_id']} (trace {row['trace_id']})",
             "process": row["process_id"], "top frame": top_frame,
             "samples": "–" if fmt.missing(row["samples"]) else " · ".join(
                 x for x in (f"{int(row['samples'])}", profiling.query.inside_text(row.to_dict())) if x),
             "file": row["path"] or "–",
             "size": fmt.size_text(row["size_bytes"])}
    st.dataframe(pd.DataFrame({"": list(facts), "value": [str(v) for v in facts.values()]}), hide_index=True, width="stretch")
    if not fmt.missing(row["step"]) and st.button("Show the span on the Timeline", icon=":material/view_timeline:"):
        state.open_timeline(int(row["step"]), row["span_id"])
    try:
        path = data.artefact(run, row["path"])
    except profiling.UnsafePathError as exc:
        st.error(f"Not offered for download: {fmt.md(exc)}")
        path = None
    if path is not None:
        st.download_button("Download the profile", data=path.read_bytes, file_name=path.name,
                           icon=":material/download:", help=fmt.md(profiling.query.how_to_open(row["kind"], path)))
        st.caption(fmt.md(profiling.query.how_to_open(row["kind"], path)))
    elif row["path"]:
        st.caption("The file is not in the run dir (removed or not written yet).")
