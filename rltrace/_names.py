"""Names every part of rltrace agrees on: span attributes, table columns, schema versions.

This module is the contract between the instrumentation, the store, the analyses, replay and
the dashboard (see docs/store.md). It imports nothing from rltrace; anything may import it.
Extend these names, never rename them: stored runs outlive the code that wrote them.
"""

from __future__ import annotations

import re

import pyarrow as pa

# --- span attributes -------------------------------------------------------------------------
ATTR_PREFIX = "rl."
PHASE = "rl.phase"
STEP = "rl.step"
WEIGHT_VERSION = "rl.weight_version"
ROLE = "rl.role"
RANK = "rl.rank"
RUN_ID = "rl.run_id"
SYNC_BYTES = "rl.bytes"  # weight_sync payload size
SYNC_METHOD = "rl.method"  # weight_sync path: ipc, nccl, gloo, disk, delta, object_store, ...
WAITING_FOR = "rl.waiting_for"  # wait spans: the phase being awaited, when the caller knows it
#: rollout spans: why the rollout's sampling log-probs (and so mismatch) could not be recorded
MISMATCH_MISSING = "rl.mismatch_missing"
THREAD_ID = "thread.id"  # OpenTelemetry semantic convention
THREAD_NAME = "thread.name"
#: Status message of a phase still open when its process exited (or its run shut down): rltrace
#: ends it with status ERROR and this message, and the health analysis lists it with open spans.
UNFINISHED_AT_EXIT = "the process exited (or its run was shut down) while this phase was open"


#: Phase names the analyses know. Users may add their own.
PHASES = (
    "step",
    "rollout",
    "generate",
    "reward",
    "train",
    "forward",
    "backward",
    "optimizer",
    "weight_sync",
    "eval",
    "wait",
    "drain",
    "gather",
    "transfer",
    "load",
    "resume",
)

#: Child phases of `weight_sync`, in the order they run (docs/store.md): waiting for in-flight
#: generation to finish or abort, collecting the weights, moving them, the engine loading them,
#: and generation starting again. Each may carry `rl.bytes`.
WEIGHT_SYNC_CHILDREN = ("drain", "gather", "transfer", "load", "resume")


# --- names of the OpenTelemetry `rl.*` proposal ------------------------------------------------------
# open-telemetry/semantic-conventions-genai issue #88 (open, not final): rltrace tracks it and writes
# its names *alongside* its own where they map (docs/store.md). The proposal names the resource
# attribute `rl.run.id` and the groups rl.loop / rl.sample / rl.reward / rl.train / rl.sync; it
# gives no span attribute for the group, so rltrace puts it in `rl.operation.name` (after
# `gen_ai.operation.name`) until the proposal settles one.
SEMCONV_RUN_ID = "rl.run.id"
SEMCONV_OPERATION = "rl.operation.name"

#: Attributes rltrace sets itself: set first on every span and never cut by the attribute limit.
RESERVED_ATTRS = frozenset(
    (PHASE, STEP, WEIGHT_VERSION, ROLE, RANK, RUN_ID, SYNC_BYTES, SYNC_METHOD, WAITING_FOR, THREAD_ID, THREAD_NAME,
     SEMCONV_OPERATION)
)
SEMCONV_GROUP_OF_PHASE = {
    "step": "rl.loop",
    "rollout": "rl.sample",
    "generate": "rl.sample",
    "reward": "rl.reward",
    "train": "rl.train",
    "forward": "rl.train",
    "backward": "rl.train",
    "optimizer": "rl.train",
    "weight_sync": "rl.sync",
    "drain": "rl.sync",
    "gather": "rl.sync",
    "transfer": "rl.sync",
    "load": "rl.sync",
    "resume": "rl.sync",
}


def attr_key(key: str) -> str:
    """Span attribute name for a `phase(**attrs)` keyword: `rl.<key>`, or `key` if it holds a dot."""
    return key if "." in key else ATTR_PREFIX + key


# --- step scalars (log_metrics) and per-sample columns (log_samples) --------------------------
METRICS = (
    "reward_mean",
    "reward_std",
    "response_len_mean",
    "train_rollout_logprob_abs_diff",
    "mismatch_k3",
    "tis_mean",
    "tis_clipfrac",
    "staleness_mean",
    "staleness_max",
    "loss",
    "grad_norm",
    "tokens_per_s",
)

