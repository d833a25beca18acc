"""Engine request fields out of a span part's attribute text: the SQL that the report's sidecar
(`rltrace.analysis.engine_requests`) and a writer merging its parts (`rltrace.store.merge`) both run.

Finding requests means reading every span's attribute text, the dearest part of a first report
on a traced run (1.5 s of 5 s at 10M spans). So a writer that merges its spans into a part of
`parts.MARK_ROWS` spans or more, some of which may be requests, stores that part's rows beside
it (`span_requests/<part name>`, footer `rltrace.digest_of` naming the part and
`rltrace.requests_sql` the version of this SQL); a report reads them instead of the spans when
the version is its own, and scans the part otherwise.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from rltrace import _names

#: column -> attribute names, the first present wins (SGLang/slime plain names, rltrace's `rl.` ones, OTel gen_ai)
NUMBERS = {
    "e2e_s": ("e2e_latency", "rl.e2e_latency", "gen_ai.latency.e2e"),
    "queue_s": ("queue_time", "rl.queue_time", "gen_ai.latency.time_in_queue"),
    "decode_throughput": ("decode_throughput", "rl.decode_throughput"),
    "prompt_tokens": ("prompt_tokens", "rl.prompt_tokens", "gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"),
    "completion_tokens": ("completion_tokens", "rl.completion_tokens", "gen_ai.usage.completion_tokens",
                          "gen_ai.usage.output_tokens"),
    "cached_tokens": ("cached_tokens", "rl.cached_tokens", "gen_ai.usage.cached_tokens"),
    "ttft_s": ("gen_ai.latency.time_to_first_token", "rl.ttft_s"),
    "prefill_s": ("gen_ai.latency.time_in_model_prefill", "pd_prefill_forward_duration", "rl.prefill_s"),
    "decode_s": ("gen_ai.latency.time_in_model_decode", "pd_decode_forward_duration", "rl.decode_s"),
    "kv_transfer_s": ("pd_decode_transfer_duration",),
    "cache_io_s": ("rl.cache_io_s",),
    "_kv_mb": ("pd_transfer_total_mb",),  # SGLang: MiB moved for the request's KV ...
    "_kv_gb_s": ("pd_transfer_speed_gb_s",),  # ... at GiB/s
    "_bytes": ("rl.bytes",),  # a `kv_transfer` span's payload
}
TEXTS = {"request_id": ("gen_ai.request.id", "sglang_request_id", "rl.request_id", "rid"), "role": ("rl.engine.role",),
         # the sample group a request served, on its own span (slime's `sglang_generate`, an rltrace phase)
         "group_id": _names.GROUP_ATTRS,
         # SGLang's thread span below each request: which server process handled it (`engine_thread` rows)
         "_host_id": ("host_id",), "_pid": ("pid",), "_thread_label": ("thread_label",)}
#: what makes a span a request: SGLang's meta (what slime reads), or any OTel gen_ai latency
GEN_AI_LATENCY = tuple(k for keys in NUMBERS.values() for k in keys if k.startswith("gen_ai.latency."))
PD_SPANS = ("sglang_pd_prefill", "sglang_pd_decode")  # slime's PD children of a request (segments below them)
KV_TRANSFER = _names.KV_TRANSFER
MIB, GIB = 2**20, 2**30
OUT = _names.REQUEST_FIELDS
ROWS_SCHEMA = _names.SPAN_REQUESTS_SCHEMA  # a span's request row (`sql`), as the report's sidecar keeps it and a writer stores it
#: a cheap text test before the JSON parse (each search costs about 0.6 s at 10M spans); parts whose
#: writer found none of these (`_names.META_ENGINE_ROWS`) are not scanned at all
MENTIONS = " OR ".join(f"contains(attributes, '{a}')" for a in _names.ENGINE_ATTR_MARKS)
PD_NAMES = f"starts_with(name, '{_names.PD_NAME_PREFIX}')"  # not LIKE: `_` is its wildcard
THREAD_NAMES = f"contains(name, '{_names.ENGINE_THREAD_MARK}')"


def q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def sql(keep: str, source: str, where: str) -> str:
    """Rows (kind request / pd / pd_segment / kv_transfer / engine_thread) of the spans of `source`:
    each span's attribute text parsed once for every field. An `engine_thread` row (SGLang's span of
    the thread that handled a request, a child of the request's span) holds `host_id:pid` in
    `engine_process`."""
    keys = [k for keys in (*NUMBERS.values(), *TEXTS.values()) for k in keys]
    at = {k: f"v[{i + 1}]" for i, k in enumerate(keys)}
    paths = ", ".join(f"'$.\"{k}\"'" for k in keys)
    first = {c: "coalesce(" + ", ".join(at[k] for k in names) + ")" for c, names in {**NUMBERS, **TEXTS}.items()}
    num = {c: f"TRY_CAST({first[c]} AS DOUBLE)" for c in NUMBERS}
    sglang = " OR ".join(f"{at[k]} IS NOT NULL" for c in ("e2e_s", "queue_s", "decode_throughput") for k in NUMBERS[c])
    gen_ai = " OR ".join(f"{at[k]} IS NOT NULL" for k in GEN_AI_LATENCY)
    segment = " OR ".join(f"{at[k]} IS NOT NULL" for k in ("pd_prefill_forward_duration", "pd_decode_forward_duration",
                                                            "pd_decode_transfer_duration"))
    timed = " OR ".join(f"{at[k]} IS NOT NULL" for k in (*NUMBERS["e2e_s"], *NUMBERS["decode_throughput"]))
    event = {c: f"TRY_CAST(json_extract_string(events, '$[*].attributes.{a}')[1] AS DOUBLE)"
             for c, a in (("_kv_mb", "pd_transfer_total_mb"), ("_kv_gb_s", "pd_transfer_speed_gb_s"))}
    mb = f"coalesce({num['_kv_mb']}, CASE WHEN contains(events, 'pd_transfer_total_mb') THEN {event['_kv_mb']} END)"
    gb_s = f"coalesce({num['_kv_gb_s']}, CASE WHEN contains(events, 'pd_transfer_speed_gb_s') THEN {event['_kv_gb_s']} END)"
    is_kv = f"coalesce(phase, name) = {q(KV_TRANSFER)}"
    kv_bytes = f"CASE WHEN {is_kv} THEN {num['_bytes']} ELSE {mb} * {MIB} END"
    kv_s = (f"CASE WHEN {is_kv} THEN (end_ns - start_ns) / 1e9 "
            f"ELSE coalesce({mb} * {MIB} / nullif({gb_s} * {GIB}, 0), {num['kv_transfer_s']}) END")
    plain = ", ".join(f"{num[c]} AS {c}" for c in OUT if c not in ("kv_bytes", "kv_transfer_s"))
    pd_names = ", ".join(q(n) for n in PD_SPANS)
    # ids as hex text, as the `spans` view shows them (parts store them as integers)
    ids = ("span_hex(span_id) AS span_id, span_hex(parent_span_id) AS parent_span_id, trace_hex(trace_id) AS trace_id"
           if source == "part_spans" else "span_id, parent_span_id, trace_id")
    return f"""SELECT {keep}kind, span_id, parent_span_id, name, process_id, service_name, rank, step, weight_version,
               start_ns, end_ns, timed, request_id, role, engine_process, trace_id, group_id, {', '.join(OUT)}
        FROM (SELECT {keep}CASE WHEN {sglang} OR {gen_ai} THEN 'request' WHEN name IN ({pd_names}) THEN 'pd'
                              WHEN {segment} THEN 'pd_segment' WHEN {is_kv} THEN 'kv_transfer'
                              WHEN {first['_thread_label']} IS NOT NULL AND {first['_pid']} IS NOT NULL
                                   THEN 'engine_thread' END AS kind,
                     {ids}, name, process_id, service_name, rank, step, weight_version, start_ns,
                     end_ns, coalesce({timed}, false) AS timed, {first['request_id']} AS request_id,
                     lower(coalesce({first['role']}, CASE WHEN name LIKE 'prefill Req %' THEN 'prefill'
                                                          WHEN name LIKE 'decode Req %' THEN 'decode' END)) AS role,
                     coalesce({first['_host_id']}, '') || ':' || {first['_pid']} AS engine_process,
                     {first['group_id']} AS group_id,
                     {plain}, {kv_bytes} AS kv_bytes, {kv_s} AS kv_transfer_s
              FROM (SELECT {keep}*, json_extract_string(attributes, [{paths}]) AS v FROM {source}
                    WHERE {where} AND ({MENTIONS} OR {PD_NAMES} OR {THREAD_NAMES} OR {is_kv})))
        WHERE kind IS NOT NULL"""


#: the version of the extraction: rows a writer stored under another version are not used
SQL_VERSION = hashlib.sha256(sql("filename, ", "part_spans", "true").encode()).hexdigest()[:16].encode()


def rows_of(spans: pa.Table) -> pa.Table:
    """The request rows (`ROWS_SCHEMA`) of finished span rows of the current schema version, computed
    on one thread (this runs in a writer's background merge, beside someone's training loop)."""
    import duckdb

    from rltrace.store import ids

    con = duckdb.connect(":memory:", config={"threads": 1})
    try:
        for macro in ids.SQL_MACROS:
            con.execute(macro)
        con.register("part_spans", spans)
        out = con.sql(sql("", "part_spans", "true")).to_arrow_table()
    finally:
        con.close()
    return out.select(ROWS_SCHEMA.names).cast(ROWS_SCHEMA)
