"""Engine requests from every source, one table: who served each request, when, under which weights.

Sources, all read from the spans (docs/analysis.md, "Serving capacity"):
- vLLM and SGLang over OTLP (`rltrace collect`): spans with `gen_ai.latency.*` attributes
  (`gen_ai.usage.prompt_tokens` / `completion_tokens` / `cached_tokens`, `gen_ai.latency.time_in_queue`,
  `time_to_first_token`, `time_in_model_prefill`, `time_in_model_decode`, `e2e`, `gen_ai.request.id`);
- slime (its hook, or `rltrace import slime` of its dumps): `sglang_generate` spans with SGLang's
  `meta_info` as plain attributes (`prompt_tokens`, `cached_tokens`, `queue_time`, `e2e_latency`,
  `decode_throughput`, `sglang_request_id`), with the PD durations slime writes as child spans
  (`sglang_pd_prefill` / `sglang_pd_decode` and their segments) and the transfer summary as an event;
- rltrace's own spans carrying the same names (`rltrace.phase("generate", prompt_tokens=...)`
  stores `rl.prompt_tokens`), and `kv_transfer` spans with `rl.bytes`.

Finding them means reading every span's attribute text (`rltrace.store.requests` holds that SQL),
so finished spans are read once per part: the rows a part's writer stored beside it when it merged
it (`span_requests/`), else the `_parts` sidecars (`requests` for the request fields,
`serving_marks_v2` for rollout windows, weight syncs and the model config stored by
`init(model=...)`); open spans now. Each connection builds the table once.
"""

from __future__ import annotations

import json
import logging

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from rltrace import _model, _names
from rltrace.analysis import _parts
from rltrace.analysis._steps import Steps, step_filter
from rltrace.store import requests

logger = logging.getLogger(__name__)
DELTA_STEPS = ("snapshot", "diff", "encode", "rebuild")  # what a delta weight sync adds (`delta_sync`)
DISAGGREGATED = "disaggregated"  # a request seen by its client (slime) with PD durations: engines unknown
#: slime's spans of the requests it sends to SGLang (through its router: the serving engine is not in its trace)
CLIENT_SPANS = ("sglang_generate", "sglang_generate_stream")
ROUTER = "sglang router"  # the engine those requests are listed under
_OUT = requests.OUT
_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("size", pa.int64()), *requests.ROWS_SCHEMA])
_MARKS_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("size", pa.int64()), ("kind", pa.string()),
                           ("step", pa.int64()), ("weight_version", pa.int64()), ("start_ns", pa.int64()),
                           ("end_ns", pa.int64())])
TABLE = "_rltrace_engine_requests"
FLUSHED = "rl.cache_flushed"  # a weight sync's record of whether the engines' prefix cache was flushed
MARKS_KIND = "serving_marks_v2"  # the sidecar's name: a new name whenever what it holds changes (2: windows by coalesce(phase, name))
COLUMNS = ["engine", "role", "engine_kind", "request_id", "span_id", "name", "process_id", "start_ns", "end_ns", "step",
           "step_from", "weight_version", "version_from", "cache_flushed", *_OUT, "timed", "trace_id", "parent_span_id",
           "group_id"]
GROUP_ANCESTORS = 16  # how far up its trace a request's sample group is looked for (`groups_of`)
VLLM_SPAN = "llm_request"  # the span vLLM's OutputProcessor.do_tracing sends per request
SGLANG_SPAN = "^(prefill|decode|) Req "  # SGLang's TraceReqContext root span: "{disaggregation mode} Req {rid[:8]}"


_q, _sql = requests.q, requests.sql


_MARK_KIND = f"""CASE WHEN name = {_q(_model.MODEL_SPAN)} THEN 'model'
                     WHEN coalesce(phase, name) = 'weight_sync' THEN 'weight_sync'
                     WHEN coalesce(phase, name) IN ({", ".join(_q(n) for n in DELTA_STEPS)}) THEN 'delta_step'
                     WHEN coalesce(phase, name) IN ({", ".join(_q(n) for n in _names.WEIGHT_SYNC_CHILDREN)}) THEN 'sync_child'
                     WHEN step IS NOT NULL AND coalesce(phase, name) IN ('rollout', 'generate') THEN 'window' END"""
