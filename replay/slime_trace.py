"""slime's per-sample trace carriers -> rltrace spans and `samples` rows.

A slime sample may carry `trace = {"trace_id", "sample_id", "group_id", "attempt", "events": [...]}`
(slime/observability/trace_utils.py), where each event is `{"type": "span_start" | "span_end" |
"event", "name", "ts" (Unix seconds), "span_id", "parent_span_id", "attrs"}`. Matched start/end
pairs become spans (phase from the span name), point events become events of their parent span,
a start without an end becomes an open span, and an end without a start is kept as a zero-length
span marked `slime.unmatched_end` (counted in the import result). slime's span ids (32 hex digits)
are hashed to OTel's 16; trace ids of 32 hex digits are kept.

What slime writes and how it is read:
- **Steps.** A partial rollout carries a sample over to the next rollout (`metadata.start_rollout_id`
  is where it began), and its trace holds the events of both. Each top-level span, with everything
  under it, goes to the latest rollout, from `start_rollout_id` on, whose own work (the events of
  the samples it began itself) had started when the span ended: an aborted span ended before the
  next rollout began, while a resumed one, submitted a moment before the fresh samples, ends after. A sample keeps one `samples` row per step it
  ran in; only the row of the dump's own rollout is `in_batch`.
- **Work that crosses a window.** A span that ran across the end of an earlier rollout's window
  (slime's fully-async rollout keeps groups running across rollout calls; a group taken by
  rollout 1 may have started during rollout 0) counts in each step for the time it ran in that
  step's window: it is cut at the window ends (`cut_at_windows`), the piece in its start's window
  keeping its span id, the others getting ids of their own, and each piece's parent is the
  parent's piece of the same step. A window ends where the work of its step ended (`step_ends`:
  the last end among the spans of that step), so the next step's window begins there. This is
  done here, when slime's traces become spans, and not in the analysis: only here is it known
  that the rollouts are successive calls whose windows tile time; an async run's rollout for
  step N legitimately runs during step N-1, and the analysis must keep each span in its step.
  A dump imported alone is cut only at the ends of the steps it holds (import neighbouring
  dumps together); stock partial rollouts (abort, then resume) never cross a window.
- **Group spans.** slime writes a copy of each group span (`generate_and_rm_group`,
  `group_reward_model`) into every sample's trace, each with its own span id and the same group,
  name and timestamps: one copy is stored, and children of the others point to it.
- **Versions.** `weight_versions` has one entry per engine response, in the order the responses
  came back: the i-th finished `sglang_generate` span of a sample ran under `weight_versions[i]`.
  Its children carry the same version; any other span the oldest version of the requests inside
  it (or of the last request before it).
- **Lanes.** Spans carry `thread_id` = group * 10000 (+ 1 + the sample's place in its group) and a
  thread name "group G · sample S", so a timeline shows one lane per sample, grouped by group.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

import pyarrow as pa

from rltrace import _names
from rltrace.store import rows as store_rows
from rltrace.store.writer import ProcessInfo

#: slime's `Sample.Status` values -> rltrace's `finish_reason` (import), and back (export)
STATUS_TO_FINISH = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "failed", "pending": "pending"}
FINISH_TO_STATUS = {v: k for k, v in STATUS_TO_FINISH.items()}
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_PHASES = {
    "sglang_generate": "generate",
    "sglang_generate_stream": "generate",  # slime/rollout/sglang_streaming_rollout.py
    "generate_and_rm": "rollout",
    "generate_and_rm_group": "rollout",
    "reward_model": "reward",
    "group_reward_model": "reward",
}
GROUP_SPANS = frozenset(("generate_and_rm_group", "group_reward_model"))
SAMPLE_SPAN = "generate_and_rm"
REQUEST_SPAN = "sglang_generate"
LANE = 10_000  # thread_id = group * LANE (+ 1 + place in the group): one lane per sample, grouped
#: Extra `samples` columns from slime's Sample fields (what slime's rollout metrics read).
EXTRA_COLUMNS: dict[str, pa.DataType] = {
    "in_batch": pa.bool_(),  # false on the row of an earlier step a carried-over sample also ran in
    "effective_response_len": pa.int64(),  # sum(loss_mask): the tokens trained on
    "cached_tokens": pa.int64(),  # prefix_cache_info
    "total_prompt_tokens": pa.int64(),
    "non_generation_time": pa.float64(),  # seconds in tools / environment
    "repetition": pa.bool_(),  # slime's has_repetition(response)
    "spec_accept_rate": pa.float64(),  # spec_info (speculative decoding)
    "spec_accept_length": pa.float64(),
}


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
        return int(round(float(ts) * 1e9))
    except (TypeError, ValueError, OverflowError):
        return None


ns = _ns  # a trace event's time (Unix seconds) in ns, or None: for the live hook too


def _versions(sample: dict) -> list[int] | None:
    try:
        return [int(v) for v in sample.get("weight_versions") or ()]
    except (TypeError, ValueError):
        return None


def _events(sample: dict) -> list[dict]:
    trace = sample.get("trace")
    if not isinstance(trace, dict) or not isinstance(trace.get("events"), list):
        return []
    return [e for e in trace["events"] if isinstance(e, dict) and _ns(e.get("ts")) is not None]


def start_rollout(sample: dict, rollout_id: int) -> int:
    """The rollout a sample began in: `metadata.start_rollout_id` of a carried-over sample, else this one."""
    meta = sample.get("metadata") if isinstance(sample.get("metadata"), dict) else {}
    try:
        first = int(meta.get("start_rollout_id"))
    except (TypeError, ValueError):
        return rollout_id
    return first if first <= rollout_id else rollout_id


def own_start(samples: list, rollout_id: int) -> int | None:
    """When a rollout's own work began: the first event of the samples it began itself (ns)."""
    times = [_ns(e["ts"]) for s in samples if isinstance(s, dict) and start_rollout(s, rollout_id) == rollout_id
             for e in _events(s)]
    return min(times, default=None)


