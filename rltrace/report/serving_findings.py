"""Sentences about the rollout engine against the capacity models (the report's `serving` section):
the prefill/decode balance, stale and useful prefix-cache hits, the cache budget of a hybrid model,
and whether delta weight sync pays. Each states a measured number and where it comes from."""

from __future__ import annotations

from rltrace.analysis._format import number_text as num
from rltrace.analysis._format import rate_text
from rltrace.analysis._format import seconds_text as sec
from rltrace.analysis._format import size_text


PD_IMBALANCE = 1.25  # prefill and decode capacities this far apart: say which to move engines to
STALE_NAMED = 3  # stale prefix-cache hits named one by one


def sentences(r: dict) -> list[str]:
    """The rollout engine against the capacity models: PD balance, stale and useful prefix-cache
    hits, the cache budget of a hybrid model, and whether delta weight sync pays."""
    s = r.get("serving") or {}
    geo = s.get("geometry") or {}
    out = [f"Cache geometry not computed: {geo['refused']}."] if geo.get("refused") else []
    out += _pd(s) + _kv_transfers(s) + _stale_hits(s) + _cache_hits(s) + _hybrid_budget(s)
    return out + _delta_sync(s.get("delta_sync"))


def _kv_transfers(s: dict) -> list[str]:
    kv = s.get("kv_transfer_metrics")
    if not kv:
        return []
    return [f"KV transfers: {kv_transfer_text(kv)} (Prometheus, sglang:kv_transfer_latency_ms / _total_mb)."]


def kv_transfer_text(kv: dict) -> str:
    """`2 moved 1.61 GB at 1.61 GB/s, 500.0 ms each on average` from `serving.kv_transfer_metrics`, a figure
    whose histogram was not scraped said so: one wording for the report and the dashboard."""
    moved = ("bytes not recorded (no sglang:kv_transfer_total_mb)" if kv.get("bytes") is None
             else size_text(kv["bytes"]))
    rate = f" at {rate_text(kv['bandwidth'])}" if kv.get("bandwidth") else ""
    latency = ("latency not recorded" if kv.get("latency_ms_mean") is None
               else f"{kv['latency_ms_mean']:.1f} ms each on average")
    return f"{kv['transfers']:,.0f} moved {moved}{rate}, {latency}"


def _rps(x) -> str:
    return f"{num(x)} req/s"


def _pd(s: dict) -> list[str]:
    p = s.get("pd")
    if not p:
        return []
    prefill, decode = p["prefill_capacity_rps"], p["decode_capacity_rps"]
    kv_note = "" if p.get("kv_transfer_rps") is not None else (
        f" KV transfer not checked: {(s.get('missing') or {}).get('pd.kv_transfer_rps', 'not recorded')}.")
    if p["limit"] == "kv_transfer":
        prompt = f" at {num(s['prompt_tokens_mean'])} prompt tokens" if s.get("prompt_tokens_mean") else ""
        return [f"The KV link limits the rollout at {_rps(p['lambda_max'])} (B_KV {rate_text(p['kv_bandwidth'])} "
                f"{p['kv_bandwidth_from']}, {size_text(p['kv_bytes_per_request'])} of KV per request{prompt}; prefill "
                f"could serve {_rps(prefill)}, decode {_rps(decode)}): a faster link, a smaller KV cache (FP8) or "
                "shorter prompts would raise it."]
    slow, fast = ("prefill", "decode") if p["limit"] == "prefill" else ("decode", "prefill")
    if max(prefill, decode) < PD_IMBALANCE * min(prefill, decode):
        return [f"Prefill and decode engines are balanced: they could serve {_rps(prefill)} and {_rps(decode)}; "
                f"λ_max = {_rps(p['lambda_max'])}.{kv_note}"]
    return [f"{slow} limits the rollout at {_rps(p['lambda_max'])} ({fast} could serve "
            f"{_rps(p[fast + '_capacity_rps'])}): move engines to {slow}; {split_text(p.get('split'))}.{kv_note}"]


def split_text(best: dict | None) -> str:
    """`with 4 engines: 1 prefill + 3 decode → 30 req/s` (the PD split to run; one wording for the
    report and the dashboard)."""
    if not best:
        return "no split: fewer than 2 engines"
    limit = "" if best["limit"] != "kv_transfer" else ", the KV link limiting"
    return (f"with {best['engines']} engines: {best['prefill']} prefill + {best['decode']} decode → "
            f"{_rps(best['lambda'])}{limit}")


#: why a stale count is what it is (`prefix_cache.stale_kind`; docs/analysis.md, "Prefix cache")
STALE_WHY = {"at most": "every hit after an unflushed update; a group's later requests also hit what its first "
                        "computed with the new weights",
             "exact": "each sample group's first request found only old prefix; its later requests, what the first "
                      "found"}


def stale_text(tokens: float, kind: str | None) -> str:
    """`at most 1,300 stale tokens (every hit after …)` / `exactly 800 stale tokens (…)`: one wording
    for the report and the dashboard."""
    amount = "exactly" if kind == "exact" else "at most"
    return f"{amount} {tokens:,.0f} stale tokens ({STALE_WHY['exact' if kind == 'exact' else 'at most']})"