#: one pass over each part, reading no text but names: rollout windows and delta steps aggregated
#: (per step / per part), weight syncs and model records one row each (a model's attribute text is
#: read later, from its part only). A part with a per-part summary is read from it (every column
#: used is there, a merged row's first and last times are its spans'), a few rows a step.
_MARKS_SQL = f"""
    SELECT filename, kind, step, any_value(weight_version) AS weight_version, min(start_ns) AS start_ns,
           max(end_ns) AS end_ns
    FROM (SELECT filename, {_MARK_KIND} AS kind, step, weight_version, start_ns, end_ns FROM part_spans)
    WHERE kind IS NOT NULL
    GROUP BY filename, kind, step, CASE WHEN kind IN ('weight_sync', 'model') THEN weight_version END,
             CASE WHEN kind IN ('weight_sync', 'model') THEN start_ns END,
             CASE WHEN kind IN ('weight_sync', 'model') THEN end_ns END"""


def marks(con, kind: str) -> pd.DataFrame:
    """The run's `window` (per step: first start and last end of its rollout/generate spans),
    `weight_sync` (each finished sync: step, weight_version, start_ns, end_ns), `model` (each
    `init(model=...)` record: part, start_ns), `delta_step` (per span part holding a finished
    delta-sync step: its first start, last end) or `sync_child` (likewise for a weight sync's
    child phases: drain, gather, transfer, ...) rows."""
    if not _parts.has_table(con, "spans"):
        return pd.DataFrame(columns=["part", *_MARKS_SCHEMA.names[3:]])
    name = _parts.table(con, MARKS_KIND, _MARKS_SCHEMA, _MARKS_SQL, digests=_names.SPAN_DIGEST.version)
    if kind == "window":
        return con.execute(f"""SELECT step, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM {name}
                               WHERE kind = 'window' GROUP BY step ORDER BY start_ns, step""").df()
    return con.execute(f"SELECT * EXCLUDE (rows, size) FROM {name} WHERE kind = ? "  # one order, ties too
                       "ORDER BY end_ns, start_ns, part, step, weight_version", [kind]).df()


def stored_model(con) -> tuple[dict, str] | None:
    """The model config the run's latest `init(model=...)` stored, with its source; None when none did.
    Its attribute text is read from the one part that holds it."""
    rows = marks(con, "model")
    for part, start in zip(reversed(rows["part"].tolist()), reversed(rows["start_ns"].tolist())):
        found = _model_record(con, part, int(start))
        if found is not None:
            return found
    return None


def _model_record(con, part: str, start_ns: int) -> tuple[dict, str] | None:
    paths = con.execute("SELECT path FROM _rltrace_span_parts WHERE name = ?", [part]).fetchall()
    if not paths:
        return None
    rows = con.execute(f"""SELECT attr(attributes, {_q(_model.CONFIG_ATTR)}), attr(attributes, {_q(_model.SOURCE_ATTR)})
                           FROM read_parquet(?) WHERE name = ? AND start_ns = ?""",
                       [paths[0][0], _model.MODEL_SPAN, start_ns]).fetchall()
    for config, source in rows:
        try:
            value = json.loads(config)
        except (TypeError, ValueError):
            continue  # a damaged record: an older one may still hold
        if isinstance(value, dict):
            return value, source or "stored with the run"
    return None


