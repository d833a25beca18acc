"""Engine: the rollout engine as the capacity models describe it, from the report's `serving`
section: requests per engine over the run (prefill and decode lanes), throughput per engine
against λ_max, prefix-cache hits per weight version with stale hits marked, and the cache budget.
Every number is the report's; where the run lacks what a figure needs, the page says what."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from rltrace._config import RltraceError
from rltrace.analysis import _format as fmt
from rltrace.report import serving_findings
from rltrace.ui import data, engine_charts, state

run = state.selected()
steps = state.steps()
DTYPES = ["served dtype", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp32"]

st.title("Engine")
given = data.serving_given()
with st.expander("Model and KV link (as `rltrace report --model … --kv-bandwidth …`)", expanded=not given.get("model")):
    c1, c2, c3 = st.columns([3, 1, 1])
    model = c1.text_input("Model config.json (or its folder)", value=given.get("model") or "", key="engine_model",
                          help="default: the config `rltrace ui --model` named, else the one rltrace.init(model=...) stored")
    gbps = c2.number_input("KV link, GB/s", min_value=0.0, value=(given.get("kv_bandwidth") or 0) / 1e9, step=1.0,
                           key="engine_kv_gbps", help="B_KV between prefill and decode engines; 0: measured from "
                           "KV-transfer records")
    dtype = c3.selectbox("KV cache dtype", DTYPES, index=DTYPES.index(given.get("kv_dtype") or DTYPES[0])
                         if (given.get("kv_dtype") or DTYPES[0]) in DTYPES else 0, key="engine_kv_dtype")
chosen = {**given, "model": model.strip() or None, "kv_bandwidth": gbps * 1e9 if gbps > 0 else None,
          "kv_dtype": None if dtype == DTYPES[0] else dtype}
chosen = {k: v for k, v in chosen.items() if v is not None}
try:
    report = data.report(run, steps, json.dumps(chosen, sort_keys=True))
except RltraceError as exc:  # a path or value typed here that `rltrace report` would refuse
    st.error(f"{fmt.md(str(exc))}: showing the run without these options.")
    report = data.report(run, steps)
serving = report.get("serving") or {}
missing = serving.get("missing") or {}

scope = "every step" if steps is None else f"steps {steps[0]}–{steps[1]}"
st.caption(f"Engine requests of {scope}: vLLM and SGLang spans received by `rltrace collect`, slime's request "
           "traces, and rltrace's own spans carrying request fields. docs/analysis.md, \"Serving capacity\", "
           "defines every figure.")


def why(key: str, fallback: str) -> str:
    return fmt.md(missing.get(key) or fallback)


def size(value) -> str:
    return fmt.size_text(value)


NO_REQUESTS = (f"No engine requests to show: {why('requests', 'none recorded')}. Send vLLM or SGLang spans to "
               "`rltrace collect RUN` (resource attribute `rl.engine.role=prefill|decode` names an engine's role), "
               "import slime's dumps with `rltrace import slime`, or record `generate` phases with `prompt_tokens`, "
               "`cached_tokens` and `e2e_latency`.")
if not serving.get("requests") and serving.get("kv_bytes_per_token") is None and not serving.get("engine_metrics"):
    st.info(NO_REQUESTS)  # a run without engines: one line saying what would fill the page, not a page of blanks
    st.stop()

pd_ = serving.get("pd")
prefix = serving.get("prefix_cache")
cols = st.columns(5)
cols[0].metric("Requests", f"{serving.get('requests', 0):,}", help="engine requests in the selected steps")
cols[1].metric("λ_max", "-" if not pd_ else f"{fmt.number_text(pd_['lambda_max'])} req/s",
               help="min(n_P μ_P, n_D μ_D, B_KV / S_KV): the request rate the prefill/decode split sustains")
cols[2].metric("Limited by", "-" if not pd_ else pd_["limit"].replace("_", " "))
cols[3].metric("Prefix-cache hits", "-" if not prefix else fmt.share_text(prefix["hit_rate"]),
               delta=None if not prefix or prefix["hit_rate_within_version"] is None else
               f"{fmt.share_text(prefix['hit_rate_within_version'])} within a weight version", delta_color="off",
               help="cached / prompt tokens on prefill and unified engines; within a version: stale hits left out")
cols[4].metric("KV per token (c_A)", size(serving.get("kv_bytes_per_token")),
               delta=None if serving.get("state_bytes_per_slot") is None else
               f"c_R {size(serving['state_bytes_per_slot'])} per state slot", delta_color="off",
               help="attention KV bytes per token of the whole model; c_R: a hybrid model's recurrent state per request slot")

def counter_hits() -> None:
    """The prefix-cache figure from the engines' /metrics counters: one per weight version, no stale hits."""
    st.caption(f"{fmt.share_text(prefix['hit_rate'])} of {prefix['prompt_tokens']:,.0f} queried tokens hit, "
               f"{fmt.md(prefix.get('kind') or '')}; "
               f"{why('prefix_cache.hit_rate_within_version', 'not split by weight version')}.")
    if prefix.get("per_version"):
        by_version = pd.DataFrame(prefix["per_version"])
        by_version["weight_version"] = [engine_charts.version_label(None if pd.isna(v) else int(v))
                                        for v in by_version["weight_version"]]
        st.dataframe(by_version[["weight_version", "prompt_tokens", "cached_tokens", "hit_rate"]], hide_index=True,
                     width="stretch", key="engine_counter_versions",
                     column_config={"hit_rate": st.column_config.NumberColumn("hit rate", format="percent")})