def _stale_hits(s: dict) -> list[str]:
    p = s.get("prefix_cache") or {}
    kept = [u for u in p.get("updates") or [] if u["cache"] == "not flushed" and u["hits"]]
    out = []
    for u in kept[:STALE_NAMED]:
        update = "a weight update" if u["weight_version"] is None else f"the update to weight version {u['weight_version']}"
        out.append(f"engine {u['engine']} kept its prefix cache across {update} ({u['evidence']}): its "
                   f"{_count(u['hits'], 'hit')} since ({u['cached_tokens']:,.0f} cached tokens) hold "
                   f"{stale_text(u.get('stale_tokens', u['cached_tokens']), u.get('stale_kind'))}, a mismatch source.")
    if len(kept) > STALE_NAMED:
        out.append(f"{len(kept) - STALE_NAMED} more engine updates kept a stale prefix cache "
                   f"({stale_text(p['stale_cached_tokens'], p.get('stale_kind'))} in all).")
    if p.get("may_be_stale_cached_tokens"):
        out.append(f"{_count(p['may_be_stale_hit_count'], 'hit')} ({p['may_be_stale_cached_tokens']:,.0f} cached tokens) after "
                   "weight updates may be stale: the syncs did not record whether the prefix cache was flushed "
                   "(set rl.cache_flushed on the weight_sync span).")
    return out


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _cache_hits(s: dict) -> list[str]:
    p, h = s.get("prefix_cache") or {}, s.get("hicache") or {}
    if not p.get("hit_rate"):
        return []
    if p.get("kind"):  # the engines' counters: one figure over the run, no requests behind it
        versions = ", ".join(f"{'before any update' if v['weight_version'] is None else 'v' + str(v['weight_version'])} "
                             f"{v['hit_rate']:.0%}" for v in p.get("per_version") or [] if v.get("hit_rate") is not None)
        return [f"Prefix cache: {p['hit_rate']:.0%} of {p['prompt_tokens']:,.0f} queried prompt tokens hit, {p['kind']}"
                + (f" (by weight version: {versions})" if versions else "")
                + "; the counters do not tell stale hits apart."]
    within = "" if p.get("hit_rate_within_version") is None else f" ({p['hit_rate_within_version']:.0%} within a weight version)"
    text = f"Prefix cache: {p['hit_rate']:.0%} of prompt tokens were cached{within}"
    if h.get("avoided_prefill_s") is None:
        why = (s.get("missing") or {}).get("hicache.prefill_s_per_token", "no request without a hit records its prefill time")
        return [text + f"; the prefill time they avoided is unknown ({why})."]
    text += (f"; the valid hits avoided about {sec(h['avoided_prefill_s'])} of prefill "
             f"({sec(h['prefill_s_per_token'] * 1000)} per 1,000 prompt tokens, fitted on {h['prefill_fitted_on']} "
             "requests without a hit)")
    if h.get("net_gain_s") is None:
        return [text + ": cache I/O time not recorded, so that is an upper bound on the gain."]
    return [text + f", against {sec(h['cache_io_s'])} of cache I/O: a net {'gain' if h['net_gain_s'] >= 0 else 'loss'} of "
            f"{sec(abs(h['net_gain_s']))}."]


def _hybrid_budget(s: dict) -> list[str]:
    geo, b = s.get("geometry") or {}, s.get("budget")
    if geo.get("kind") != "hybrid":
        return []
    c_a, c_r = size_text(geo["c_A"]), size_text(geo["c_R"])
    if not b:
        return [f"Hybrid cache: c_A = {c_a} per token ({geo['kv_dtype']}), c_R = {c_r} per state slot."]
    holds = (f"with {b['slots']} slots the recurrent state dominates the budget" if (b["state_share"] or 0) >= 0.5 else
             f"with {b['slots']} slots the attention KV still holds most of the budget")
    share = f"{b['state_share']:.0%} of the {size_text(b['total_bytes'])} {b['engine']} held at its peak"
    if b.get("fp8"):
        return [f"an FP8 KV cache halves c_A ({c_a} → {size_text(b['fp8']['c_A'])} per token) and leaves c_R ({c_r} per "
                f"state slot): {holds} ({share})."]
    return [f"c_A is {c_a} per token ({geo['kv_dtype']} KV cache) and c_R {c_r} per state slot: {holds} ({share})."]


def _delta_sync(d: dict | None) -> list[str]:
    if not d or d.get("net_s_mean") is None:
        return []
    steps = ", ".join(d["costs"]) or "no traced step"
    moved = (f"{size_text(d['bytes_mean'])} → {size_text(d['bytes_delta_mean'])} at {rate_text(d['bandwidth'])} "
             f"({d['bandwidth_from']})")
    if d["worth_it"]:
        return [f"Delta weight sync pays: it saves {sec(d['saved_s_mean'])} of transfer per sync ({moved}) for "
                f"{sec(d['cost_s_mean'])} of {steps}."]
    top = max(d["costs"], key=d["costs"].get) if d["costs"] else None
    largest = f" (largest: {top}, {sec(d['costs'][top])})" if top else ""
    return [f"Delta weight sync does not pay: it saves {sec(d['saved_s_mean'])} of transfer per sync ({moved}) but "
            f"{steps} cost {sec(d['cost_s_mean'])}{largest}: send the full weights, or make those steps cheaper."]