def _sync_versions(con) -> pa.Table:
    """Finished weight syncs by end: s_end and s_version, the version each installed (its
    `rl.weight_version`; a sync without one counts as the version before it plus one, the first as 1),
    and s_flushed: whether it recorded the engines' prefix cache flushed (`rl.cache_flushed`; null
    when it did not say)."""
    rows = marks(con, "weight_sync")
    rows = rows[rows["end_ns"].notna()]
    versions, last = [], 0
    for v in rows["weight_version"].tolist():
        last = int(v) if not pd.isna(v) else last + 1
        versions.append(last)
    flushed = _flushed(con, rows)
    return pa.table({"s_end": pa.array(rows["end_ns"].to_numpy(np.int64), pa.int64()),
                     "s_version": pa.array(versions, pa.int64()),
                     "s_flushed": pa.array([flushed.get((int(a), int(b))) for a, b in zip(rows["start_ns"], rows["end_ns"])],
                                           pa.bool_())})


def _flushed(con, syncs: pd.DataFrame) -> dict[tuple[int, int], bool]:
    """(start_ns, end_ns) of each weight sync that recorded `rl.cache_flushed` -> its value, read
    from the parts holding syncs only."""
    parts = sorted(set(syncs["part"].dropna()))
    if not parts:
        return {}
    marks_ = ", ".join("?" for _ in parts)
    paths = [p for (p,) in con.execute(f"SELECT path FROM _rltrace_span_parts WHERE name IN ({marks_})", parts).fetchall()]
    if not paths:
        return {}
    try:
        rows = con.execute(f"""SELECT start_ns, end_ns, lower(attr(attributes, {_q(FLUSHED)}))
                               FROM read_parquet(?, union_by_name = true)
                               WHERE coalesce(phase, name) = 'weight_sync' AND contains(attributes, {_q(FLUSHED)})""",
                           [paths]).fetchall()
    except duckdb.Error:  # a part of another layout: its syncs say nothing about flushing
        logger.debug("rltrace: could not read rl.cache_flushed from %s", paths, exc_info=True)
        return {}
    return {(int(a), int(b)): v in ("true", "1") for a, b, v in rows if v in ("true", "false", "1", "0")}


def requests_kind() -> str:
    """The request sidecar's name: a new one whenever the extraction changes (its version)."""
    return "requests_" + "".join(c if c.isalnum() else "_" for c in requests.SQL_VERSION.decode()[:8])


def _requests_by_part(con) -> str:
    """The request rows of every finished span part (a sidecar), scanning only the parts whose
    writer did not record that none of their spans can be one."""
    return _parts.table(con, requests_kind(), _SCHEMA, _sql("filename, ", "part_spans", "true"), only="engine_rows IS NOT false",
                        stored=("requests", requests.SQL_VERSION.decode()))