#: The step scalars that compare the rollout engine's log-probs with the trainer's (docs/analysis.md).
MISMATCH_METRICS = ("train_rollout_logprob_abs_diff", "mismatch_k3", "tis_mean", "tis_clipfrac")

#: Other names frameworks log the step scalars above under, in order of preference (the canonical
#: name first, then `train/`, `rollout/` or `perf/` + the canonical name, then these). One table
#: for every reader: the report, the dashboard and `rltrace import metrics`. docs/analysis.md.
METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "reward_mean": (
        "reward",  # TRL
        "critic/rewards/mean",  # verl
        "critic/score/mean",  # verl, before reward shaping
        "rollout/raw_reward",  # slime
        "rollout/rewards",  # slime
    ),  # OpenRLHF's rollout/reward_mean: the prefix rule
    "reward_std": ("critic/rewards/std",),  # verl; TRL logs reward_std itself
    "response_len_mean": (
        "completions/mean_length",  # TRL
        "response_length/mean",  # verl
        "rollout/response_len/mean",  # slime
        "rollout/response_length_mean",  # OpenRLHF
    ),
    # TRL averages |Δ log p| over all tokens of the batch (slime: over samples first)
    "train_rollout_logprob_abs_diff": ("sampling/sampling_logp_difference/mean",),  # TRL with vLLM
    "mismatch_k3": ("rollout_corr/k3_kl",),  # verl
    "tis_mean": (
        "sampling/importance_sampling_ratio/mean",  # TRL with vLLM
        "rollout_corr/rollout_is_mean",  # verl
        "train/tis",  # slime
    ),
    "tis_clipfrac": ("rollout_corr/rollout_is_ratio_fraction_high",),  # verl; slime's train/tis_clipfrac: prefix
    "loss": ("actor/pg_loss", "policy_loss"),  # verl, OpenRLHF
    "grad_norm": ("actor/grad_norm", "actor_grad_norm"),  # verl, OpenRLHF
    "tokens_per_s": ("perf/throughput",),  # verl
}
METRIC_PREFIXES = ("train/", "rollout/", "perf/")


def metric_names(canonical: str) -> tuple[str, ...]:
    """Every logged name that counts as `canonical`, most preferred first."""
    return (canonical, *(p + canonical for p in METRIC_PREFIXES), *METRIC_ALIASES.get(canonical, ()))


def canonical_metric(name: str) -> str | None:
    """The step scalar a logged name counts as (`critic/rewards/mean` -> `reward_mean`), or None."""
    if name in METRICS:
        return name
    for canonical in METRICS:
        if name in metric_names(canonical):
            return canonical
    return None


#: Canonical types of the per-sample columns; other columns keep the type they arrive with.
SAMPLE_COLUMNS: dict[str, pa.DataType] = {
    "sample_id": pa.string(),  # ids are text: integers and strings (verl's UUIDs) read as one column
    "group_id": pa.string(),
    "prompt_len": pa.int64(),
    "response_len": pa.int64(),
    "finish_reason": pa.string(),
    "reward": pa.float64(),
    "weight_version": pa.int64(),  # v_s; the oldest version when a sample spans several
    "weight_versions": pa.list_(pa.int64()),  # every version, when a sample spans several
    "train_version": pa.int64(),  # v_t
    "gen_start": pa.float64(),  # Unix seconds
    "gen_end": pa.float64(),
}

#: Id-like sample columns, stored as text; so is any column named `*_id` or `*_uid`.
ID_COLUMNS = frozenset(("sample_id", "group_id", "uid", "id"))

