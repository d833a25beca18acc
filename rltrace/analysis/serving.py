"""The rollout engine as the capacity models describe it (docs/analysis.md, "Serving capacity").

From the engine requests (`engine_requests`) and the model's cache geometry (`cache_geometry`):
- prefill/decode balance: λ ≤ min(n_P μ_P, n_D μ_D, B_KV / S_KV) (`pd`);
- prefix-cache hits counted within a weight version, hits that survived a weight update
  (`prefix_cache`), and the prefill time the valid hits avoided (`hicache`);
- the cache the run's peak load held, split between attention KV and recurrent state (`budget`);
- requests in flight and completed per engine over the run (`timeline`).
`section(con, steps)` gathers them into the report's `serving` dict; options a user gives for one
report (`--model`, `--kv-dtype`, `--ssm-dtype`, `--kv-bandwidth`) are set on the connection first
with `configure`.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from rltrace import _model
from rltrace._config import RltraceConfigError
from rltrace.analysis import _intervals, _parts
from rltrace.analysis._steps import Steps
from rltrace.analysis.cache_geometry import ENGINES, dtype_name, geometry
from rltrace.analysis.delta_sync import delta_sync, mean_of
from rltrace.analysis.engine_requests import (DISAGGREGATED, ROUTER, engine_requests, groups_of, kv_transfers, marks,
                                              stored_model)

_OPTIONS = "_rltrace_serving_options"
FP8 = "fp8_e4m3"
TIMELINE_BINS = 100  # bins of the requests-over-time series
TIMELINE_ENGINES = 64  # engines drawn over time at most (those with the most requests)
STALE_LISTED = 100  # stale hits listed one by one (all are counted)
SPLITS_UP_TO = 16  # `pd.splits`: the best split for 2 .. this many engines (or twice the run's, if more)
_NO_VERSION = -1.5  # the group of requests with no known weight version (sorts before every version)
#: the engine-request columns this module reads
_COLUMNS = ("engine", "role", "engine_kind", "request_id", "span_id", "start_ns", "end_ns", "step", "weight_version",
            "cache_flushed", "prompt_tokens", "completion_tokens", "cached_tokens", "prefill_s", "cache_io_s",
            "trace_id", "parent_span_id", "group_id")


def configure(con, *, model=None, kv_dtype: str | None = None, ssm_dtype: str | None = None,
              kv_bandwidth: float | None = None, engine: str | None = None) -> None:
    """Options for the reports built on this connection: `model` (a config.json path, its directory,
    or a dict; wins over the one stored by `init(model=...)`), `kv_dtype` / `ssm_dtype` (cache
    dtype names, `cache_geometry.DTYPE_BITS`), `kv_bandwidth` (B_KV, bytes/s; wins over the one
    measured), `engine` (`vllm` / `sglang`: whose dtype defaults apply; default: read from the
    engine spans). Raises `RltraceConfigError` / `DtypeError` naming a bad value."""
    if engine is not None and engine not in ENGINES:
        raise RltraceConfigError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    dtype_name(kv_dtype, "--kv-dtype")
    dtype_name(ssm_dtype, "--ssm-dtype")
    if kv_bandwidth is not None and not (isinstance(kv_bandwidth, (int, float)) and 0 < kv_bandwidth < math.inf):
        raise RltraceConfigError(f"--kv-bandwidth must be a number of bytes per second > 0, got {kv_bandwidth!r}")
    config, source = _model.read_config(model) if model is not None else (None, None)
    options = {"model": config, "model_source": source, "kv_dtype": kv_dtype, "ssm_dtype": ssm_dtype,
               "kv_bandwidth": None if kv_bandwidth is None else float(kv_bandwidth), "engine": engine}
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_OPTIONS} AS SELECT ? AS options", [json.dumps(options)])


def _options(con) -> dict:
    if not _parts.has_table(con, _OPTIONS):
        return {}
    return json.loads(con.execute(f"SELECT options FROM {_OPTIONS}").fetchall()[0][0])


def model_geometry(con, kinds=()) -> tuple[dict | None, dict | None, str | None]:
    """(geometry, the same with an FP8 KV cache, why there is none): from `--model` or the config
    `init(model=...)` stored with the run; the dtype defaults of `--engine`, else of the engines
    `kinds` the spans name (`vllm`, `sglang`)."""
    options = _options(con)
    found = (options["model"], options["model_source"]) if options.get("model") else stored_model(con)
    if found is None:
        return None, None, "no model config: give `rltrace report RUN --model PATH` or `rltrace.init(model=...)`"
    config, source = found
    kv, ssm = options.get("kv_dtype"), options.get("ssm_dtype")
    if options.get("engine"):
        engine, engine_from = options["engine"], "--engine"
    else:
        seen = sorted(k for k in set(kinds) if k in ENGINES)
        engine, engine_from = ("+".join(seen), "the engine spans") if seen else (None, None)
    geo = geometry(config, kv_dtype=kv, ssm_dtype=ssm, source=source, engine=engine, engine_from=engine_from)
    if geo["refused"]:
        return geo, None, geo["refused"]
    fp8 = geometry(config, kv_dtype=FP8, ssm_dtype=ssm, source=source, engine=engine, engine_from=engine_from)
    return geo, fp8, None


# --- per engine -------------------------------------------------------------------------------------
def engines(req: pd.DataFrame) -> pd.DataFrame:
    """Per engine: engine, role (its most common), requests (finished), busy_s (union of its
    requests' times), mu_rps (requests / busy_s: completed per second while it had work),
    prompt_tokens_mean, peak_requests (most requests in flight at once), peak_tokens (their
    prompt + completion tokens: every request counted at its full length, an upper bound)."""
    cols = ["engine", "role", "requests", "busy_s", "mu_rps", "prompt_tokens_mean", "peak_requests", "peak_tokens"]
    done = req[req["end_ns"].notna()]
    if done.empty:
        return pd.DataFrame(columns=cols)
    names = sorted(done["engine"].unique())
    code = pd.Categorical(done["engine"], categories=names).codes.astype(np.int64)
    start, end = done["start_ns"].to_numpy(np.int64), done["end_ns"].to_numpy(np.int64)
    busy = _intervals.total(code, start, np.maximum(end, start), len(names)) / 1e9
    tokens = (done["prompt_tokens"].fillna(0) + done["completion_tokens"].fillna(0)).to_numpy(float)
    rows = []
    for i, name in enumerate(names):
        mine = code == i
        peak, peak_tokens = _peak(start[mine], end[mine], tokens[mine])
        role = done.loc[mine, "role"].mode()
        rows.append({"engine": name, "role": role.iloc[0] if len(role) else None, "requests": int(mine.sum()),
                     "busy_s": float(busy[i]), "mu_rps": float(mine.sum() / busy[i]) if busy[i] > 0 else None,
                     "prompt_tokens_mean": mean_of(done.loc[mine, "prompt_tokens"]), "peak_requests": peak,
                     "peak_tokens": peak_tokens})
    return pd.DataFrame(rows, columns=cols)


def _peak(start: np.ndarray, end: np.ndarray, tokens: np.ndarray) -> tuple[int, float]:
    """Most intervals open at once, and the summed tokens of the intervals open then (an end
    before a start at one instant: touching requests do not overlap)."""
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    weight = np.concatenate([tokens, -tokens])
    order = np.lexsort((delta, times))
    open_now, held = np.cumsum(delta[order]), np.cumsum(weight[order])
    at = int(np.argmax(open_now))
    return int(open_now[at]), float(held[at])


# --- prefill / decode ----------------------------------------------------------------------------
def pd_balance(per_engine: pd.DataFrame, kv_bytes_per_request: float | None, kv_bandwidth: float | None,
               bandwidth_from: str | None, roles_seen: set[str]) -> tuple[dict | None, str | None]:
    """(the `pd` dict, why it is None): λ_max = min(n_P μ_P, n_D μ_D, B_KV / S_KV), the stage
    that sets it and the share of engines that should do prefill, μ_D / (μ_P + μ_D)."""
    prefill = per_engine[(per_engine["role"] == "prefill") & per_engine["mu_rps"].notna()]
    decode = per_engine[(per_engine["role"] == "decode") & per_engine["mu_rps"].notna()]
    if prefill.empty or decode.empty:
        if per_engine.empty:
            return None, "no engine requests recorded"
        if roles_seen == {DISAGGREGATED}:
            return None, ("the requests went through a prefill/decode router (their PD durations are recorded) but "
                          "not which engine served them: n_P and n_D need the engines' own spans (rltrace collect, "
                          "resource attribute rl.engine.role)")
        if prefill.empty and decode.empty:
            return None, ("unified deployment: no engine reports the role prefill or decode (set "
                          "OTEL_RESOURCE_ATTRIBUTES=rl.engine.role=prefill on prefill engines, =decode on decode engines)")
        return None, f"only {'decode' if prefill.empty else 'prefill'} engines report their role"
    mu_p, mu_d = float(prefill["mu_rps"].mean()), float(decode["mu_rps"].mean())
    capacity = {"prefill": len(prefill) * mu_p, "decode": len(decode) * mu_d}
    kv_rps = kv_bandwidth / kv_bytes_per_request if kv_bandwidth and kv_bytes_per_request else None
    if kv_rps is not None:
        capacity["kv_transfer"] = kv_rps
    limit = min(capacity, key=capacity.get)
    engines_now = len(prefill) + len(decode)
    return {
        "prefill_engines": len(prefill), "decode_engines": len(decode), "mu_prefill": mu_p, "mu_decode": mu_d,
        "prefill_capacity_rps": capacity["prefill"], "decode_capacity_rps": capacity["decode"],
        "kv_bandwidth": kv_bandwidth, "kv_bandwidth_from": bandwidth_from if kv_bandwidth else None,
        "kv_bytes_per_request": kv_bytes_per_request, "kv_transfer_rps": kv_rps,
        "lambda_max": capacity[limit], "limit": limit, "prefill_share_balanced": mu_d / (mu_p + mu_d),
        "split": split(engines_now, mu_p, mu_d, kv_rps),
        "splits": [split(n, mu_p, mu_d, kv_rps) for n in range(2, max(SPLITS_UP_TO, 2 * engines_now) + 1)],
    }, None


def split(engines: int, mu_p: float, mu_d: float, kv_rps: float | None) -> dict | None:
    """The best whole split of `engines` between prefill and decode (each at least one):
    prefill, decode, lambda (min(n_P μ_P, n_D μ_D, B_KV / S_KV)) and the stage that limits it;
    ties go to fewer prefill engines. None with fewer than 2 engines."""
    if engines < 2:
        return None
    best = None
    for n_p in range(1, engines):
        capacity = {"prefill": n_p * mu_p, "decode": (engines - n_p) * mu_d}
        if kv_rps is not None:
            capacity["kv_transfer"] = kv_rps
        limit = min(capacity, key=capacity.get)
        if best is None or capacity[limit] > best["lambda"] * (1 + 1e-9):
            best = {"engines": engines, "prefill": n_p, "decode": engines - n_p, "lambda": capacity[limit], "limit": limit}
    return best


# --- prefix cache --------------------------------------------------------------------------------------
#: how each (engine, weight version) after an update on that engine stands (`prefix_cache`)
NOT_FLUSHED, FLUSHED, UNKNOWN = "not flushed", "flushed", "not recorded"
#: where vLLM's prefix-cache figures are (its spans carry none: docs/analysis.md)
VLLM_PREFIX_COUNTERS = ("vLLM does not put cached tokens on its request spans (gen_ai.usage.cached_tokens is never set); "
                        "its prefix-cache figures are the Prometheus counters vllm:prefix_cache_queries and "
                        "vllm:prefix_cache_hits on the engine's /metrics: read them with `rltrace collect --scrape URL`")


#: each engine's prefix-cache counters: (prompt tokens queried, cached tokens of them), and how the
#: figure says where it came from (docs/analysis.md, "Engine metrics")
PREFIX_COUNTERS = {"vllm": ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"),
                   "sglang": ("sglang:prompt_tokens", "sglang:cached_tokens")}
_SAID = {"vllm": "vllm:prefix_cache_hits", "sglang": "sglang:cached_tokens_total"}  # the names users see on /metrics
COUNTERS_KIND = f"measured (Prometheus, {_SAID['vllm']})"
SGLANG_COUNTERS_KIND = f"measured (Prometheus, {_SAID['sglang']})"
#: gauges that are a 0-1 fraction whatever their name says (vLLM's "_perc" included)
FRACTIONS = frozenset({"vllm:kv_cache_usage_perc", "sglang:token_usage", "sglang:cache_hit_rate"})
#: the kept families that are counters (their rise per step is summed); the others are gauges (their peak)
SCRAPED_COUNTERS = frozenset({
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits", "vllm:num_preemptions", "sglang:prompt_tokens", "sglang:cached_tokens",
    "sglang:num_retracted_requests", *(f"sglang:kv_transfer_{h}_{p}" for h in ("speed_gb_s", "latency_ms", "total_mb")
                                       for p in ("sum", "count"))})
MIB = 1 << 20  # SGLang's kv_transfer_total_mb is bytes / (1024 * 1024) (req_time_stats.py)


def from_counters(prefix: dict | None) -> bool:
    """Whether a `prefix_cache` figure comes from the engines' Prometheus counters (not their requests)."""
    return bool(prefix) and str(prefix.get("kind") or "").startswith("measured (Prometheus")


def scraped_metrics(con) -> pd.DataFrame:
    """The engine metrics `rltrace collect --scrape` kept: endpoint, engine, name, value, time_ns (empty when none)."""
    from rltrace.collect.scrape import ROLE

    try:
        return con.execute("SELECT host AS endpoint, rank AS engine, name, value, time_ns FROM metrics "
                           "WHERE role = ? ORDER BY endpoint, engine, name, time_ns", [ROLE]).df()
    except Exception:  # no metrics table in this run
        return pd.DataFrame(columns=["endpoint", "engine", "name", "value", "time_ns"])


def counter_rises(m: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(scrape time_ns, rise since the previous scrape) of counter `name` over every endpoint and engine,
    or None when it was never scraped. The first scrape of an endpoint is the baseline (what the engine
    counted before is not the run's); a series that first appears later began from 0 (SGLang creates a
    labelled series at its first increment); a drop is an engine restart: the counter began again from
    0, so the rise is the new value, never negative."""
    c = m[m["name"] == name]
    if c.empty:
        return None
    up = m[m["name"] == "up"]  # the pages read (rltrace.collect.scrape.UP); older runs have none
    first = (up if len(up) else m).groupby("endpoint")["time_ns"].min()
    times, rises = [], []
    for (endpoint, _), g in c.groupby(["endpoint", c["engine"].fillna(-1)], sort=False):
        v, t = g["value"].to_numpy(float), g["time_ns"].to_numpy(np.int64)
        if t[0] > first.get(endpoint, t[0]):
            v, t = np.concatenate([[0.0], v]), np.concatenate([[first[endpoint]], t])
        d = np.diff(v)
        times.append(t[1:])
        rises.append(np.where(d < 0, v[1:], d))
    return np.concatenate(times), np.concatenate(rises)


def counter_increase(m: pd.DataFrame, name: str) -> float | None:
    """How much counter `name` rose over the scrapes, summed over endpoints and engines (`counter_rises`).
    None when it was never scraped."""
    r = counter_rises(m, name)
    return None if r is None else float(r[1].sum())


def sync_ends(con) -> tuple[np.ndarray, np.ndarray]:
    """(end_ns, weight_version) of the run's finished weight syncs, by end: a version holds from its sync's end."""
    try:
        t = con.execute("SELECT max(end_ns) AS end_ns, weight_version FROM spans WHERE coalesce(phase, name) = "
                        "'weight_sync' AND weight_version IS NOT NULL AND end_ns IS NOT NULL GROUP BY weight_version "
                        "ORDER BY end_ns").df()
    except Exception:  # no spans in this run
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return t["end_ns"].to_numpy(np.int64), t["weight_version"].to_numpy(np.int64)


def rollout_starts(con) -> tuple[np.ndarray, np.ndarray]:
    """(start_ns, step) of the run's rollout windows, by start: a step holds from its rollout's start."""
    try:
        w = marks(con, "window").sort_values(["start_ns", "step"], kind="stable")
    except Exception:  # no spans in this run
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return w["start_ns"].to_numpy(np.int64), w["step"].to_numpy(np.int64)


def _at(bounds, times: np.ndarray) -> list:
    """The key in force at each time: the last of `bounds` (times, keys) at or before it; None before the first."""
    ends, keys = bounds
    k = np.searchsorted(ends, times, side="right") - 1
    return [None if i < 0 else int(keys[i]) for i in k]


def _split_rises(used: dict, bounds, key: str) -> list[dict]:
    """The prefix counters' rises per key in force at each scrape (`_at`): prompt and cached tokens, hit rate."""
    rises: dict = {}
    for pair in used.values():
        for is_hit, r in enumerate(pair):
            if r is None:
                continue
            for k, rise in zip(_at(bounds, r[0]), r[1]):
                rises.setdefault(k, [0.0, 0.0])[is_hit] += float(rise)
    return [{key: k, "requests": None, "prompt_tokens": q, "cached_tokens": h, "hit_rate": h / q if q else None}
            for k, (q, h) in sorted(rises.items(), key=lambda kv: _NO_VERSION if kv[0] is None else kv[0])]


def prefix_cache_counters(m: pd.DataFrame, syncs=None, windows=None) -> dict | None:
    """The run's prefix-cache hit rate from the engines' counters (cached / queried prompt tokens: vLLM's
    prefix_cache_hits / prefix_cache_queries, SGLang's cached_tokens / prompt_tokens), or None;
    `per_version` when weight syncs are recorded: each scrape's rise goes to the version in force
    when it was scraped (a sync between two scrapes puts their rise on the newer version); `per_step`
    when rollouts are recorded (`rollout_starts`): each rise goes to the step whose rollout began last
    before that scrape."""
    used = {e: (counter_rises(m, q), counter_rises(m, h)) for e, (q, h) in PREFIX_COUNTERS.items()}
    used = {e: (q, h) for e, (q, h) in used.items() if q is not None}
    queries = sum(float(q[1].sum()) for q, _ in used.values())
    if not queries:
        return None
    hits = sum(float(h[1].sum()) for _, h in used.values() if h is not None)
    per_version = _split_rises(used, syncs, "weight_version") if syncs is not None and len(syncs[0]) else []
    per_step = _split_rises(used, windows, "step") if windows is not None and len(windows[0]) else []
    return {"kind": f"measured (Prometheus, {', '.join(_SAID[e] for e in used)})",
            "requests": None, "prompt_tokens": queries, "cached_tokens": hits,
            "hit_rate": hits / queries, "hit_rate_within_version": None, "versions_known": bool(per_version),
            "stale_hits": [], "stale_hit_count": None, "stale_cached_tokens": None, "stale_kind": None,  # counters cannot tell
            "may_be_stale_hit_count": None, "may_be_stale_cached_tokens": None, "updates": [], "per_version": per_version, "per_step": per_step}


def metrics_by_step(m: pd.DataFrame, windows) -> list[dict]:
    """Each scraped metric per step (the step whose rollout began last before the scrape, `rollout_starts`):
    a counter's `rise` over the step's scrapes, summed over endpoints and engines (`counter_rises`: a
    restart counted from 0); a gauge's `peak`, the most any one engine showed at a scrape of the step
    (`percent` for the 0-1 fractions). Scrapes before the first rollout are left out."""
    if m.empty or windows is None or not len(windows[0]):
        return []
    out = []
    for name in sorted(set(m["name"]) - {"up"}):
        if name in SCRAPED_COUNTERS:
            r = counter_rises(m, name)
            by = pd.Series(r[1]).groupby(pd.Series(_at(windows, r[0]), dtype="Int64")).sum()
            out += [{"step": int(k), "name": name, "rise": float(v), "peak": None, "percent": None} for k, v in by.items()]
        else:
            g = m[m["name"] == name]
            by = g["value"].groupby(pd.Series(_at(windows, g["time_ns"].to_numpy(np.int64)), index=g.index,
                                              dtype="Int64")).max()
            out += [{"step": int(k), "name": name, "rise": None, "peak": float(v),
                     "percent": 100.0 * float(v) if name in FRACTIONS else None} for k, v in by.items()]
    return sorted(out, key=lambda r: (r["step"], r["name"]))


def kv_link_bandwidth(con, given: float | None = None, scraped_kv: dict | None = None) -> tuple[float | None, str | None]:
    """The KV link's bytes per second and where it came from: `given` (--kv-bandwidth), else measured
    from KV-transfer spans, else from the engines' scraped KV-transfer counters (`scraped_kv`, read
    here when not passed); (None, None) without any. The report and `whatif --pd` both use it."""
    if given is not None:
        return given, "given"
    moved = kv_transfers(con)
    if len(moved):
        return float(moved["kv_bytes"].sum() / moved["kv_transfer_s"].sum()), "measured"
    if scraped_kv is None:
        scraped_kv = kv_transfer_counters(scraped_metrics(con))
    if scraped_kv is not None and scraped_kv["bandwidth"]:
        return scraped_kv["bandwidth"], "measured (Prometheus, sglang:kv_transfer_*)"
    return None, None


def kv_transfer_counters(m: pd.DataFrame) -> dict | None:
    """SGLang's KV transfers over the run from its histograms' _sum and _count (prefill side,
    `compute_and_observe_kv_transfer_metrics`): transfers, bytes (MiB × 2**20), seconds, the bandwidth
    they moved at (bytes / seconds), the mean latency; None when none was scraped. A figure whose
    histogram was not scraped is None (not recorded), never 0."""
    count = counter_increase(m, "sglang:kv_transfer_latency_ms_count")
    if not count:
        return None
    latency_ms = counter_increase(m, "sglang:kv_transfer_latency_ms_sum")
    seconds = None if latency_ms is None else latency_ms / 1000
    moved = counter_increase(m, "sglang:kv_transfer_total_mb_sum")
    nbytes = None if moved is None else moved * MIB
    return {"transfers": count, "bytes": nbytes, "seconds": seconds,
            "latency_ms_mean": None if latency_ms is None else latency_ms / count,
            "bandwidth": nbytes / seconds if nbytes and seconds else None}


def latest_metrics(m: pd.DataFrame) -> list[dict]:
    """Each scraped engine metric's last value, per endpoint and engine (the Engine page's table);
    `percent` for the gauges that are a 0-1 fraction (`FRACTIONS`), None for the others."""
    m = m[m["name"] != "up"]
    if m.empty:
        return []
    last = m.groupby(["endpoint", m["engine"].fillna(-1), "name"], sort=True).tail(1)
    return [{"endpoint": e, "engine": None if pd.isna(g) else int(g), "name": n, "value": float(v), "time_ns": int(t),
             "percent": 100.0 * float(v) if n in FRACTIONS else None}
            for e, g, n, v, t in last[["endpoint", "engine", "name", "value", "time_ns"]].itertuples(index=False)]


SGLANG_PREFILL = ("SGLang's gen_ai.latency.time_in_model_prefill runs from its dispatch to the first token, scheduler "
                  "queueing included: not a prefill time, so it is not used")


def prefix_cache(req: pd.DataFrame, join=None) -> tuple[dict | None, str | None]:
    """(the `prefix_cache` dict, why it is None). Hits are counted on prefill and unified engines
    (a decode engine's prompt KV arrives by transfer).

    A cache hit does not recompute the prefix, so after a weight update whose sync did not flush the
    engines' prefix cache every later hit in that version may be on a prefix the old weights
    computed. Per engine and weight version after the engine's first: `not flushed` when the sync
    recorded `rl.cache_flushed` false or the version's first request on the engine already hit
    (nothing the new weights computed could be cached yet): every hit of it is stale; `flushed` when
    the sync recorded true: none is; else `not recorded`: every hit may be stale (an upper bound,
    counted apart).

    How many of a hit's tokens are stale (`_stale_tokens`): where the request is joined to its sample
    group (`group_id`; `join(rows)` gives it for rows after an update, `engine_requests.groups_of`),
    the group's first request on that engine in that version found only old prefix, and each later
    one hit that old part and what the first computed with the new weights: stale = min(its cached
    tokens, the first's). Without a group, every cached token counts (`stale_kind` "at most")."""
    keep = (req["role"] != "decode") & req["prompt_tokens"].notna() & req["cached_tokens"].notna()
    r = req.loc[keep, ["engine", "engine_kind", "start_ns", "span_id", "request_id", "step", "weight_version", "cache_flushed",
                       "prompt_tokens", "cached_tokens", "prefill_s", "cache_io_s",
                       *(c for c in ("trace_id", "parent_span_id", "group_id") if c in req)]]
    r = r[r["prompt_tokens"] > 0]
    if r.empty:
        kinds = set(req["engine_kind"].dropna()) if "engine_kind" in req else set()
        if "vllm" in kinds and req["cached_tokens"].isna().all():
            return None, VLLM_PREFIX_COUNTERS
        return None, "no request reports both prompt and cached tokens"
    engine = pd.factorize(r["engine"], sort=True)[0]
    order = np.lexsort((r["start_ns"].to_numpy(np.int64), engine))  # stable: ties keep the table's span_id order
    r, engine = r.iloc[order], engine[order]  # by engine, then start
    version = r["weight_version"].astype("Float64")
    group = version.fillna(_NO_VERSION).to_numpy(float)
    versions = pd.factorize(group)[0]
    key = engine * (versions.max() + 1) + versions  # one (engine, version)
    first_of_group = np.zeros(len(r), bool)
    first_of_group[np.unique(key, return_index=True)[1]] = True  # its earliest request: first in this order
    first_on_engine = np.ones(len(r), bool)
    first_on_engine[1:] = engine[1:] != engine[:-1]
    first_group_of_engine = pd.Series(key).groupby(engine).transform("first").to_numpy()
    after_update = key != first_group_of_engine  # a version the engine served after serving an earlier one
    cached_tokens = r["cached_tokens"].to_numpy(float)
    hit = cached_tokens > 0
    recorded = r["cache_flushed"].astype("boolean")
    evidence = pd.Series(first_of_group & hit).groupby(key).transform("any").to_numpy()  # the first request hit
    said_no = (recorded == False).fillna(False).to_numpy(bool)  # noqa: E712 (a nullable column)
    said_yes = (recorded == True).fillna(False).to_numpy(bool)  # noqa: E712
    group_no = pd.Series(said_no).groupby(key).transform("any").to_numpy()
    group_yes = pd.Series(said_yes).groupby(key).transform("all").to_numpy()
    state = np.where(~after_update, None,
                     np.where(group_no | evidence, NOT_FLUSHED, np.where(group_yes, FLUSHED, UNKNOWN)))
    after = (state == NOT_FLUSHED) | (state == UNKNOWN)
    groups = _sample_groups(r, after, join)
    old_tokens, exact = _stale_tokens(key, r["step"], groups, r["engine"].to_numpy() != ROUTER, cached_tokens)
    stale_tokens = np.where(state == NOT_FLUSHED, old_tokens, 0.0)
    maybe_tokens = np.where(state == UNKNOWN, old_tokens, 0.0)
    stale, maybe = stale_tokens > 0, maybe_tokens > 0
    prompt, cached = float(r["prompt_tokens"].sum()), float(cached_tokens.sum())
    stale_cached, maybe_cached = float(stale_tokens.sum()), float(maybe_tokens.sum())
    known = version.notna().any()
    table = pd.DataFrame({"_v": group, "prompt_tokens": r["prompt_tokens"].to_numpy(float), "cached_tokens": cached_tokens,
                          "_stale": stale, "_stale_cached": stale_tokens,
                          "_maybe_cached": maybe_tokens})
    sums = table.groupby("_v", sort=True).agg(requests=("_v", "size"), prompt_tokens=("prompt_tokens", "sum"),
                                              cached_tokens=("cached_tokens", "sum"), stale_hits=("_stale", "sum"),
                                              stale_cached_tokens=("_stale_cached", "sum"),
                                              maybe_cached=("_maybe_cached", "sum"))
    per_version = [{"weight_version": None if v == _NO_VERSION else int(v), "requests": int(n), "prompt_tokens": float(p),
                    "cached_tokens": float(c), "hit_rate": c / p, "stale_hits": int(k), "stale_cached_tokens": float(sc),
                    "may_be_stale_cached_tokens": float(mc), "hit_rate_within_version": (c - sc - mc) / p}
                   for v, n, p, c, k, sc, mc in sums.itertuples()]
    updates = [{"engine": e, "weight_version": None if v == _NO_VERSION else int(v), "cache": st,
                "evidence": ("recorded by the weight sync (rl.cache_flushed)" if st != NOT_FLUSHED or n_ else
                             "its first request after the update already hit the cache"),
                "hits": int(h), "cached_tokens": float(c), "stale_tokens": float(sc) if st == NOT_FLUSHED else 0.0,
                "stale_kind": _kind(ex) if st == NOT_FLUSHED else None}
               for (e, v, st, n_), h, c, sc, ex in _update_rows(r["engine"].to_numpy(), group, state, group_no, hit,
                                                                cached_tokens, stale_tokens, exact | ~hit)]
    named = r.iloc[np.flatnonzero(stale)[:STALE_LISTED]][["engine", "weight_version", "request_id", "span_id",
                                                         "cached_tokens", "start_ns", "step"]]
    hits = [{"engine": e, "weight_version": None if pd.isna(v) else int(v), "request": q if isinstance(q, str) and q else s,
             "cached_tokens": int(c), "stale_tokens": int(k), "start_ns": int(t), "step": None if pd.isna(st) else int(st)}
            for (e, v, q, s, c, t, st), k in zip(named.itertuples(index=False), stale_tokens[stale][:STALE_LISTED])]
    return {
        "requests": len(r), "prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt,
        "hit_rate_within_version": (cached - stale_cached - maybe_cached) / prompt if known else None,
        "versions_known": bool(known), "stale_hits": hits, "stale_hit_count": int(stale.sum()),
        "stale_cached_tokens": stale_cached, "stale_kind": _kind(bool((exact | ~(hit & (state == NOT_FLUSHED))).all())),
        "may_be_stale_hit_count": int(maybe.sum()),
        "may_be_stale_cached_tokens": maybe_cached, "updates": updates,
        "per_version": per_version, "_rows": r,
        "_valid_cached": cached_tokens - stale_tokens - maybe_tokens,
    }, None


#: `stale_kind`: "exact" when every stale hit's request was joined to its sample group, else "at most"
STALE_EXACT, STALE_AT_MOST = "exact", "at most"


def _kind(exact: bool) -> str:
    return STALE_EXACT if exact else STALE_AT_MOST


def _sample_groups(r: pd.DataFrame, after: np.ndarray, join) -> np.ndarray:
    """Each request's sample group (text or None): its own, else `join`'s for the requests after an
    update (only those are weighed, so only their traces are read)."""
    own = r["group_id"].astype(object) if "group_id" in r else pd.Series(None, index=r.index, dtype=object)
    own = own.where(own.notna(), None)
    lacking = after & own.isna().to_numpy()
    if join is not None and lacking.any():
        own = own.copy()
        own[lacking] = join(r[lacking]).to_numpy()
    return own.to_numpy(object)


def _stale_tokens(key: np.ndarray, step: pd.Series, groups: np.ndarray, engine_known: np.ndarray,
                  cached: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the cached tokens per request that the old weights may have computed, whether that figure is
    exact), for requests in the order of `key` (engine then start). A request joined to its sample
    group (`groups`) on a known engine: its group's first request in that (engine, version, step)
    found only old prefix (all its hit), the later ones that and what the first computed with the new
    weights: min(its cached tokens, the first's). Others: every cached token (an upper bound).
    Requests through a router keep the bound: which engine served them, and so whose cache, is unknown."""
    joined = np.array([g is not None and not (isinstance(g, float) and math.isnan(g)) for g in groups], bool) & engine_known
    out = cached.astype(float).copy()
    if joined.any():
        idx = np.flatnonzero(joined)
        steps = step.astype("Float64").fillna(_NO_VERSION).to_numpy(float)[idx]
        frame = pd.DataFrame({"k": key[idx], "s": steps, "g": [str(g) for g in groups[idx]], "c": cached[idx]})
        first = frame.groupby(["k", "s", "g"], sort=False)["c"].transform("first").to_numpy(float)
        out[idx] = np.minimum(cached[idx], first)
    return out, joined


def _update_rows(engine, group, state, said_no, hit, cached, stale_tokens, exact):
    """((engine, version, state, recorded not flushed), hits, cached tokens, stale tokens, all exact)
    per engine and version after an update on that engine, in engine then version order."""
    frame = pd.DataFrame({"e": engine, "v": group, "s": state, "n": said_no, "h": hit, "c": np.where(hit, cached, 0.0),
                          "k": stale_tokens, "x": exact})
    frame = frame[frame["s"].notna()]
    sums = frame.groupby(["e", "v", "s", "n"], sort=True).agg(h=("h", "sum"), c=("c", "sum"), k=("k", "sum"),
                                                               x=("x", "all"))
    return [(k, h, c, sc, bool(x)) for k, h, c, sc, x in zip(sums.index, sums["h"], sums["c"], sums["k"], sums["x"])]


def hicache(prefix: dict | None) -> tuple[dict | None, dict]:
    """(the `hicache` dict, reasons for its null figures): Δt ≈ h · t_avoided_prefill − t_cache_IO,
    with the prefill cost per token fitted over requests without hits (Σ prefill_s / Σ prompt tokens)."""
    if prefix is None:
        return None, {"hicache": "no prefix-cache figures (see prefix_cache)"}
    r, valid_cached = prefix["_rows"], prefix["_valid_cached"]
    missing = {}
    cold = r[(r["cached_tokens"] == 0) & (r["prefill_s"] > 0)]
    per_token = float(cold["prefill_s"].sum() / cold["prompt_tokens"].sum()) if len(cold) else None
    if per_token is None:
        missing["hicache.prefill_s_per_token"] = (SGLANG_PREFILL if (r["engine_kind"] == "sglang").any() else
                                                  "no request without a hit records its prefill time")
    valid = valid_cached[valid_cached > 0]  # the cached tokens known valid, per request with any
    avoided = float(valid.sum()) * per_token if per_token is not None else None
    io = r["cache_io_s"].dropna()
    cache_io = float(io.sum()) if len(io) else None
    if cache_io is None:
        missing["hicache.cache_io_s"] = "not recorded"
    return {"requests_with_hits": len(valid), "valid_cached_tokens": float(valid.sum()),
            "prefill_s_per_token": per_token, "prefill_fitted_on": len(cold), "avoided_prefill_s": avoided,
            "cache_io_s": cache_io, "net_gain_s": avoided - cache_io if avoided is not None and cache_io is not None else None,
            }, missing


# --- load over time and the cache it held --------------------------------------------------------------
def budget(per_engine: pd.DataFrame, geo: dict | None, fp8: dict | None) -> tuple[dict | None, str | None]:
    """(the cache the busiest engine held at its peak, why None): B = N · c_A + K · c_R with K its
    most requests at once and N their tokens; pool ratio r = B_R / B_A; the same with an FP8 KV cache."""
    if geo is None or geo.get("c_A") is None:
        return None, "no cache geometry (see kv_bytes_per_token)"
    known = per_engine.dropna(subset=["peak_requests"])
    if known.empty:
        return None, "no finished engine request: the peak load is unknown"
    top = known.loc[known["peak_requests"].idxmax()]
    slots, tokens = int(top["peak_requests"]), float(top["peak_tokens"])
    attention, state = tokens * geo["c_A"], slots * (geo["c_R"] or 0)
    out = {"engine": top["engine"], "slots": slots, "tokens": tokens, "kv_dtype": geo["kv_dtype"],
           "attention_bytes": attention, "state_bytes": state, "total_bytes": attention + state,
           "state_share": state / (attention + state) if attention + state > 0 else None,
           "pool_ratio": state / attention if attention > 0 else None, "fp8": None}
    if fp8 is not None and fp8["c_A"] != geo["c_A"]:
        a8 = tokens * fp8["c_A"]
        out["fp8"] = {"c_A": fp8["c_A"], "attention_bytes": a8, "total_bytes": a8 + state,
                      "state_share": state / (a8 + state) if a8 + state > 0 else None}
    return out, None


def timeline(req: pd.DataFrame, per_engine: pd.DataFrame) -> list[dict]:
    """Per engine and time bin over the run's requests: in_flight (time-averaged requests in flight)
    and completed_rps (requests that ended in the bin / its length)."""
    done = req[req["end_ns"].notna()]
    if done.empty:
        return []
    lo, hi = int(done["start_ns"].min()), int(done["end_ns"].max())
    edges = np.linspace(0.0, float(max(hi - lo, TIMELINE_BINS)), TIMELINE_BINS + 1)  # ns after lo (float64 at
    width = (edges[1] - edges[0]) / 1e9  # 1.7e18 ns is only exact to 256 ns: times are taken relative to lo)
    busiest = per_engine.sort_values("requests", ascending=False, kind="stable").head(TIMELINE_ENGINES)
    code, names = pd.factorize(done["engine"])
    where = {name: i for i, name in enumerate(names)}
    starts, ends = done["start_ns"].to_numpy(np.int64) - lo, done["end_ns"].to_numpy(np.int64) - lo
    out = []
    for engine, role in zip(busiest["engine"], busiest["role"]):
        mine = code == where[engine]
        s, e = np.sort(starts[mine].astype(float)), np.sort(ends[mine].astype(float))
        cs, ce = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(e)])
        ns_, ne_ = np.searchsorted(s, edges, "right"), np.searchsorted(e, edges, "right")
        area = (ns_ * edges - cs[ns_]) - (ne_ * edges - ce[ne_])  # ∫ requests in flight dt (ns) up to each edge
        in_flight, ended = np.diff(area) / np.diff(edges), np.diff(ne_)
        ended[0] += int(np.count_nonzero(e <= edges[0]))  # ends at the first edge belong to the first bin
        out += [{"engine": engine, "role": role, "start_ns": lo + int(edges[i]), "bin_s": width,
                 "in_flight": float(in_flight[i]), "completed_rps": float(ended[i] / width)} for i in range(TIMELINE_BINS)]
    return out


# --- the report's section ---------------------------------------------------------------------------
def section(con, steps: Steps = None) -> dict:
    """The report's `serving` dict (keys in docs/analysis.md, "Serving capacity")."""
    options = _options(con)
    req = engine_requests(con, steps, columns=_COLUMNS)
    geo, fp8, geo_missing = model_geometry(con, req["engine_kind"].dropna().unique() if "engine_kind" in req else ())
    missing: dict[str, str] = {}
    if req.empty:
        missing["requests"] = "no engine requests recorded (vLLM/SGLang spans via rltrace collect, slime's traces)"
    if geo_missing:
        for key in ("kv_bytes_per_token", "state_bytes_per_slot", "kv_bytes_per_request_mean"):
            missing[key] = geo_missing
    per_engine = engines(req)
    roles = set(req["role"].dropna().unique())
    pd_roles = {"prefill", "decode"} <= set(per_engine["role"].dropna())
    prompt = req[req["role"] == "prefill"] if pd_roles else req
    prompt_mean = mean_of(prompt["prompt_tokens"])
    s_kv = None
    if geo_missing is None and prompt_mean is not None:
        s_kv = prompt_mean * geo["c_A"] + (geo["c_R"] or 0)
    elif geo_missing is None:
        missing["kv_bytes_per_request_mean"] = "no request reports its prompt tokens"
    counters = scraped_metrics(con)
    windows = rollout_starts(con) if len(counters) else None
    scraped_kv = kv_transfer_counters(counters)
    bandwidth, bandwidth_from = kv_link_bandwidth(con, options.get("kv_bandwidth"), scraped_kv)
    balance, why = pd_balance(per_engine, s_kv, bandwidth, bandwidth_from, roles)
    if why:
        missing["pd"] = why
    elif balance["kv_transfer_rps"] is None:
        missing["pd.kv_transfer_rps"] = ((geo_missing or "no request reports its prompt tokens") if s_kv is None else
                                         "no KV bandwidth: no KV-transfer record; give --kv-bandwidth BYTES_PER_S")
    prefix, why = prefix_cache(req, lambda rows: groups_of(con, rows))
    if prefix is None:
        prefix = prefix_cache_counters(counters, *((sync_ends(con), windows) if len(counters) else (None, None)))
        why = None if prefix is not None else why
    if why:
        missing["prefix_cache"] = why
    elif from_counters(prefix):
        missing["prefix_cache.hit_rate_within_version"] = ("from the engines' Prometheus counters over the run: "
                                                           "stale hits cannot be told apart")
    elif prefix["hit_rate_within_version"] is None:
        missing["prefix_cache.hit_rate_within_version"] = "no weight version recorded: stale hits cannot be told"
    cache, cache_missing = hicache(None if prefix is None or from_counters(prefix) else prefix)
    if from_counters(prefix):
        cache_missing = {"hicache": "prefix-cache figures from the engines' counters: no per-request hits to weigh"}
    missing |= cache_missing
    load, why = budget(per_engine, geo, fp8)
    if why:
        missing["budget"] = why
    sync = delta_sync(con, steps)
    if prefix is not None:
        prefix = {k: v for k, v in prefix.items() if not k.startswith("_")}
    return {
        "requests": len(req),
        "engines": per_engine.to_dict("records"),
        "kv_bytes_per_token": None if geo_missing else geo["c_A"],
        "state_bytes_per_slot": None if geo_missing else geo["c_R"],
        "kv_bytes_per_request_mean": s_kv,
        "kv_bandwidth": bandwidth,
        "kv_bandwidth_from": bandwidth_from if bandwidth is not None else None,
        "prompt_tokens_mean": prompt_mean,
        "geometry": geo,
        "kv_bytes_per_token_fp8": None if fp8 is None else fp8["c_A"],
        "pd": balance,
        "prefix_cache": prefix,
        "hicache": cache,
        "budget": load,
        "timeline": timeline(req, per_engine),
        "delta_sync": sync,
        "engine_metrics": latest_metrics(counters),
        "engine_metrics_by_step": metrics_by_step(counters, windows),
        "kv_transfer_metrics": scraped_kv,
        "missing": missing,
    }
