"""Compare: two steps of a run, or the same steps of two runs, side by side: step time, phase
times and their difference, waits, reward and mismatch, and the two timelines on one time scale."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from rltrace.ui import charts, data, gantt, state, style

STEPS_MODE, RUNS_MODE = "Two steps of this run", "The same steps of two runs"
CONTAINER = "step"  # a span around the whole step: its time is the wall time, not a phase's

run, other = state.selected(), state.comparison()
steps = state.steps()
name = data.info(run)["name"]
st.title("Compare")
if steps is None:
    st.info("This run has no steps yet.")
    st.stop()
modes = [STEPS_MODE] + ([RUNS_MODE] if other else [])
state.choose("compare_mode", modes, RUNS_MODE if other else STEPS_MODE)
mode = st.segmented_control("Compare", modes, key="compare_mode", persist_state="session",
                            label_visibility="collapsed") or STEPS_MODE
if not other:
    st.caption("Start `rltrace ui` with two run dirs and pick one under *Compare with* to compare runs.")

walls = data.step_breakdown(run, steps)
if walls.empty:
    st.info("No finished steps in this range.")
    st.stop()
if mode == STEPS_MODE:
    choices = walls["step"].astype(int).tolist()
    slowest = int(walls.loc[walls["wall_s"].idxmax(), "step"])
    typical = int(walls.loc[(walls["wall_s"] - walls["wall_s"].median()).abs().idxmin(), "step"])
    wall_of = dict(zip(walls["step"], walls["wall_s"]))
    fmt = lambda s: f"step {s} · {style.seconds(wall_of[s])}"  # noqa: E731
    state.choose("compare_a", choices, typical)
    state.choose("compare_b", choices, slowest)
    c1, c2 = st.columns(2)
    a = c1.selectbox("A (default: a typical step)", choices, key="compare_a", format_func=fmt, persist_state="session")
    b = c2.selectbox("B (default: the slowest step)", choices, key="compare_b", format_func=fmt, persist_state="session")
    sides = [(run, (a, a), f"step {a}"), (run, (b, b), f"step {b}")]
else:
    other_name = data.info(other)["name"]
    sides = [(run, steps, name), (other, steps, other_name if other_name != name else f"{other_name} (2)")]
    st.caption(f"Steps {steps[0]}–{steps[1]} of both runs.")

(ref_a, range_a, label_a), (ref_b, range_b, label_b) = sides
ra, rb = data.report(ref_a, range_a), data.report(ref_b, range_b)
if not rb["steps"]:
    st.warning(f"{label_b} has no finished steps in {range_b[0]}–{range_b[1]}.")
    st.stop()


def _median(r: dict, key: str):
    values = [s[key] for s in r["steps"] if not style.missing(s.get(key))]
    return pd.Series(values).median() if values else None


st.markdown(f":blue-badge[A] **{label_a}** &nbsp; vs &nbsp; :orange-badge[B] **{label_b}** — B's median per step, "
            "and how far it is from A's (red: B is slower)")
cols = st.columns(5)
for col, (title, key) in zip(cols, [("wall time", "wall_s"), ("t_R", "t_R"), ("t_T", "t_T"), ("t_W", "t_W"), ("t_sync", "t_sync")]):
    va, vb = _median(ra, key), _median(rb, key)
    delta = None if style.missing(va) or style.missing(vb) else f"{vb - va:+.3g} s vs A"
    col.metric(title, style.seconds(vb), delta=delta, delta_color="inverse", help=f"A ({label_a}): {style.seconds(va)}")

st.subheader("Phase times")
phases_a = pd.DataFrame(ra["phases"], columns=["phase", "mean_s"])
phases_b = pd.DataFrame(rb["phases"], columns=["phase", "mean_s"])
merged = charts.merge_phases(phases_a[phases_a["phase"] != CONTAINER], phases_b[phases_b["phase"] != CONTAINER])
left, right = st.columns(2)
left.plotly_chart(charts.phase_bars(merged, label_a, label_b), key="compare_phases")
right.plotly_chart(charts.diff_bars(merged, label_a, label_b), key="compare_diff")

st.subheader("Waits")
left, right = st.columns(2)
for col, (ref, label, r) in ((left, (ref_a, label_a, ra)), (right, (ref_b, label_b, rb))):
    with col:
        st.markdown(f"**{label}**")
        names = style.process_names(data.info(ref)["processes"])
        waits = sorted(r["waits"], key=lambda w: -w["seconds"])[:5]
        st.markdown("\n".join(f"- {style.wait_text(w, names)}" for w in waits) or "No waiting recorded.")

st.subheader("Reward, mismatch and the cost model")
table = data.compare(ra, rb).rename(columns={"this": label_a, "other": label_b, "ratio": f"{label_a} / {label_b}"})
st.dataframe(table, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(c, format="%.4g") for c in (label_a, label_b, f"{label_a} / {label_b}")})

st.subheader("Timelines on one time scale")
if mode == STEPS_MODE:
    shown = [(run, a, label_a), (run, b, label_b)]
else:
    common = sorted(set(s["step"] for s in ra["steps"]) & set(s["step"] for s in rb["steps"]))
    if not common:
        st.info("The two runs share no finished step in this range.")
        st.stop()
    state.choose("compare_step", common, common[-1])
    pick = st.selectbox("Step", common, key="compare_step", persist_state="session")
    shown = [(run, pick, label_a), (other, pick, label_b)]
laid = [gantt.layout(data.timeline(ref, s, s))[0] for ref, s, _ in shown]
end = max(float(f["x1_s"].max()) if len(f) else 0.0 for f in laid)
for (ref, s, label), frame in zip(shown, laid):
    critical = set(data.critical_path(ref, (s, s))["span_id"].dropna())
    st.markdown(f"**{label}** (step {s})")
    st.plotly_chart(gantt.figure(frame, critical=critical, x_range=(0, end * 1.02)), key=f"compare_gantt_{label}")