# --- tables ------------------------------------------------------------------------------------
#: Parquet key-value metadata written into every part file.
META_TABLE = b"rltrace.table"
META_VERSION = b"rltrace.schema_version"
META_REPLACES = b"rltrace.replaces"  # compacted parts: JSON list of the part names they replace
META_RUN_ID = b"rltrace.run_id"  # the run a part belongs to (a part linked in from another run is refused)
META_SUMMARY_OF = b"rltrace.summary_of"  # step_summary: digest of the span parts it was computed from
META_DIGEST_OF = b"rltrace.digest_of"  # span_digest: JSON [name, rows] of the span part it summarises
META_REQUESTS_SQL = b"rltrace.requests_sql"  # span_requests: the version of the SQL that found them
META_RECEIVED = b"rltrace.received_from"  # span parts of a receiver or an import: JSON list of the sessions whose spans it holds
#: spans parts: b"0" when no span of the part can be an engine request row (`ENGINE_ATTR_MARKS` and the
#: names below), b"1" when one may; the serving sidecar does not scan a part marked 0. Bump the suffix
#: whenever the marks change, so parts marked under the old ones are scanned again.
META_ENGINE_ROWS = b"rltrace.engine_rows.2"
#: spans parts of MARK_ROWS or more: b"0" when no span's attribute text holds `MISMATCH_MISSING`
#: (what `rltrace.analysis.mismatch.missing` looks for), b"1" when one may
META_MISMATCH_MISSING = b"rltrace.mismatch_missing.1"

# --- engine request rows (rltrace.analysis.engine_requests) ------------------------------------
#: Text in a span's attribute JSON that every engine request field's key contains: SGLang's
#: e2e_latency and each gen_ai.latency.* (`latency`), SGLang's queue_time and decode_throughput
#: (with the key's closing quote, not its opening one: a search starting with `"`, the commonest
#: character in JSON, stops at every key).
ENGINE_ATTR_MARKS = ("latency", 'queue_time"', 'decode_throughput"')
#: in the name of SGLang's per-thread span below each request ("… (host:1a2b3c4d | pid:123)"): its
#: host_id and pid attributes tell apart servers whose resources are alike (a name test: names are
#: short, attribute text is not)
ENGINE_THREAD_MARK = "| pid:"
PD_NAME_PREFIX = "sglang_pd_"  # slime's spans of a disaggregated request and its segments
KV_TRANSFER = "kv_transfer"  # a span (phase or name) that moved KV: `rl.bytes` over its duration

_PROCESS_COLUMNS = [
    pa.field("process_id", pa.string()),
    pa.field("role", pa.string()),
    pa.field("rank", pa.int64()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
]

SPANS_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.binary(16)),  # the 128-bit trace id, big-endian (schema 1: 32 hex digits)
        pa.field("span_id", pa.int64()),  # the 64-bit span id read as signed (schema 1: 16 hex digits)
        pa.field("parent_span_id", pa.int64()),  # null for a root span
        pa.field("name", pa.string()),
        pa.field("phase", pa.string()),  # rl.phase
        pa.field("step", pa.int64()),  # rl.step
        pa.field("weight_version", pa.int64()),  # rl.weight_version
        pa.field("start_ns", pa.int64()),  # Unix epoch nanoseconds
        pa.field("end_ns", pa.int64()),  # null while the span is open
        pa.field("status", pa.string()),  # UNSET / OK / ERROR
        pa.field("status_message", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("thread_id", pa.int64()),
        pa.field("thread_name", pa.string()),
        *_PROCESS_COLUMNS,
        pa.field("service_name", pa.string()),
        pa.field("attributes", pa.string()),  # JSON object of every span attribute
        pa.field("events", pa.string()),  # JSON list of {name, time_ns, attributes}, or null
        pa.field("links", pa.string()),  # JSON list of {trace_id, span_id}, or null
    ]
)

METRICS_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("time_ns", pa.int64()),
        *_PROCESS_COLUMNS,
    ]
)

#: Samples always carry these; the per-sample columns above and the user's extras follow.
SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64()),
        pa.field("logged_ns", pa.int64()),
        *_PROCESS_COLUMNS,
        *[pa.field(name, typ) for name, typ in SAMPLE_COLUMNS.items()],
    ]
)

