"""What if: the step time, staleness and what binds under another schedule (staleness bound,
rollout workers, partial rollouts, placement, weight-sync cost, a prefill/decode split), replayed from this
run's samples, engine requests and stage times (`rltrace whatif`), beside the recorded run and the analytic
bound. What the run cannot predict (a split without engine request spans, model config or KV bandwidth)
is refused with the reason, as the command refuses it."""

from __future__ import annotations

import streamlit as st

from rltrace._config import RltraceError
from rltrace.analysis import _format as fmt
from rltrace.ui import charts, data, state

CURVE_K = (0, 1, 2, 3, 4)  # the chart's staleness bounds

run = state.selected()
steps = state.steps()
st.title("What if")
if steps is None:
    st.info("This run has no steps yet.")
    st.stop()
recorded = (data.whatif(run, steps, ()) or [None])[0]
if recorded is None:
    st.info("No finished step with rollout or train spans in this range: nothing to replay.")
    st.stop()
st.caption(f"Steps {steps[0]}–{steps[1]}, recorded as {fmt.md(recorded['schedule'])}, replayed under the schedule "
           "picked here: each replay draws recorded steps (their samples and stage times) at random; the range is "
           "90 % of replays. Same figures as `rltrace whatif`.")

c1, c2, c3, c4, c5 = st.columns(5)
k = c1.number_input("Staleness bound K", min_value=0, max_value=16, value=1, key="whatif_k",
                    help="0: synchronous; 1: one-step-off; samples may be up to K weight versions old")
workers = c2.number_input("Rollout workers", min_value=1, max_value=1024, value=int(recorded["rollout_workers"]),
                          key="whatif_workers", help="engines sharing each step's samples, each a static batch")
partial = c3.number_input("Partial rollouts (over-sampling, 0: off)", min_value=0.0, max_value=4.0, value=0.0,
                          step=0.05, key="whatif_partial",
                          help=f"e.g. {data.PARTIAL_OVERSAMPLE}: a quarter more samples in flight; a batch ends when its "
                               "share is in, the rest resume in the next")
placement = c4.segmented_control("Placement", ["disaggregated", "colocated"], default="disaggregated",
                                 key="whatif_placement") or "disaggregated"
sync_s = c5.number_input("Weight sync (s; empty: as recorded)", min_value=0.0, value=None, step=0.01, format="%.3f",
                         key="whatif_sync", help="a weight sync's cost in this schedule: another placement's transfer, "
                                                 "e.g. payload / bandwidth")
c6, c7, _ = st.columns([1, 1, 3])
pd_text = c6.text_input("Prefill/decode split P:D (empty: unified)", value="", key="whatif_pd",
                        help="P prefill and D decode engines, the KV of each prompt crossing one link (as `rltrace "
                             "whatif --pd P:D`): needs the run's engine request spans and its model config")
kv_gbps = c7.number_input("KV link, GB/s (0: the run's)", min_value=0.0, value=0.0, step=1.0, key="whatif_kv_gbps",
                          help="B_KV between prefill and decode engines under the split; 0: `rltrace ui "
                               "--kv-bandwidth`, else measured from the run's KV transfers")
if 0 < partial < 1:
    st.warning("Partial rollouts over-sample: the factor is at least 1 (0 turns them off).")
    st.stop()
split = None
if pd_text.strip():
    try:
        split = tuple(int(v) for v in pd_text.strip().split(":"))
    except ValueError:
        split = ()
    if len(split) != 2 or min(split) < 1:
        st.warning(f"A prefill/decode split is P:D, prefill engines : decode engines, each at least 1 (e.g. 1:3); "
                   f"got {fmt.md(pd_text.strip())}.")
        st.stop()
    st.caption(f"Under the split the {split[0]} prefill and {split[1]} decode engines replace the rollout workers.")
knobs = (int(workers), partial or None, placement, sync_s, split, kv_gbps * 1e9 if split and kv_gbps > 0 else None)
try:
    row = data.whatif(run, steps, ((int(k), *knobs),))[1]
except RltraceError as exc:  # what this run cannot predict, with the reason (`rltrace whatif` exits 2 on it)
    st.warning(f"{fmt.md(str(exc))}.")
    st.stop()

base = recorded["recorded_step_s"] or recorded["predicted_step_s"]
m1, m2, m3, m4 = st.columns(4)
m1.metric("Predicted step", fmt.seconds_text(row["predicted_step_s"]),
          delta=f"{row['predicted_step_s'] - base:+.3g} s vs recorded", delta_color="inverse",
          help=f"recorded: {fmt.seconds_text(base)} (median); the replay as recorded: "
               f"{fmt.seconds_text(recorded['predicted_step_s'])}")
lo, hi = row["interval_s"]
m2.metric("90 % of replays", f"{fmt.seconds_text(lo)}–{fmt.seconds_text(hi)}")
m3.metric("Staleness (mean, max)", f"{row['staleness_mean']:.2f}, {row['staleness_max']}")
m4.metric("Analytic bound", fmt.seconds_text(row["analytic_s"]),
          help="t_sync for a synchronous schedule, max(t_R, t_T) + t_W for an async one; under a prefill/decode "
               "split t_R's rollout is max(M / (n_P μ_P), M · S_KV / B_KV, the longest decode)")
st.markdown(f"**Binds: {fmt.md(row['binding'])}** — {fmt.md(row['why'])}. Busy: rollout engines "
            f"{row['rollout_util']:.0%}, trainer {row['trainer_util']:.0%} of the time.")
for note in row.get("notes") or []:
    st.caption(fmt.md(note))

st.subheader("Step period by staleness bound")
curve = data.whatif(run, steps, tuple((kk, *knobs) for kk in CURVE_K))[1:]
st.plotly_chart(charts.whatif_periods(curve, recorded["recorded_step_s"]), key="whatif_curve")