def step_of(ts_ns: int, first: int, last: int, starts: dict[int, int]) -> int:
    """The rollout in which something at `ts_ns` happened, for a sample run from rollout `first` to `last`."""
    step = first
    for rid, start in starts.items():
        if first < rid <= last and start is not None and start <= ts_ns and rid > step:
            step = rid
    return step


def step_ends(rollouts: dict[int, list], starts: dict[int, int] | None = None) -> dict[int, int]:
    """When each step's work ended (ns): the last end among the spans of each step (as `trace_spans`
    assigns them), over the samples of several rollouts ({rollout id: samples})."""
    ends: dict[int, int] = {}

    def seen(step: int, t: int | None) -> None:
        if t is not None and (step not in ends or t > ends[step]):
            ends[step] = t

    for rid, samples in rollouts.items():
        for sample in samples:
            if not isinstance(sample, dict):
                continue
            if start_rollout(sample, rid) == rid:  # all of its spans belong to this rollout
                seen(rid, max((_ns(e["ts"]) for e in _events(sample)), default=None))
                continue
            for span in trace_spans(sample, rid, starts)[0]:  # a carried-over sample: parts of earlier steps
                seen(span["step"], span["end_ns"] if span["end_ns"] is not None else span["start_ns"])
    return ends


def window_of(t: int, ends: dict[int, int], upto: int) -> int:
    """The step whose window holds time `t`: the first step before `upto` whose work ended after
    `t` (`ends`), else `upto`."""
    for k in sorted(ends):
        if k < upto and t < ends[k]:
            return k
    return upto


def cut_at_windows(span: dict, ends: dict[int, int], parent_start: int | None) -> list[dict]:
    """`span` (its step set) as the pieces it ran in each step's window: cut at the ends of the
    windows of earlier steps (`ends`, see `step_ends`). Unchanged when it ran in its own step's
    window only. The piece in the window of the span's start keeps its id; the others get
    `<id>@<step>` hashed; each piece's parent is the parent's piece of its step (`parent_start`:
    when the parent began, None if unknown) and its point events are those of its time."""
    step, end = span["step"], span["end_ns"]
    if step is None or end is None:
        return [span]
    cuts, lo = [], span["start_ns"]
    for k, e in sorted((k, e) for k, e in ends.items() if k < step):
        if lo >= e:
            continue  # that window ended before what is left of the span
        if end <= e:
            cuts.append((k, lo, end))
            lo = None
            break
        cuts.append((k, lo, e))
        lo = e
    if lo is not None:
        cuts.append((step, lo, end))
    parent = span["parent_span_id"]
    parent_first = window_of(parent_start, ends, step) if parent is not None and parent_start is not None else None
    if len(cuts) == 1 and cuts[0][0] == step:  # not cut; its parent may be (the span lies in its later window)
        if parent_first is None or parent_first == step:
            return [span]
        return [dict(span, parent_span_id=_span_id(f"{parent}@{step}"))]
    first = cuts[0][0]
    pieces = []
    for i, (k, a, b) in enumerate(cuts):
        last = i == len(cuts) - 1
        piece = dict(span, step=k, start_ns=a, end_ns=b,
                     span_id=span["span_id"] if k == first else _span_id(f"{span['span_id']}@{k}"),
                     events=[ev for ev in span["events"] if (i == 0 or ev["time_ns"] >= a) and (last or ev["time_ns"] < b)])
        if parent_first is not None and k != parent_first:
            piece["parent_span_id"] = _span_id(f"{parent}@{k}")
        if len(cuts) > 1:
            piece["attrs"] = {**span["attrs"], "slime.window_split": True}
        pieces.append(piece)
    return pieces