PROCESSES_SCHEMA = pa.schema(
    [
        *_PROCESS_COLUMNS,
        pa.field("run_id", pa.string()),
        pa.field("service_name", pa.string()),
        pa.field("started_ns", pa.int64()),
        pa.field("heartbeat_ns", pa.int64()),  # last time the process wrote to the store
        pa.field("ended_ns", pa.int64()),  # null unless rltrace.shutdown() ran
        pa.field("spans_written", pa.int64()),
        pa.field("spans_dropped", pa.int64()),  # lost before reaching the store (full queue, failed write)
        pa.field("otlp_spans_dropped", pa.int64()),  # lost before reaching the OTLP backend
        pa.field("rows_written", pa.int64()),  # metrics + samples rows
        pa.field("rows_dropped", pa.int64()),
        pa.field("attributes_dropped", pa.int64()),  # span attributes cut by the attribute count limit
        pa.field("drop_reasons", pa.string()),  # JSON list of {table, column, reason, count}: why rows were dropped
        pa.field("rltrace_version", pa.string()),
        pa.field("argv", pa.string()),  # JSON list
        pa.field("resource", pa.string()),  # JSON object of OTel resource attributes
    ]
)


#: Frozen batches (debug replay, docs/replay.md): one row per sample, one part per frozen batch.
#: Batch-level fields are repeated on every row (dictionary-encoded, so nearly free); user
#: columns (token arrays as list columns, any extra field) follow these fixed ones.
BATCH_COLUMNS: dict[str, pa.DataType] = {
    "step": pa.int64(),
    "batch_id": pa.string(),  # several batches may be frozen at one step
    "sample_index": pa.int64(),  # position in the batch, 0..n_samples-1
    "n_samples": pa.int64(),
    "frozen_ns": pa.int64(),  # Unix epoch nanoseconds of the freeze call
    "trigger": pa.string(),  # every_n / on_demand / request / anomaly / import
    "reason": pa.string(),
    "train_version": pa.int64(),  # v_t: trainer weight version at this step
    "tokenizer_name": pa.string(),
    "tokenizer_hash": pa.string(),  # sha256 of the vocabulary (see rltrace.replay.tokenizer_identity)
    "checkpoint": pa.string(),  # where the weights of this step can be loaded from
    "config": pa.string(),  # JSON
    "batch_meta": pa.string(),  # JSON of the other batch_meta keys
    "codec": pa.string(),  # JSON: how each user column was given (kind, dtype, layout, shape) for bit-exact load
    "form": pa.string(),  # "rows" (list of dicts) or "columns" (dict of columns)
    "process_id": pa.string(),
    "role": pa.string(),
    "rank": pa.int64(),
    "host": pa.string(),
    "pid": pa.int64(),
}
#: Per-sample columns of a frozen batch with a fixed meaning and type (all optional).
#: Array columns (prompt_tokens, response_tokens, loss_mask, rollout_log_probs, train_log_probs,
#: advantages) keep the dtype they were given, so they are not listed here.
BATCH_SAMPLE_COLUMNS: dict[str, pa.DataType] = {
    "sample_id": pa.int64(),
    "group_id": pa.int64(),
    "reward": pa.float64(),
    "reward_components": pa.string(),  # JSON object
    "weight_version": pa.int64(),  # v_s
    "weight_versions": pa.list_(pa.int64()),  # every version, when a sample spans several
    "seed": pa.int64(),
    "sampling_params": pa.string(),  # JSON object
    "finish_reason": pa.string(),
    "prompt_text": pa.string(),
    "response_text": pa.string(),
    "metadata": pa.string(),  # JSON object
}
BATCHES_SCHEMA = pa.schema([pa.field(n, t) for n, t in {**BATCH_COLUMNS, **BATCH_SAMPLE_COLUMNS}.items()])

