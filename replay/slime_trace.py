"""slime's per-sample trace carriers -> rltrace spans and `samples` rows.

A slime sample may carry `trace = {"trace_id", "sample_id", "group_id", "attempt", "events": [...]}`
(slime/observability/trace_utils.py), where each event is `{"type": "span_start" | "span_end" |
"event", "name", "ts" (Unix seconds), "span_id", "parent_span_id", "attrs"}`. Matched start/end
pairs become spans (step = rollout id, phase from the span name), point events become events of
their parent span, and a start without an end becomes an open span. slime's span ids (32 hex
digits) are hashed to OTel's 16; trace ids of 32 hex digits are kept.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from rltrace import _names
from rltrace.replay.slime import STATUS_TO_FINISH
from rltrace.store.writer import ProcessInfo, write_part

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_PHASES = {"sglang_generate": "generate", "generate_and_rm": "rollout", "reward_model": "reward", "group_reward_model": "reward"}


def _trace_id(value: Any) -> str:
    text = str(value or "")
    return text if _HEX32.match(text) else hashlib.sha256(text.encode()).hexdigest()[:32]


def _span_id(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    return text if re.match(r"^[0-9a-f]{16}$", text) else hashlib.sha256(text.encode()).hexdigest()[:16]


def _ns(ts: Any) -> int | None:
    try:
        return int(float(ts) * 1e9)
    except (TypeError, ValueError):
        return None


def _version(sample: dict) -> int | None:
    try:
        versions = [int(v) for v in sample.get("weight_versions") or ()]
    except (TypeError, ValueError):
        return None
    return min(versions) if versions else None


def trace_spans(sample: dict, step: int) -> list[dict]:
    """Span rows (SPANS_SCHEMA names, no process columns) from one sample's trace carrier."""
    trace = sample.get("trace")
    if not isinstance(trace, dict) or not isinstance(trace.get("events"), list):
        return []
    trace_id = _trace_id(trace.get("trace_id"))
    base_attrs = {"slime.sample_id": trace.get("sample_id"), "slime.group_id": trace.get("group_id")}
    spans: dict[str, dict] = {}
    events: list[dict] = []
    for event in trace["events"]:
        if not isinstance(event, dict) or _ns(event.get("ts")) is None:
            continue
        kind, span_id = event.get("type"), _span_id(event.get("span_id"))
        attrs = event.get("attrs") if isinstance(event.get("attrs"), dict) else {}
        if kind == "span_start" and span_id:
            name = str(event.get("name") or "span")
            spans[span_id] = {
                "trace_id": trace_id,
                "span_id": span_id,
                "parent_span_id": _span_id(event.get("parent_span_id")),
                "name": name,
                "phase": _PHASES.get(name, name),
                "step": step,
                "weight_version": _version(sample),
                "start_ns": _ns(event["ts"]),
                "end_ns": None,
                "attrs": {**base_attrs, "slime.attempt": event.get("attempt"), **attrs},
                "events": [],
            }
        elif kind == "span_end" and span_id in spans:
            span = spans[span_id]
            span["end_ns"] = _ns(event["ts"])
            span["attrs"].update(attrs)
        elif kind == "event":
            events.append(event)
    for event in events:
        parent = spans.get(_span_id(event.get("parent_span_id"))) or next(iter(spans.values()), None)
        if parent is not None:
            attrs = event.get("attrs") if isinstance(event.get("attrs"), dict) else {}
            parent["events"].append({"name": str(event.get("name")), "time_ns": _ns(event["ts"]), "attributes": attrs})
    rows = []
    for span in spans.values():
        attrs = span.pop("attrs")
        error = attrs.get("error_type")
        span["status"] = "ERROR" if error else "UNSET"
        span["status_message"] = f"{error}: {attrs.get('error_message')}" if error else None
        span["kind"] = "INTERNAL"
        span["thread_id"] = span["thread_name"] = None
        span["attributes"] = json.dumps({k: v for k, v in attrs.items() if v is not None}, default=str)
        span["events"] = json.dumps(span["events"], default=str) if span["events"] else None
        span["links"] = None
        rows.append(span)
    return rows