def _cut_all(spans: list[dict], ends: dict[int, int]) -> list[dict]:
    by_id = {s["span_id"]: s for s in spans}
    out = []
    for span in spans:
        parent = by_id.get(span["parent_span_id"])
        out.extend(cut_at_windows(span, ends, parent["start_ns"] if parent is not None else None))
    return out


def trace_spans(sample: dict, rollout_id: int, starts: dict[int, int] | None = None) -> tuple[list[dict], int]:
    """Span rows (SPANS_SCHEMA names, no process columns) of one sample's trace, and its count of ends without a start."""
    trace = sample.get("trace")
    events = _events(sample)
    if not events:
        return [], 0
    first = start_rollout(sample, rollout_id)
    spans: dict[str, dict] = {}
    points, unmatched = [], 0
    for event in events:
        kind, span_id = event.get("type"), _span_id(event.get("span_id"))
        if kind == "span_start" and span_id:
            spans[span_id] = started(trace, event)
        elif kind == "span_end" and span_id in spans and spans[span_id]["end_ns"] is None:
            ended(spans[span_id], event)
        elif kind == "span_end":
            unmatched += 1
            span = unmatched_end(trace, event, unmatched)
            spans[span["span_id"]] = span
        elif kind == "event":
            points.append(event)
    for event in points:
        parent = spans.get(_span_id(event.get("parent_span_id"))) or next(iter(spans.values()), None)
        if parent is not None:
            parent["events"].append(point(event))
    rows = list(spans.values())
    for span in rows:  # a top-level span goes to the rollout it ended in (or started, if open); children follow it
        root, seen = span, {span["span_id"]}
        while root["parent_span_id"] in spans and root["parent_span_id"] not in seen:
            root = spans[root["parent_span_id"]]
            seen.add(root["span_id"])
        at = root["end_ns"] if root["end_ns"] is not None else root["start_ns"]
        span["step"] = step_of(at, first, rollout_id, starts or {})
    _set_versions(rows, _versions(sample))
    return rows, unmatched


def _attrs(event: dict) -> dict:
    return event.get("attrs") if isinstance(event.get("attrs"), dict) else {}


def _base(trace: dict) -> dict:
    return {"slime.sample_id": trace.get("sample_id"), "slime.group_id": trace.get("group_id")}


def started(trace: dict, event: dict) -> dict:
    """The span a `span_start` event of carrier `trace` opens (no end yet, no step, no version)."""
    name = str(event.get("name") or "span")
    own = {**_base(trace), "slime.attempt": event.get("attempt"), **_attrs(event)}
    if name in GROUP_SPANS:
        own.pop("slime.sample_id")  # the group's span, stored once: it belongs to no one sample
    return _span(_trace_id(trace.get("trace_id")), _span_id(event.get("span_id")), event, name, own)


def ended(span: dict, event: dict) -> None:
    """Close `span` with its `span_end` event (end attributes join the start's)."""
    span["end_ns"] = _ns(event["ts"])
    span["attrs"].update(_attrs(event))


def unmatched_end(trace: dict, event: dict, n: int) -> dict:
    """A zero-length span for the `n`-th `span_end` of a carrier that has no start."""
    trace_id = _trace_id(trace.get("trace_id"))
    key = _span_id(event.get("span_id")) or f"unmatched-{n}"
    span = _span(trace_id, _span_id(f"{trace_id}:{key}:end"), event, str(event.get("name") or "span"),
                 {**_base(trace), **_attrs(event), "slime.unmatched_end": True})
    span["end_ns"] = span["start_ns"]
    span["status_message"] = "span end without a start in the trace"
    return span


