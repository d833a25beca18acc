"""Compare: two steps of a run, or the same steps of two runs, side by side: step time, phase
times and their difference, waits, reward and mismatch, and the two timelines on one time scale."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.analysis._steps import Steps
from rltrace.ui import charts, data, gantt, state
from rltrace.ui.runs import RunRef

STEPS_MODE, RUNS_MODE = "Two steps of this run", "The same steps of two runs"
CONTAINER = "step"  # a span around the whole step: its time is the wall time, not a phase's
COSTS = [("wall time", "wall_s"), ("t_R", "t_R"), ("t_T", "t_T"), ("t_W", "t_W"), ("t_sync", "t_sync")]
WAITS_SHOWN = 5


@dataclass
class Side:
    """One side of the comparison: a run over some steps, and its report over them (a single step's
    report holds that step's own times; a range's, the medians per step the cost model uses)."""

    ref: RunRef
    steps: Steps
    label: str
    report: dict

    @property
    def costs(self) -> pd.DataFrame:
        return data.table(self.report, "steps", ["step", "wall_s"])

    @property
    def phases(self) -> pd.DataFrame:
        return data.table(self.report, "phases", ["phase", "per_step_s"])

    @property
    def waits(self) -> pd.DataFrame:
        return data.table(self.report, "waits", ["step", "seconds", "text"])

    def cost(self, key: str):
        return self.report.get(key)


def _side(ref: RunRef, steps: Steps, label: str) -> Side:
    return Side(ref, steps, label, data.report(ref, steps))


def _step_table(a: Side, b: Side) -> pd.DataFrame:
    """Two steps of one run: the cost model, each phase, and every step scalar, A next to B."""
    rows = [(name, "s", a.cost(col), b.cost(col)) for name, col in COSTS[1:]] + [
        ("async_bound", "s", a.cost("async_bound"), b.cost("async_bound"))]
    pa_, pb_ = (s.phases.set_index("phase")["per_step_s"] for s in (a, b))
    rows += [(f"phase {p}", "s", pa_.get(p), pb_.get(p)) for p in sorted(set(pa_.index) | set(pb_.index)) if p != CONTAINER]
    va, vb = (data.table(s.report, "scalars", ["name", "mean"]).set_index("name")["mean"] for s in (a, b))
    rows += [(m, "step scalar", va.get(m), vb.get(m)) for m in sorted(set(va.index) | set(vb.index))]  # every logged one
    table = pd.DataFrame(rows, columns=["what", "unit", "A", "B"])
    table["ratio"] = table["A"] / table["B"].where(table["B"] != 0)
    return table


run, other = state.selected(), state.comparison()
steps = state.steps()
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

walls = data.table(data.report(run, steps), "steps", ["step", "wall_s"])
if walls.empty:
    st.info("No finished steps in this range.")
    st.stop()
if mode == STEPS_MODE and len(walls) < 2:
    st.info(f"One finished step (step {int(walls['step'].iloc[0])}) in this range: a second step, or a second run "
            "(`rltrace ui RUN_DIR OTHER_RUN_DIR`), gives something to compare.")
    st.stop()
if mode == STEPS_MODE:
    choices = walls["step"].astype(int).tolist()
    slowest = int(walls.loc[walls["wall_s"].idxmax(), "step"])
    typical = int(walls.loc[(walls["wall_s"] - walls["wall_s"].median()).abs().idxmin(), "step"])
    wall_of = dict(zip(walls["step"], walls["wall_s"]))
    step_text = lambda s: f"step {s} · {fmt.seconds_text(wall_of[s])}"  # noqa: E731
    state.choose("compare_a", choices, typical)
    state.choose("compare_b", choices, slowest)
    c1, c2 = st.columns(2)
    a = c1.selectbox("A (default: a typical step)", choices, key="compare_a", format_func=step_text, persist_state="session")
    b = c2.selectbox("B (default: the slowest step)", choices, key="compare_b", format_func=step_text, persist_state="session")
    labels = (f"step {a}", f"step {b}") if a != b else (f"step {a} (A)", f"step {b} (B)")
    A, B = _side(run, (a, a), labels[0]), _side(run, (b, b), labels[1])
    table = _step_table(A, B)
    per = "B's time in its step"
else:
    names = (data.info(run)["name"], data.info(other)["name"])
    labels = names if names[0] != names[1] else (f"{names[0]} (A)", f"{names[1]} (B)")
    A, B = _side(run, steps, labels[0]), _side(other, steps, labels[1])
    def held(side: Side) -> str:  # each run's own steps within the selection: runs of unequal length say so
        got = side.costs["step"]
        return "no finished step" if got.empty else f"steps {int(got.min())}–{int(got.max())}"

    st.caption(f"{fmt.md(A.label)}: {held(A)}; {fmt.md(B.label)}: {held(B)} (of the selected {steps[0]}–{steps[1]}); "
               "the table is `rltrace report --compare`.")
    table = data.compare(A.report, B.report).rename(columns={"this": "A", "other": "B"})
    per = "B's median per step"
if B.costs.empty:
    st.warning(f"{fmt.md(B.label)} has no finished steps in {steps[0]}–{steps[1]}.")
    st.stop()

st.markdown(f":blue-badge[A] **{fmt.md(A.label)}** &nbsp; vs &nbsp; :orange-badge[B] **{fmt.md(B.label)}** — {per}, "
            "and how far it is from A's (red: B is slower)")
for col, (title, key) in zip(st.columns(len(COSTS)), COSTS):
    va, vb = A.cost(key), B.cost(key)
    delta = None if va is None or vb is None else f"{fmt.delta_seconds_text(vb - va)} vs A"
    col.metric(title, fmt.seconds_text(vb), delta=delta, delta_color="inverse", help=f"A ({fmt.md(A.label)}): {fmt.seconds_text(va)}")

st.subheader("Phase times")
merged = charts.merge_phases(A.phases[A.phases["phase"] != CONTAINER], B.phases[B.phases["phase"] != CONTAINER])
left, right = st.columns(2)
left.plotly_chart(charts.phase_bars(merged, A.label, B.label), key="compare_phases")
right.plotly_chart(charts.diff_bars(merged, A.label, B.label), key="compare_diff")

st.subheader("Waits")
for col, side in zip(st.columns(2), (A, B)):
    with col:
        st.markdown(f"**{fmt.md(side.label)}**")
        waits = side.waits.sort_values("seconds", ascending=False).head(WAITS_SHOWN)
        st.markdown("\n".join(f"- {fmt.md(text)}" for text in waits["text"]) or "No waiting recorded.")

st.subheader("Reward, mismatch and the cost model")
st.dataframe(table.rename(columns={"A": A.label, "B": B.label, "ratio": "A / B"}), hide_index=True, width="stretch",
             height="content", placeholder="–",
             column_config={c: st.column_config.NumberColumn(c, format="%.4g") for c in (A.label, B.label, "A / B")})

st.subheader("Timelines on one time scale")
if mode == STEPS_MODE:
    shown = [(run, a, A.label), (run, b, B.label)]
else:
    common = sorted(set(A.costs["step"]) & set(B.costs["step"]))
    if not common:
        st.info("The two runs share no finished step in this range.")
        st.stop()
    state.choose("compare_step", common, common[-1])
    pick = st.selectbox("Step", common, key="compare_step", persist_state="session")
    shown = [(run, pick, A.label), (other, pick, B.label)]
laid = [gantt.layout(data.timeline(ref, s, s))[0] for ref, s, _ in shown]
end = max(float(f["x1_s"].max()) if len(f) else 0.0 for f in laid)
for (ref, s, label), frame in zip(shown, laid):
    critical = set(data.critical_path(ref, (s, s))["span_id"].dropna())
    st.markdown(f"**{fmt.md(label)}** (step {s})")
    st.plotly_chart(gantt.figure(frame, critical=critical, x_range=(0, end * 1.02)), key=f"compare_gantt_{label}")