said = serving_findings.sentences(report)  # the report's own sentences about the engine, as `rltrace report` prints them
if said:
    st.info("\n".join(f"- {fmt.md(s)}" for s in said), icon=":material/bolt:")

if not serving.get("requests"):
    st.info(NO_REQUESTS)
    if prefix and prefix.get("kind"):  # a vLLM run's prefix cache is on its /metrics only
        st.subheader("Prefix-cache hits per weight version")
        counter_hits()
else:
    st.subheader("Requests per engine over the run")
    timeline = pd.DataFrame(serving.get("timeline") or [])
    if timeline.empty:
        st.info("No finished request: nothing in flight to draw yet.")
    else:
        st.plotly_chart(engine_charts.requests_over_time(timeline), key="engine_timeline")

    st.subheader("Throughput per engine and λ_max")
    engines = pd.DataFrame(serving.get("engines") or [])
    if engines.empty or engines["mu_rps"].isna().all():
        st.info("No engine finished a request: throughput unknown.")
    else:
        st.plotly_chart(engine_charts.engine_throughput(engines, pd_), key="engine_throughput")
    if pd_:
        st.markdown(f"{pd_['prefill_engines']} prefill and {pd_['decode_engines']} decode engines: μ_P = "
                    f"{fmt.number_text(pd_['mu_prefill'])} req/s, μ_D = {fmt.number_text(pd_['mu_decode'])} req/s per "
                    f"engine. Run **{fmt.md(serving_findings.split_text(pd_.get('split')))}**.")
        have = pd_["prefill_engines"] + pd_["decode_engines"]
        splits = {b["engines"]: b for b in pd_.get("splits") or []}
        if splits:
            other = st.number_input("Engines you have", min_value=min(splits), max_value=max(splits), value=have,
                                    step=1, key="engine_count", help="the best whole prefill/decode split of this "
                                    "many engines, at the μ_P, μ_D and KV link measured here")
            if other != have:
                st.markdown(f"Run **{fmt.md(serving_findings.split_text(splits.get(int(other))))}**.")
        if pd_.get("kv_transfer_rps") is None:
            st.caption(f"KV link not checked: {why('pd.kv_transfer_rps', 'not recorded')}.")
    else:
        st.info(f"No prefill/decode balance: {why('pd', 'not computed')}.")
    with st.expander("Engines"):
        st.dataframe(engines, hide_index=True, width="stretch",
                     column_config={"mu_rps": st.column_config.NumberColumn("req/s while busy", format="%.3g"),
                                    "busy_s": st.column_config.NumberColumn("busy (s)", format="%.3g")})

    st.subheader("Prefix-cache hits per weight version")
    if not prefix:
        st.info(f"No prefix-cache figures: {why('prefix_cache', 'not recorded')}.")
    elif prefix.get("kind"):  # from the engines' /metrics counters: one figure per version, no stale hits
        counter_hits()
    else:
        st.plotly_chart(engine_charts.hits_by_version(pd.DataFrame(prefix["per_version"])), key="engine_hits")
        if prefix["hit_rate_within_version"] is None:
            st.caption(f"Stale hits cannot be told: {why('prefix_cache.hit_rate_within_version', 'no weight version')}.")
        stale = pd.DataFrame(prefix["stale_hits"])
        if len(stale):
            st.warning(f"{prefix['stale_hit_count']:,} request(s) hit the prefix cache after weight updates that kept "
                       "it (a mismatch source): " + fmt.md(serving_findings.stale_text(
                           prefix["stale_cached_tokens"], prefix.get("stale_kind"))) + ".")
        if prefix.get("may_be_stale_cached_tokens"):
            st.caption(f"{prefix['may_be_stale_hit_count']:,} more hit(s), {prefix['may_be_stale_cached_tokens']:,.0f} "
                       "cached tokens, may be stale: the weight syncs did not record whether the prefix cache was "
                       "flushed (`rl.cache_flushed`).")
        if len(stale):
            stale["weight_version"] = [engine_charts.version_label(None if pd.isna(v) else int(v)) for v in stale["weight_version"]]
            st.dataframe(stale[["engine", "weight_version", "request", "cached_tokens", "stale_tokens", "step"]],
                         hide_index=True, width="stretch", key="engine_stale")
        h = serving.get("hicache") or {}
        if h.get("avoided_prefill_s") is not None:
            io = ("cache I/O not recorded, so this is an upper bound on the gain" if h.get("cache_io_s") is None else
                  f"cache I/O took {fmt.seconds_text(h['cache_io_s'])}: net {fmt.seconds_text(h['net_gain_s'])}")
            st.markdown(f"Valid hits avoided about **{fmt.seconds_text(h['avoided_prefill_s'])}** of prefill "
                        f"({fmt.seconds_text(h['prefill_s_per_token'] * 1000)} per 1,000 prompt tokens, fitted on "
                        f"{h['prefill_fitted_on']} requests without a hit); {io}.")
        else:
            st.caption(f"Avoided prefill unknown: {why('hicache.prefill_s_per_token', 'no prefill time recorded')}.")