#: Results of `rltrace replay run`: one row per sample per repeat, next to the batch they replay.
REPLAYS_SCHEMA = pa.schema(
    [
        pa.field("replay_id", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("batch_id", pa.string()),
        pa.field("entry", pa.string()),  # module:function
        pa.field("label", pa.string()),
        pa.field("args", pa.string()),  # JSON of the keyword arguments given to the entry
        pa.field("repeat", pa.int64()),  # 0..n_repeats-1
        pa.field("n_repeats", pa.int64()),
        pa.field("sample_index", pa.int64()),
        pa.field("started_ns", pa.int64()),
        pa.field("duration_s", pa.float64()),
        pa.field("codec", pa.string()),
        pa.field("reward", pa.float64()),
    ]
)


#: One row per profile (py-spy recording or dump, torch.profiler window), tied to the span it explains.
PROFILES_SCHEMA = pa.schema(
    [
        pa.field("profile_id", pa.string()),
        pa.field("trace_id", pa.string()),  # the span it explains (join spans on trace_id, span_id)
        pa.field("span_id", pa.string()),
        pa.field("span_name", pa.string()),
        pa.field("phase", pa.string()),
        pa.field("step", pa.int64()),
        *_PROCESS_COLUMNS,
        pa.field("native_thread_id", pa.int64()),  # OS thread id (py-spy's) of the thread that ran the phase
        pa.field("kind", pa.string()),  # pyspy_record / pyspy_dump / torch
        pa.field("trigger", pa.string()),  # slow (relative or absolute limit) / hang / window / manual
        pa.field("reason", pa.string()),  # why it was taken, in words
        pa.field("elapsed_s", pa.float64()),  # how long the phase had run when it was triggered
        pa.field("threshold_s", pa.float64()),  # the limit it crossed
        pa.field("median_s", pa.float64()),  # the phase's rolling median then (null for an absolute limit)
        pa.field("path", pa.string()),  # artefact, relative to the run dir; null if none was made
        pa.field("size_bytes", pa.int64()),
        pa.field("status", pa.string()),  # running / ok / no_samples / missing_executable / permission_denied / failed
        pa.field("message", pa.string()),
        pa.field("samples", pa.int64()),  # py-spy: samples of the phase's thread inside the phase; torch: events
        pa.field("inside_share", pa.float64()),  # py-spy: share of its samples of the phase's thread inside the phase
        pa.field("idle_share", pa.float64()),  # py-spy: share of the recorded time the phase's thread was blocked
        pa.field("stacks", pa.string()),  # py-spy record: folded stacks inside the phase, the 200 most sampled ("a;b;c N" lines)
        pa.field("command", pa.string()),  # the py-spy command line (JSON list), null for torch
        pa.field("started_ns", pa.int64()),
        pa.field("ended_ns", pa.int64()),
    ]
)

#: The hottest frames of a profile, so nobody has to open the file to see where time went.
PROFILE_FRAMES_SCHEMA = pa.schema(
    [
        pa.field("profile_id", pa.string()),
        pa.field("rank", pa.int64()),  # 0 = most self time (a dump: 0 = innermost frame)
        pa.field("frame", pa.string()),  # function, or torch operator
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("self_share", pa.float64()),  # share of samples with this frame innermost (0..1)
        pa.field("total_share", pa.float64()),  # share of samples with this frame on the stack (0..1)
        pa.field("samples", pa.int64()),  # samples with this frame innermost (torch: self time in us)
        pa.field("thread", pa.string()),  # thread (or process/thread) the samples come from
    ]
)

#: Per-step results that `rltrace compact` precomputes so reports over millions of spans stay fast
#: (see docs/analysis.md). One long table: `kind` says which columns a row uses.
STEP_SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64()),
        pa.field("kind", pa.string()),  # step / phase / stage / wait / path / sync
        pa.field("seq", pa.int64()),  # order within a step's critical path
        pa.field("process_id", pa.string()),
        pa.field("phase", pa.string()),
        pa.field("other", pa.string()),  # waits: phase waited for; path: phase of the child that ended last
        pa.field("other_process_id", pa.string()),
        pa.field("detail", pa.string()),  # waits: idle / wait_span / declared; path: span name
        pa.field("span_id", pa.string()),
        pa.field("start_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("seconds", pa.float64()),
        pa.field("count", pa.int64()),
        pa.field("total_ns", pa.int64()),  # sum of span durations; with count, the step's fingerprint
        pa.field("version", pa.int64()),  # version of the algorithm that computed the row
        # step rows: every finished span overlapping the step's time range, with a step or without
        # (a reward server that never got the carrier): count and summed durations, so late spans recompute
        pa.field("window_count", pa.int64()),
        pa.field("window_ns", pa.int64()),
    ]
)