def sample_row(sample: dict, index: int, step: int, spans: list[dict]) -> dict:
    """A `samples` row (the brief's per-sample columns) for one slime sample."""
    starts = [s["start_ns"] for s in spans]
    ends = [s["end_ns"] for s in spans if s["end_ns"] is not None]
    reward = sample.get("reward")
    status = sample.get("status")
    tokens = sample.get("tokens")
    return {
        "sample_id": sample.get("index") if isinstance(sample.get("index"), int) else index,
        "group_id": sample.get("group_index") if isinstance(sample.get("group_index"), int) else None,
        "prompt_len": None if tokens is None else len(tokens) - int(sample.get("response_length") or 0),
        "response_len": int(sample.get("response_length") or 0),
        "finish_reason": STATUS_TO_FINISH.get(status, status) if isinstance(status, str) else None,
        "reward": float(reward) if isinstance(reward, (int, float)) else None,
        "weight_version": _version(sample),
        "gen_start": min(starts) / 1e9 if starts else None,
        "gen_end": max(ends) / 1e9 if ends else None,
    }


def write(run_dir: Path, step: int, samples: list, process: ProcessInfo) -> dict[str, int]:
    """Write the spans (finished and open) and `samples` rows of one rollout dump."""
    finished, still_open, rows = [], [], []
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            continue
        spans = trace_spans(sample, step)
        finished += [s for s in spans if s["end_ns"] is not None]
        still_open += [s for s in spans if s["end_ns"] is None]
        rows.append(sample_row(sample, i, step, spans))
    name = f"{process.process_id}-{step:010d}.parquet"
    for table, spans in ((_names.SPANS, finished), (_names.OPEN_SPANS, still_open)):
        if spans:
            cols = {f: [s.get(f) for s in spans] for f in _names.SPANS_SCHEMA.names}
            cols.update({k: v.to_pylist() for k, v in process.columns(len(spans)).items()})
            cols["service_name"] = ["slime-rollout"] * len(spans)
            write_part(Path(run_dir) / table.folder, name, pa.table(cols, schema=_names.SPANS_SCHEMA), table)
    if rows:
        n = len(rows)
        cols = {f: [r.get(f) for r in rows] for f in _names.SAMPLE_COLUMNS}
        cols.update(step=[step] * n, logged_ns=[time.time_ns()] * n, **{k: v.to_pylist() for k, v in process.columns(n).items()})
        cols["weight_versions"] = [None] * n
        cols["train_version"] = [None] * n
        write_part(Path(run_dir) / _names.SAMPLES.folder, name, pa.table(cols, schema=_names.SAMPLES_SCHEMA), _names.SAMPLES)
    return {"spans": len(finished) + len(still_open), "samples": len(rows)}


def write_process(run_dir: Path, process: ProcessInfo, run_id: str, *, rows: int, spans: int) -> None:
    """The importing process's row in `processes`, so `rltrace info` says where the data came from."""
    now = time.time_ns()
    row = {
        "process_id": process.process_id, "role": process.role, "rank": process.rank, "host": process.host, "pid": process.pid,
        "run_id": run_id, "service_name": process.service_name, "started_ns": now, "heartbeat_ns": now, "ended_ns": now,
        "spans_written": spans, "spans_dropped": 0, "rows_written": rows, "rows_dropped": 0,
        "argv": json.dumps(sys.argv), "resource": json.dumps({"service.name": process.service_name}),
    }
    table = pa.Table.from_pylist([row], schema=_names.PROCESSES_SCHEMA)
    write_part(Path(run_dir) / _names.PROCESSES.folder, f"{process.process_id}.parquet", table, _names.PROCESSES)