scraped = pd.DataFrame(serving.get("engine_metrics") or [])
if len(scraped):
    st.subheader("Engine metrics (/metrics)")
    scraped["time"] = pd.to_datetime(scraped["time_ns"], unit="ns")
    percent = scraped["percent"] if "percent" in scraped else pd.Series([None] * len(scraped))
    scraped["value"] = [fmt.number_text(v) if pd.isna(p) else f"{p:.1f}%" for v, p in zip(scraped["value"], percent)]
    st.dataframe(scraped[["endpoint", "engine", "name", "value", "time"]], hide_index=True, width="stretch",
                 key="engine_scraped")
    st.caption("The last value each engine's Prometheus endpoint gave `rltrace collect --scrape` (usage gauges, "
               "0-1 fractions on the page, shown as percentages; counters as the engine counted them).")
    by_step = pd.DataFrame(serving.get("engine_metrics_by_step") or [])
    if len(by_step):
        by_step["shown"] = [fmt.number_text(r) if pd.notna(r) else (f"{c:.1f}%" if pd.notna(c) else fmt.number_text(k))
                            for r, k, c in zip(by_step["rise"], by_step["peak"], by_step["percent"])]
        table = by_step.pivot(index="step", columns="name", values="shown").reset_index()
        st.dataframe(table, hide_index=True, width="stretch", key="engine_scraped_steps")
        st.caption("Per step (the step whose rollout began last before each scrape): counters as their rise over "
                   "the step, summed over engines; gauges as the most one engine showed.")
    kv = serving.get("kv_transfer_metrics")
    if kv:
        st.markdown(f"KV transfers (sglang:kv_transfer_*): {serving_findings.kv_transfer_text(kv)}.")

st.subheader("Cache budget")
geo = serving.get("geometry")
budget = serving.get("budget")
if not geo:
    st.info(f"No cache geometry: {why('kv_bytes_per_token', 'no model config')}.")
elif geo.get("refused"):
    st.info(f"Cache geometry not computed for this model: {fmt.md(geo['refused'])}.")
else:
    if budget:
        st.plotly_chart(engine_charts.budget_split(budget), key="engine_budget")
        st.caption(f"{fmt.md(budget['engine'])} at its peak: {budget['slots']} requests at once holding "
                   f"{budget['tokens']:,.0f} tokens (each counted at its full length, an upper bound).")
    else:
        st.info(f"No budget split: {why('budget', 'the peak load is unknown')}.")
    st.dataframe(pd.DataFrame(geo["layers"]), hide_index=True, width="stretch", key="engine_layers")
    st.caption(f"From {fmt.md(geo['source'])}; KV cache {fmt.md(geo['kv_dtype'])} "
               f"({fmt.md(geo.get('dtype_from') or 'the config')})"
               + (f", recurrent state {fmt.md(geo['ssm_dtype'])}, conv state {fmt.md(geo['conv_dtype'])}"
                  if geo.get("c_R") else "") + ".")

delta = serving.get("delta_sync")
if delta:
    st.subheader("Delta weight sync")
    verdict = ("pays" if delta["worth_it"] else "does not pay") if delta["worth_it"] is not None else "cannot be judged"
    st.markdown(f"Over {delta['syncs']} sync(s) it **{verdict}**: saves {fmt.seconds_text(delta['saved_s_mean'])} of "
                f"transfer per sync, costs {fmt.seconds_text(delta['cost_s_mean'])} of "
                f"{fmt.md(', '.join(delta['costs']) or 'no traced step')}.")
    st.dataframe(pd.DataFrame(delta["per_sync"]), hide_index=True, width="stretch", key="engine_delta")