def table(con) -> str:
    """The name of the connection's engine-requests temp table (built once per connection).

    A request's step and version when it has none of its own are looked up once per distinct start
    time, in narrow ASOF joins (an ASOF join carrying the whole row through its sort took seconds at
    300k requests). Its engine is named once per distinct identity (`_engine_names`)."""
    if _parts.has_table(con, TABLE):
        return TABLE
    finished = _requests_by_part(con)
    windows = marks(con, "window")
    con.register("_rltrace_windows_now", pa.table({c: pa.array(windows[c].to_numpy(np.int64), pa.int64())
                                                   for c in ("step", "start_ns", "end_ns")}))
    con.register("_rltrace_syncs_now", _sync_versions(con))
    resource = ("""(SELECT process_id, json_extract_string(r, '$."rl.engine.role"') AS resource_role,
                           json_extract_string(r, '$."service.instance.id"') AS instance,
                           json_extract_string(r, '$."host.name"') AS host,
                           coalesce(json_extract_string(r, '$."process.pid"'),
                                    json_extract_string(r, '$."vllm.process_id"')) AS pid
                    FROM (SELECT process_id, any_value(resource) AS r FROM processes GROUP BY process_id))"""
                if _parts.has_table(con, "processes") else
                "(SELECT NULL::VARCHAR AS process_id, NULL::VARCHAR AS resource_role, NULL::VARCHAR AS instance, "
                "NULL::VARCHAR AS host, NULL::VARCHAR AS pid)")
    cols = ", ".join(_SCHEMA.names[3:])
    rows = f"{TABLE}_rows"
    try:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {rows} AS
            WITH raw AS (SELECT {cols} FROM {finished} UNION ALL {_sql("", "spans", "is_open")}),
            seg AS (SELECT c.parent_span_id AS request_span, sum(s.prefill_s) AS prefill_s, sum(s.decode_s) AS decode_s,
                           sum(s.kv_transfer_s) AS kv_transfer_s
                    FROM raw s JOIN raw c ON s.parent_span_id = c.span_id
                    WHERE s.kind = 'pd_segment' AND c.kind = 'pd' GROUP BY c.parent_span_id),
            -- the thread span SGLang opens with the request, at its start, in the process that traced it
            -- (a scheduler's thread spans below the same request start later, in another process)
            thread AS (SELECT t.parent_span_id AS request_span, min(t.engine_process) AS engine_process
                       FROM raw t JOIN raw q ON q.span_id = t.parent_span_id AND q.start_ns = t.start_ns
                       WHERE t.kind = 'engine_thread' AND q.kind = 'request' GROUP BY t.parent_span_id),
            req AS (SELECT r.* REPLACE (coalesce(r.prefill_s, g.prefill_s) AS prefill_s,
                                        coalesce(r.decode_s, g.decode_s) AS decode_s,
                                        coalesce(r.kv_transfer_s, g.kv_transfer_s) AS kv_transfer_s,
                                        t.engine_process AS engine_process),
                           g.request_span IS NOT NULL OR r.kv_bytes IS NOT NULL AS pd_seen, p.resource_role, p.instance,
                           p.host, p.pid,
                           CASE WHEN r.name = {_q(VLLM_SPAN)} THEN 'vllm'
                                WHEN regexp_matches(r.name, {_q(SGLANG_SPAN)}) THEN 'sglang' END AS engine_kind
                    FROM raw r LEFT JOIN seg g ON g.request_span = r.span_id
                    LEFT JOIN thread t ON t.request_span = r.span_id
                    LEFT JOIN {resource} p ON p.process_id = r.process_id WHERE r.kind = 'request'),
            starts AS (SELECT DISTINCT start_ns FROM req),
            stepped AS (SELECT t.start_ns, CASE WHEN t.start_ns <= w.end_ns THEN w.step END AS w_step
                        FROM starts t ASOF LEFT JOIN _rltrace_windows_now w ON t.start_ns >= w.start_ns),
            synced AS (SELECT t.start_ns, y.s_version, y.s_flushed
                       FROM starts t ASOF LEFT JOIN _rltrace_syncs_now y ON t.start_ns > y.s_end),
            named AS (SELECT *, CASE WHEN coalesce(role, resource_role) IS NOT NULL
                                         THEN lower(trim(coalesce(role, resource_role)))
                                     WHEN pd_seen THEN {_q(DISAGGREGATED)} ELSE 'unified' END AS role_
                      FROM req)
            SELECT CASE WHEN name IN ({", ".join(_q(n) for n in CLIENT_SPANS)}) THEN {_q(ROUTER)} END AS router,
                   coalesce(service_name, process_id) AS e_service,
                   CASE WHEN role_ IN ('prefill', 'decode') THEN role_ ELSE '' END AS e_role,
                   coalesce(CASE WHEN instance <> process_id THEN instance END, rank::VARCHAR, pid,
                            split_part(engine_process, ':', 2), '') AS e_who,
                   coalesce(host, split_part(engine_process, ':', 1), '') AS e_host,
                   role_ AS role, engine_kind, request_id, span_id, name, process_id, r.start_ns, end_ns,
                   coalesce(step, w_step) AS step,
                   CASE WHEN step IS NOT NULL THEN 'own' WHEN w_step IS NOT NULL THEN 'rollout window' END AS step_from,
                   coalesce(weight_version, s_version) AS weight_version,
                   CASE WHEN weight_version IS NOT NULL THEN 'own'
                        WHEN s_version IS NOT NULL THEN 'weight_sync' END AS version_from,
                   s_flushed AS cache_flushed,
                   {', '.join(c for c in _OUT if c != "prefill_s")},
                   -- SGLang's time_in_model_prefill runs from dispatch to the first token: its scheduler
                   -- queue too, not the prefill's compute (docs/analysis.md, "What each engine's attributes mean")
                   CASE WHEN engine_kind = 'sglang' THEN NULL ELSE prefill_s END AS prefill_s, timed,
                   trace_id, parent_span_id, group_id
            FROM named r JOIN stepped USING (start_ns) JOIN synced USING (start_ns)""")  # unordered: readers sort
    finally:
        con.unregister("_rltrace_windows_now")
        con.unregister("_rltrace_syncs_now")
    keys = con.execute(f"""SELECT DISTINCT router, e_service, e_role, e_who, e_host, process_id FROM {rows}""").df()
    con.register("_rltrace_engine_names", _engine_names(keys))
    try:
        con.execute(f"""CREATE TEMP TABLE IF NOT EXISTS {TABLE} AS
            SELECT n.engine, r.* EXCLUDE (router, e_service, e_role, e_who, e_host)
            FROM {rows} r JOIN _rltrace_engine_names n
              ON n.router IS NOT DISTINCT FROM r.router AND n.e_service IS NOT DISTINCT FROM r.e_service
                 AND n.e_role = r.e_role AND n.e_who = r.e_who AND n.e_host = r.e_host
                 AND n.process_id IS NOT DISTINCT FROM r.process_id""")
    finally:
        con.unregister("_rltrace_engine_names")
        con.execute(f"DROP TABLE IF EXISTS {rows}")
    return TABLE


def _engine_names(keys: pd.DataFrame) -> pd.DataFrame:
    """One name per engine (service, role, host, process): `{service}[-{prefill|decode}][-{instance}]`
    with the instance its `service.instance.id` (a UUID cut to 8 characters), else its rank, else
    its pid (the resource's `process.pid` / `vllm.process_id`, or the pid on SGLang's thread spans);
    engines that would share a name get `@host`, then the process row's id. Prefill 0 and decode 0
    are two engines; so are two SGLang servers of one host whose OTel SDK sets no instance id."""
    keys = keys.copy()

    def base(row) -> str:
        if isinstance(row.router, str):
            return row.router
        who = row.e_who[:8] if len(row.e_who) == 36 and row.e_who.count("-") == 4 else row.e_who  # a UUID
        service = row.e_service if isinstance(row.e_service, str) else ""
        role = "" if row.e_role in service.split("-") else row.e_role  # `vllm-prefill` names it already
        return "-".join(p for p in (service, role, who) if p) or "unknown engine"

    keys["engine"] = [base(r) for r in keys.itertuples(index=False)]
    ident = (keys["e_service"].fillna("") + "\x00" + keys["e_role"] + "\x00" + keys["e_who"] + "\x00"
             + keys["e_host"])
    router = keys["router"].notna()
    for add in (keys["e_host"].radd("@"), keys["process_id"].fillna("").radd("-")):
        # one identity seen through several process rows (a receiver restarted) stays one engine
        clash = ~router & (keys.assign(_i=ident).groupby("engine")["_i"].transform("nunique") > 1)
        keys.loc[clash, "engine"] += add[clash]
    return keys


def engine_requests(con, steps: Steps = None, *, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """One row per engine request of the run (see the module doc for the sources), by start.

    Returns: engine (the sending service and its instance: `vllm-0`; `sglang router` for the
    requests slime sends, whose serving engine its trace does not name), role (`prefill` / `decode`
    / `unified`: the resource attribute `rl.engine.role`, else SGLang's disaggregation mode in the
    span name, else `disaggregated` for a request its client saw with PD durations, else
    `unified`), request_id, span_id, name, process_id, start_ns, end_ns, step and step_from (`own`
    attribute, else `rollout window`: the latest-starting step whose rollout/generate spans span
    the request's start), weight_version and version_from (`own`, else `weight_sync`: the version
    of the last weight_sync that ended before the request started), prompt_tokens,
    completion_tokens, cached_tokens, queue_s, ttft_s, prefill_s, decode_s, e2e_s (seconds),
    decode_throughput (tokens/s), kv_transfer_s, kv_bytes, cache_io_s, timed. A range of steps
    keeps the requests whose step is in it; `columns` (of these) reads only those.
    """
    wanted = list(columns or COLUMNS)
    unknown = sorted(set(wanted) - set(COLUMNS))
    if unknown:
        raise ValueError(f"invalid argument columns: {unknown} are not engine-request columns; valid: {COLUMNS}")
    if not _parts.has_table(con, "spans"):
        return pd.DataFrame(columns=wanted)
    name = table(con)
    where, params = step_filter(steps)
    rows = con.sql(f"SELECT {', '.join(wanted)} FROM {name} WHERE {where} ORDER BY start_ns, span_id",
                   params=params).to_arrow_table()
    # through Arrow: text columns convert several times faster than with .df(); integers stay integers
    return rows.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}.get)


def groups_of(con, req: pd.DataFrame) -> pd.Series:
    """The sample group each request served (text, as recorded; None when unknown): its own
    `rl.group_id` / `slime.group_id`, else that of the nearest span above it in its trace that has
    one (`GROUP_ANCESTORS` levels at most). An engine's request span is a child of the caller's
    span when the caller passes `rltrace.inject()` as the request's headers (vLLM and SGLang read
    `traceparent`), so `with rltrace.phase("generate", group_id=g)` around the call names its group.
    Reads the spans of the requests' traces only when some request has no group of its own."""
    if "group_id" not in req:
        return pd.Series(None, index=req.index, dtype=object)
    own = req["group_id"].astype(object).where(req["group_id"].notna(), None)
    if "trace_id" not in req or "parent_span_id" not in req:
        return own
    need = own.isna() & req["trace_id"].notna() & req["parent_span_id"].notna()
    if not need.any() or not _parts.has_table(con, "spans"):
        return own
    group = "coalesce(" + ", ".join(f"attr(s.attributes, {_q(a)})" for a in _names.GROUP_ATTRS) + ")"
    con.register("_rltrace_group_traces", pa.table({"trace_id": pa.array(sorted(set(req.loc[need, "trace_id"])),
                                                                         pa.string())}))
    try:
        spans = con.execute(f"""SELECT s.trace_id, s.span_id, s.parent_span_id, {group} AS g FROM spans s
                                SEMI JOIN _rltrace_group_traces t ON s.trace_id = t.trace_id""").fetchall()
    finally:
        con.unregister("_rltrace_group_traces")
    up = {(t, s): (p, g) for t, s, p, g in spans}
    found = []
    for trace, parent in zip(req.loc[need, "trace_id"].tolist(), req.loc[need, "parent_span_id"].tolist()):
        group = None
        for _ in range(GROUP_ANCESTORS):
            above = up.get((trace, parent))
            if above is None or above[1] is not None:
                group = None if above is None else above[1]
                break
            parent = above[0]
        found.append(group)
    out = own.copy()
    out[need.to_numpy()] = found
    return out


def kv_transfers(con) -> pd.DataFrame:
    """Every recorded KV transfer with bytes and seconds: requests with SGLang's transfer summary,
    and `kv_transfer` spans with `rl.bytes`. Returns: start_ns, kv_bytes, kv_transfer_s."""
    if not _parts.has_table(con, "spans"):
        return pd.DataFrame(columns=["start_ns", "kv_bytes", "kv_transfer_s"])
    name = table(con)
    finished = _requests_by_part(con)
    return con.execute(f"""SELECT start_ns, kv_bytes, kv_transfer_s FROM {name}
                           WHERE kv_bytes > 0 AND kv_transfer_s > 0
                           UNION ALL
                           SELECT start_ns, kv_bytes, kv_transfer_s FROM {finished}
                           WHERE kind = 'kv_transfer' AND kv_bytes > 0 AND kv_transfer_s > 0
                           ORDER BY start_ns""").df()