#: Per-part summaries of spans (`rltrace.store.digest`): a span part's spans as the per-step analysis
#: reads them, with leaves merged into unions. One file per span part, beside it (`span_digests/`).
SPAN_DIGEST_SCHEMA = pa.schema(
    [
        pa.field("span_id", pa.int64()),  # null on a row that merges spans
        pa.field("parent_span_id", pa.int64()),
        pa.field("phase", pa.string()),  # coalesce(rl.phase, name, '')
        pa.field("name", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("process_id", pa.string()),
        pa.field("thread_id", pa.int64()),
        pa.field("start_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("waiting_for", pa.string()),  # wait spans: rl.waiting_for
        pa.field("sync_bytes", pa.float64()),  # weight_sync spans: rl.bytes
        pa.field("sync_method", pa.string()),  # weight_sync spans: rl.method
        pa.field("count", pa.int64()),  # spans in the row
        pa.field("total_ns", pa.int64()),  # their summed durations
        pa.field("same_thread", pa.bool_()),  # merged rows: their spans ran on their parent's thread
        pa.field("parent_thread_id", pa.int64()),  # merged rows: that parent's thread (-1 unknown)
        pa.field("weight_version", pa.int64()),  # version 2: rl.weight_version (a merged row's: its first span's)
    ]
)


#: Engine request rows of a span part (`rltrace.store.requests`), stored by the writer that merged
#: it (`span_requests/<part name>`): what a report would otherwise read every span's attributes for.
REQUEST_FIELDS = ("e2e_s", "queue_s", "decode_throughput", "prompt_tokens", "completion_tokens", "cached_tokens",
                  "ttft_s", "prefill_s", "decode_s", "kv_transfer_s", "kv_bytes", "cache_io_s")
SPAN_REQUESTS_SCHEMA = pa.schema([("kind", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()),
                                  ("name", pa.string()), ("process_id", pa.string()), ("service_name", pa.string()),
                                  ("rank", pa.int64()), ("step", pa.int64()), ("weight_version", pa.int64()),
                                  ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("timed", pa.bool_()),
                                  ("request_id", pa.string()), ("role", pa.string()), ("engine_process", pa.string()),
                                  ("trace_id", pa.string()), ("group_id", pa.string()),
                                  *((c, pa.float64()) for c in REQUEST_FIELDS)])
#: span attributes naming the sample group a span works on (rltrace's `phase(..., group_id=...)`, slime's traces)
GROUP_ATTRS = ("rl.group_id", "slime.group_id")


#: Uncaught exceptions (docs/integrations.md): one row per exception that reached the top of a
#: thread (`kind` thread: the thread died) or of the process (`kind` process: it exited).
CRASHES_SCHEMA = pa.schema(
    [
        *_PROCESS_COLUMNS,
        pa.field("time_ns", pa.int64()),  # Unix epoch nanoseconds
        pa.field("kind", pa.string()),  # process / thread
        pa.field("thread_name", pa.string()),
        pa.field("thread_id", pa.int64()),
        pa.field("exc_type", pa.string()),  # RuntimeError, or module.Name for other modules' types
        pa.field("message", pa.string()),
        pa.field("traceback", pa.string()),  # the innermost frames, formatted
        pa.field("phase", pa.string()),  # innermost phase the exception escaped through; null if none
        pa.field("step", pa.int64()),  # that phase's rl.step
        pa.field("span_id", pa.string()),  # that phase's span
        pa.field("phases", pa.string()),  # JSON list of every phase it escaped through, innermost first
    ]
)

#: Python stacks of every thread of a process (`rltrace.stacks`): one row per thread per dump, taken
#: by the process's own stack thread when its innermost open work passes the hang limit
#: (`trigger` hang) or when `rltrace stacks` / `rltrace watch` asked (`trigger` request).
STACKS_SCHEMA = pa.schema(
    [
        *_PROCESS_COLUMNS,
        pa.field("dump_id", pa.string()),  # one dump: every thread of the process at one moment
        pa.field("time_ns", pa.int64()),  # when the stacks were taken, Unix epoch nanoseconds
        pa.field("trigger", pa.string()),  # hang / request
        pa.field("request_id", pa.string()),  # the request answered (trigger request)
        pa.field("thread_id", pa.int64()),  # threading ident (the `thread_id` of the thread's spans)
        pa.field("native_thread_id", pa.int64()),
        pa.field("thread_name", pa.string()),
        pa.field("frames", pa.string()),  # JSON list of [file, line, function, source line], innermost first
        pa.field("spans", pa.string()),  # JSON list of the thread's open spans {span_id, phase, step, start_ns}, innermost first
        pa.field("peer", pa.string()),  # host:port of the socket the thread is reading from, if it is
        pa.field("native", pa.string()),  # py-spy's native frames of the thread, when asked for and allowed
        # torch's Flight Recorder (TORCH_FR_BUFFER_SIZE set): the thread's last collectives, JSON list of
        # {seq, op, group, state, time_created_ns}, oldest first
        pa.field("collectives", pa.string()),
    ]
)

#: Utilisation samples (`init(resources=True)`): one row per device per sample. `kind` "cpu" is the
#: process itself (psutil); "gpu" an NVIDIA device it uses (NVML). A row with `note` set and no
#: values says why a kind is not sampled (psutil or NVML missing, no GPU).
RESOURCES_SCHEMA = pa.schema(
    [
        pa.field("time_ns", pa.int64()),  # end of the sampled interval, Unix epoch nanoseconds
        pa.field("interval_s", pa.float64()),  # length of the interval the values cover
        pa.field("kind", pa.string()),  # cpu / gpu
        pa.field("device", pa.int64()),  # GPU index as NVML numbers it; null for cpu
        pa.field("device_name", pa.string()),  # e.g. "NVIDIA H100 80GB HBM3"; null for cpu
        pa.field("util_pct", pa.float64()),  # cpu: process CPU time / wall (100 = one core); gpu: % of time a kernel ran
        pa.field("mem_bytes", pa.int64()),  # cpu: resident set size; gpu: memory used on the device
        pa.field("mem_total_bytes", pa.int64()),  # cpu: machine memory; gpu: device memory
        pa.field("process_mem_bytes", pa.int64()),  # gpu: memory of this process (and its children) on it
        pa.field("power_w", pa.float64()),  # gpu: board power draw; null for cpu
        pa.field("note", pa.string()),  # why this kind is not sampled; null on sample rows
        *_PROCESS_COLUMNS,
    ]
)

#: What `rltrace watch` raised: one row per alert the first time it fires (see docs/analysis.md).
ALERTS_SCHEMA = pa.schema(
    [
        pa.field("alert_id", pa.string()),
        pa.field("key", pa.string()),  # what the alert is about (rule + process + span or step): fired once per key
        pa.field("rule", pa.string()),  # no_progress / heartbeat / starved / hang / threshold
        pa.field("time_ns", pa.int64()),  # when the watcher saw it
        pa.field("process_id", pa.string()),
        pa.field("role", pa.string()),
        pa.field("rank", pa.int64()),
        pa.field("host", pa.string()),
        pa.field("phase", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("span_id", pa.string()),
        pa.field("seconds", pa.float64()),  # how long: open for, waiting for, silent for
        pa.field("limit_s", pa.float64()),  # the limit it crossed (seconds), for time rules
        pa.field("metric", pa.string()),  # threshold rule: the metric ...
        pa.field("value", pa.float64()),  # ... its value ...
        pa.field("threshold", pa.float64()),  # ... and the threshold crossed
        pa.field("profile_id", pa.string()),  # a py-spy dump or profile attached to the span, if any
        pa.field("profile_path", pa.string()),
        pa.field("message", pa.string()),  # the alert in one sentence
    ]
)


class Table:
    """A table of the store: a folder of Parquet parts with one schema."""

    def __init__(self, name: str, folder: str, schema: pa.Schema, version: int, required: tuple[str, ...]):
        self.name = name
        self.folder = folder
        self.schema = schema
        self.version = version
        self.required = required  # columns a part must have to be readable


#: Span parts: version 2 stores span ids as int64 and trace ids as 16 bytes (`rltrace.store.ids`);
#: version 1 parts (hex text ids) are read too, converted.
SPANS = Table("spans", "spans", SPANS_SCHEMA, 2, ("trace_id", "span_id", "name", "start_ns", "end_ns"))
OPEN_SPANS = Table("open_spans", "open_spans", SPANS_SCHEMA, 2, SPANS.required)
METRICS_TABLE = Table("metrics", "metrics", METRICS_SCHEMA, 1, ("step", "name", "value"))
SAMPLES = Table("samples", "samples", SAMPLES_SCHEMA, 1, ("step",))
PROCESSES = Table("processes", "processes", PROCESSES_SCHEMA, 1, ("process_id", "role", "pid"))
PROFILES = Table("profiles", "profiles", PROFILES_SCHEMA, 1, ("profile_id", "trace_id", "span_id", "kind", "status"))
PROFILE_FRAMES = Table("profile_frames", "profile_frames", PROFILE_FRAMES_SCHEMA, 1, ("profile_id", "rank", "frame"))
PROFILE_FILES = "profiles/files"  # profile artefacts (py-spy and torch traces, dumps), relative to the run dir
BATCHES = Table("batches", "batches", BATCHES_SCHEMA, 1, ("step", "batch_id", "sample_index", "codec"))
REPLAYS = Table("replays", "replays", REPLAYS_SCHEMA, 1, ("replay_id", "step", "batch_id", "repeat", "sample_index", "codec"))
CRASHES = Table("crashes", "crashes", CRASHES_SCHEMA, 1, ("process_id", "exc_type"))
STEP_SUMMARY = Table("step_summary", "summary", STEP_SUMMARY_SCHEMA, 1, ("step", "kind"))
RESOURCES = Table("resources", "resources", RESOURCES_SCHEMA, 1, ("time_ns", "kind"))
ALERTS = Table("alerts", "alerts", ALERTS_SCHEMA, 1, ("alert_id", "key", "rule", "time_ns"))
STACKS = Table("stacks", "stacks", STACKS_SCHEMA, 1, ("process_id", "dump_id", "time_ns", "frames"))
STACK_REQUESTS = "stack_requests"  # `rltrace stacks` asks every live process for its stacks here (latest.json)
SPAN_DIGEST = Table("span_digest", "span_digests", SPAN_DIGEST_SCHEMA, 2, ("phase", "start_ns", "end_ns", "count"))
SPAN_REQUESTS = Table("span_requests", "span_requests", SPAN_REQUESTS_SCHEMA, 1, ("kind", "start_ns"))
SPAN_SIDECARS = (SPAN_DIGEST, SPAN_REQUESTS)  # files beside a span part, named like it, in force while it is

#: Every table `rltrace.store.open` makes a view of. Later parts of rltrace add theirs here.
TABLES: dict[str, Table] = {
    t.name: t
    for t in (SPANS, OPEN_SPANS, METRICS_TABLE, SAMPLES, PROCESSES, STEP_SUMMARY, PROFILES, PROFILE_FRAMES, BATCHES, REPLAYS,
              RESOURCES, ALERTS, CRASHES, STACKS, SPAN_DIGEST, SPAN_REQUESTS)
}

#: Tables made of immutable parts that `rltrace compact` merges, with their sort keys.
COMPACTABLE: dict[str, tuple[str, ...]] = {
    "spans": ("step", "start_ns"),
    "metrics": ("step", "time_ns"),
    "samples": ("step", "logged_ns"),
    "resources": ("time_ns",),
}

# --- part files -------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """A file-name piece from any text: letters, digits, `_.-` only (no glob characters, no
    separators) and never a leading dot, so readers cannot mistake the part for a hidden file."""
    name = _UNSAFE.sub("_", str(text))[:48] or "_"
    return "_" + name[1:] if name.startswith(".") else name


#: A process's parts are `<process_id>-<seq>.parquet` as flushed, `<process_id>-m<seq>.parquet` once it
#: merged them (`rltrace.store.merge`); `rltrace compact` writes `c-<id>.parquet`.
WRITERS = ".writers"  # lock files of live writers: <process_id>.lock, in the run dir


def process_of(part_name: str) -> str:
    """The process id in a part's name."""
    return part_name[: -len(".parquet")].rsplit("-", 1)[0] if part_name.endswith(".parquet") else part_name


def merged_name(process_id: str, seq: int) -> str:
    return f"{process_id}-m{seq:08d}.parquet"


def is_flush_part(name: str) -> bool:
    """A part as a writer flushed it (`<process_id>-<digits>.parquet`), not a merged one."""
    return name.endswith(".parquet") and name[: -len(".parquet")].rsplit("-", 1)[-1].isdigit()


RUN_MANIFEST = "run.json"
RUN_SCHEMA_VERSION = 2  # 2: span and trace ids stored as integers and bytes (runs of version 1 are read)