def point(event: dict) -> dict:
    """A point event (`type: event`) as an event of its span."""
    return {"name": str(event.get("name")), "time_ns": _ns(event["ts"]), "attributes": _attrs(event)}


def span_id(value: Any) -> str | None:
    """rltrace's span id (16 hex digits) for one of slime's."""
    return _span_id(value)


def _span(trace_id: str, span_id: str, event: dict, name: str, attrs: dict) -> dict:
    return {
        "trace_id": trace_id, "span_id": span_id, "parent_span_id": _span_id(event.get("parent_span_id")),
        "name": name, "phase": _PHASES.get(name, name), "step": None, "weight_version": None,
        "start_ns": _ns(event["ts"]), "end_ns": None, "attrs": attrs, "events": [], "status_message": None,
    }


def _requests(spans: list[dict]) -> list[dict]:
    """The engine calls that returned (their end carries SGLang's finish_reason), in the order they did."""
    done = [s for s in spans if s["name"] == REQUEST_SPAN and s["end_ns"] is not None and "finish_reason" in s["attrs"]]
    return sorted(done, key=lambda s: (s["end_ns"], s["start_ns"]))


def _set_versions(spans: list[dict], versions: list[int] | None) -> None:
    if not versions:
        return
    requests = _requests(spans)
    for request, version in zip(requests, versions):
        request["weight_version"] = version
    by_id = {s["span_id"]: s for s in spans}
    dated = [(r["start_ns"], r["end_ns"], r["weight_version"]) for r in requests if r["weight_version"] is not None]
    for span in spans:
        if span["weight_version"] is None:
            span["weight_version"] = version_of(span, by_id, dated, min(versions) if not dated else None)


def version_of(span: dict, by_id: dict[str, dict], dated: list[tuple[int, int, int]], otherwise: int | None) -> int | None:
    """The weight version of a span that is no engine call: that of the engine call it is inside
    (`by_id`: the sample's spans), else the oldest of the calls (start, end, version) within it,
    else that of the last call before it, else `otherwise`."""
    parent, seen = by_id.get(span["parent_span_id"]), set()
    while parent is not None and parent["span_id"] not in seen and parent["name"] != REQUEST_SPAN:
        seen.add(parent["span_id"])
        parent = by_id.get(parent["parent_span_id"])
    if parent is not None and parent["weight_version"] is not None:
        return parent["weight_version"]
    end = span["end_ns"] if span["end_ns"] is not None else span["start_ns"]
    inside = [v for s, e, v in dated if s >= span["start_ns"] and e <= end]
    before = [(e, v) for s, e, v in dated if e <= span["start_ns"]]
    return min(inside) if inside else max(before)[1] if before else otherwise


def finish(span: dict) -> dict:
    """The `spans` row of a parsed span, built by the store's one row builder."""
    attrs = span["attrs"]
    error = attrs.get("error_type")
    return store_rows.span_row(
        trace_id=span["trace_id"], span_id=span["span_id"], parent_span_id=span["parent_span_id"], name=span["name"],
        phase=span["phase"], step=span["step"], weight_version=span["weight_version"], start_ns=span["start_ns"],
        end_ns=span["end_ns"], status="ERROR" if error else "UNSET",
        status_message=f"{error}: {attrs.get('error_message')}" if error else span["status_message"],
        thread_id=span.get("thread_id"), thread_name=span.get("thread_name"),
        attributes={k: v for k, v in attrs.items() if v is not None}, events=span["events"] or None,
    )


def has_repetition(text: Any) -> bool:
    """slime's `has_repetition` (slime/observability/metric_utils.py): the last 10,000 characters of a
    response over 10,000 characters compress more than 10x with zlib level 9."""
    import zlib

    if not isinstance(text, str) or len(text) <= 10000:
        return False
    raw = text[-10000:].encode("utf-8")
    return len(raw) / len(zlib.compress(raw, 9)) > 10


def _float(value: Any) -> float | None:
    """A number from a dump as a float (0-d tensors too); None for anything else (a bool, text, an
    int past float's range)."""
    value = store_rows.plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _share(part: Any, whole: Any, present: bool) -> float | None:
    """part / whole as slime's SpecInfo computes it (0.0 when whole is 0); None when not numbers."""
    part, whole = _float(part or 0), _float(whole or 0)
    if part is None or whole is None:
        return None
    return part / whole if whole > 0 else (0.0 if present else None)


def _extras(sample: dict) -> dict[str, Any]:
    mask = sample.get("loss_mask")
    length = int(sample.get("response_length") or 0)
    try:
        effective = int(sum(int(m) for m in mask)) if mask is not None else length
    except (TypeError, ValueError, OverflowError):
        effective = None
    cache = sample.get("prefix_cache_info") if isinstance(sample.get("prefix_cache_info"), dict) else {}
    spec = sample.get("spec_info") if isinstance(sample.get("spec_info"), dict) else {}
    return {
        "in_batch": True,
        "effective_response_len": effective,
        "cached_tokens": cache.get("cached_tokens"),
        "total_prompt_tokens": cache.get("total_prompt_tokens"),
        "non_generation_time": _float(sample.get("non_generation_time")),
        "repetition": has_repetition(sample.get("response")),
        # slime's Sample.SpecInfo.spec_accept_rate / spec_accept_length
        "spec_accept_rate": _share(spec.get("spec_accept_token_num"), spec.get("spec_draft_token_num"), bool(spec)),
        "spec_accept_length": _share(spec.get("completion_token_num"), spec.get("spec_verify_ct"), bool(spec)),
    }


def sample_rows(sample: dict, index: int, rollout_id: int, spans: list[dict], train_version: int | None) -> list[dict]:
    """The `samples` rows of one slime sample: the dump's rollout (in_batch), and any earlier step it ran in."""
    reward = sample.get("reward")
    status = sample.get("status")
    tokens = sample.get("tokens")
    versions = _versions(sample)
    own = [s for s in spans if s["name"] not in GROUP_SPANS]
    rows = []
    for step in sorted({s["step"] for s in own} | {rollout_id}):
        mine = [s for s in own if s["step"] == step]
        timed = [s for s in mine if s["name"] == SAMPLE_SPAN] or mine
        ends = [s["end_ns"] for s in timed if s["end_ns"] is not None]
        requests = [r for r in _requests(mine) if r["weight_version"] is not None]
        row = {
            "sample_id": sample.get("index") if isinstance(sample.get("index"), int) else index,
            "group_id": sample.get("group_index") if isinstance(sample.get("group_index"), int) else None,
            "gen_start": min(s["start_ns"] for s in timed) / 1e9 if timed else None,
            "gen_end": max(ends) / 1e9 if ends else None,
            "step": step,
        }
        if step == rollout_id:
            row.update(
                prompt_len=None if tokens is None else len(tokens) - int(sample.get("response_length") or 0),
                response_len=int(sample.get("response_length") or 0),
                finish_reason=STATUS_TO_FINISH.get(status, status) if isinstance(status, str) else None,
                reward=_float(reward),
                weight_versions=versions or None, weight_version=min(versions) if versions else None,
                train_version=train_version, **_extras(sample),
            )
        else:  # the part of a carried-over sample that ran in an earlier rollout
            step_versions = [r["weight_version"] for r in requests]
            tokens_out = [r["attrs"].get("completion_tokens") for r in requests]
            row.update(
                response_len=sum(tokens_out) if tokens_out and all(isinstance(t, int) for t in tokens_out) else None,
                finish_reason="abort", weight_versions=step_versions or None,
                weight_version=min(step_versions) if step_versions else None, in_batch=False,
            )
        rows.append(row)
    return rows


def _dedupe_groups(spans: list[dict]) -> list[dict]:
    """One copy of each group span (same step, group, name and times); children of the others point to it."""
    kept: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    out = []
    for span in spans:
        if span["name"] in GROUP_SPANS:
            key = (span["step"], span["attrs"].get("slime.group_id"), span["name"], span["start_ns"], span["end_ns"])
            if key in kept:
                alias[span["span_id"]] = kept[key]
                continue
            kept[key] = span["span_id"]
        out.append(span)
    for span in out:
        while span["parent_span_id"] in alias:
            span["parent_span_id"] = alias[span["parent_span_id"]]
    return out


def lane(group: Any, place: int, sample_id: Any, group_level: bool) -> tuple[int, str]:
    """(thread_id, thread name) of a span: its sample's lane, or its group's for a group span."""
    if group_level:
        return group * LANE, f"group {group}"
    return group * LANE + 1 + place, f"group {group} · sample {sample_id}"


def _lanes(samples: list) -> dict[int, tuple[int, int, Any]]:
    """Per sample position: (its group's lane number, its place in the group, its id)."""
    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(samples):
        if isinstance(s, dict):
            groups.setdefault(s.get("group_index", f"#{i}"), []).append(i)
    out = {}
    for ordinal, (group, members) in enumerate(groups.items()):
        g = group if isinstance(group, int) and group >= 0 else ordinal
        for place, i in enumerate(members):
            out[i] = (g, place, samples[i].get("index", i))
    return out


def rollout_rows(rollout_id: int, samples: list, starts: dict[int, int] | None = None,
                 extra: dict[int, dict] | None = None, ends: dict[int, int] | None = None
                 ) -> tuple[list[dict], list[dict], int]:
    """The spans (parsed, cut at the windows of earlier steps, group copies merged), `samples` rows
    (with their `step`) and count of span ends without a start, of the samples (`Sample.to_dict()`)
    of one rollout: for the importer and the live hook (rltrace.integrations.slime), which write
    the same rows.

    `starts`: when each rollout's own work began (`own_start`), to put carried-over work in its step;
    `extra`: more columns for the rollout's own row of sample i (e.g. mismatch from a joined train dump);
    `ends`: when each step's work ended (`step_ends`), to cut spans that ran across a window.
    """
    spans, rows, unmatched = [], [], 0
    lanes = _lanes(samples)
    per_sample = []
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            continue
        mine, lost = trace_spans(sample, rollout_id, starts)
        unmatched += lost
        g, place, sid = lanes[i]
        for span in mine:
            span["thread_id"], span["thread_name"] = lane(g, place, sid, span["name"] in GROUP_SPANS)
        per_sample.append((i, sample, mine))
        spans += mine
    requests = [r["weight_version"] for r in _requests(spans) if r["weight_version"] is not None and r["step"] == rollout_id]
    train_version = max(requests) if requests else None
    for i, sample, mine in per_sample:
        for row in sample_rows(sample, i, rollout_id, mine, train_version):
            rows.append({**row, **(extra or {}).get(i, {})} if row["step"] == rollout_id else row)
    if ends:
        spans = _cut_all(spans, ends)
    return _dedupe_groups(spans), rows, unmatched


def rollout_tables(rollout_id: int, samples: list, process: ProcessInfo, starts: dict[int, int] | None = None,
                   extra: dict[int, dict] | None = None, ends: dict[int, int] | None = None, *,
                   drops: store_rows.Drops) -> tuple[list[tuple[Any, pa.Table]], dict[str, int]]:
    """The spans (finished and open) and `samples` rows of one rollout dump (see `rollout_rows`;
    `ends`: where each rollout's work ended, to cut what ran on into the next window), as (store
    table, Arrow table) pairs for the caller to write, and counts (spans, samples,
    unmatched_ends, carried). Rows the store cannot hold are dropped and counted in `drops`."""
    spans, rows, unmatched = rollout_rows(rollout_id, samples, starts, extra, ends)
    spans = [finish(s) for s in spans]
    out: list[tuple[Any, pa.Table]] = []
    before = drops.total("spans"), drops.total("samples")
    for table, part in ((_names.SPANS, [s for s in spans if s["end_ns"] is not None]),
                        (_names.OPEN_SPANS, [s for s in spans if s["end_ns"] is None])):
        built = store_rows.span_rows_table(part, process, "slime-rollout", drops=drops) if part else None
        if built is not None and built.num_rows:
            out.append((table, built))
    now = time.time_ns()
    for step in sorted({r["step"] for r in rows}):
        mine = [{k: v for k, v in r.items() if k != "step"} for r in rows if r["step"] == step]
        built = store_rows.samples_table(step, mine, now, process, drops=drops)
        if built is not None and built.num_rows:
            out.append((_names.SAMPLES, built))
    carried = sum(1 for r in rows if r.get("in_batch") is False)
    return out, {"spans": len(spans) - (drops.total("spans") - before[0]), "samples": len(rows) - (drops.total("samples") - before[1]),
                 "unmatched_ends": unmatched, "carried": carried}
