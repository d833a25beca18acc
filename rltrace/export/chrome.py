"""Chrome Trace Event JSON of a run, for Perfetto (ui.perfetto.dev) and chrome://tracing.

One process track per rltrace process (named role+rank @ host), one thread track per thread.
Perfetto cannot draw complete events that overlap without nesting on one thread, so each
thread's spans are dealt into *lanes*: a span goes to the first lane where it nests inside or
follows the spans already there; concurrent work (e.g. async tasks on one thread) gets extra
thread tracks named "<thread> +1", "+2", ... Cross-process parent/child links become flow
arrows, step metrics become counter tracks, and open spans are drawn to the end of the trace
with "(open)" in their name and `args.open = true`. The file is strict JSON: a NaN or infinite
attribute or metric is `null` with its spelling beside it (`"loss": null, "loss.text": "NaN"`).

Timestamps are integer microseconds since the Unix epoch, `ts = start_ns // 1000`, on the same
clock as the stored spans (floor keeps every nesting and ordering of the nanosecond times).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from rltrace import _json
from rltrace.analysis._format import process_name
from rltrace.analysis._steps import Steps, step_filter

OPEN_SUFFIX = " (open)"
LARGE_TRACE_EVENTS = 1_000_000  # Perfetto's web UI struggles beyond about this many JSON events


def _us(ns: int) -> int:
    return int(ns) // 1000


def _lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Lane of each span (given sorted by start, longer first) so that each lane nests properly."""
    stacks: list[list[int]] = []
    out = []
    for s, e in zip(starts, ends):
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or stack[-1] >= e:
                stack.append(e)
                out.append(lane)
                break
        else:
            stacks.append([e])
            out.append(len(stacks) - 1)
    return out


def _load(con, steps: Steps) -> tuple[pd.DataFrame, pd.DataFrame]:
    where, params = step_filter(steps)
    spans = con.execute(
        f"""SELECT trace_id, span_id, parent_span_id, name, coalesce(phase, name) AS phase, step, weight_version,
                   start_ns, end_ns, is_open, status, status_message, process_id, role, rank, host, pid,
                   coalesce(thread_id, 0) AS thread_id, thread_name, attributes
            FROM spans WHERE {where} AND start_ns IS NOT NULL""",
        params,
    ).df()
    metrics = con.execute(
        f"""SELECT step, name, value, time_ns, process_id, role, rank, host, pid FROM metrics
            WHERE {where} AND time_ns IS NOT NULL AND value IS NOT NULL ORDER BY time_ns""",
        params,
    ).df()
    return spans, metrics


def chrome_trace(con, *, steps: Steps = None) -> dict:
    """The trace as a dict: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
    spans, metrics = _load(con, steps)
    trace_end = max(
        [int(x) for x in (spans["end_ns"].max(), spans["start_ns"].max(), metrics["time_ns"].max()) if pd.notna(x)],
        default=0,
    )
    spans["open"] = spans["is_open"].astype(bool) | spans["end_ns"].isna()
    spans["end_ns"] = spans["end_ns"].fillna(trace_end).astype("int64")
    spans["end_ns"] = spans[["end_ns", "start_ns"]].max(axis=1)

    procs = pd.concat([spans[["process_id", "role", "rank", "host", "pid"]], metrics[["process_id", "role", "rank", "host", "pid"]]])
    procs = procs.drop_duplicates("process_id").sort_values(["role", "rank", "process_id"], na_position="last")
    pid_of = {p: i + 1 for i, p in enumerate(procs["process_id"])}
    events: list[dict] = []
    for i, p in enumerate(procs.itertuples(index=False)):
        label = f"{process_name(p.role, p.rank)} @ {p.host} (pid {'' if pd.isna(p.pid) else int(p.pid)})"
        events.append({"ph": "M", "name": "process_name", "pid": pid_of[p.process_id], "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid_of[p.process_id], "tid": 0, "args": {"sort_index": i}})

    spans = spans.sort_values(["process_id", "thread_id", "start_ns", "end_ns"], ascending=[True, True, True, False])
    tid_of: dict[tuple, int] = {}
    where: dict[str, tuple[int, int]] = {}  # span_id -> (pid, tid)
    for (process_id, thread_id), group in spans.groupby(["process_id", "thread_id"], sort=False):
        pid = pid_of[process_id]
        lanes = _lanes(group["start_ns"].tolist(), group["end_ns"].tolist())
        thread_name = group["thread_name"].dropna().iloc[0] if group["thread_name"].notna().any() else f"thread {thread_id}"
        for lane in sorted(set(lanes)):
            tid = tid_of[(process_id, thread_id, lane)] = sum(1 for k in tid_of if k[0] == process_id) + 1
            name = thread_name if lane == 0 else f"{thread_name} +{lane}"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for row, lane in zip(group.itertuples(index=False), lanes):
            tid = tid_of[(process_id, thread_id, lane)]
            where[row.span_id] = (pid, tid)
            events.append(_complete(row, pid, tid))

    events.extend(_flows(spans, where))
    for m in metrics.itertuples(index=False):
        value = float(m.value)
        event = {"ph": "C", "name": m.name, "pid": pid_of[m.process_id], "tid": 0, "ts": _us(m.time_ns), "args": {"value": value}}
        if not math.isfinite(value):  # a counter takes numbers only: a NaN/inf metric is an instant event
            event.update(ph="i", s="p")
        events.append(event)
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "rltrace", "clock": "ts = Unix epoch microseconds (span start_ns // 1000)",
                      "trace_end_us": _us(trace_end)},
    }
    return _json.strict(trace, keep_text=True)  # NaN/inf values: null, with "<key>.text": "NaN" beside


def _complete(row, pid: int, tid: int) -> dict:
    args = {"span_id": row.span_id, "trace_id": row.trace_id, "phase": row.phase}
    if not pd.isna(row.step):
        args["step"] = int(row.step)
    if not pd.isna(row.weight_version):
        args["weight_version"] = int(row.weight_version)
    if row.status and row.status != "UNSET":
        args["status"] = row.status if not row.status_message else f"{row.status}: {row.status_message}"
    try:
        args.update(json.loads(row.attributes) if row.attributes else {})
    except (TypeError, ValueError):
        pass
    event = {"ph": "X", "name": row.name, "cat": row.phase or "span", "pid": pid, "tid": tid,
             "ts": _us(row.start_ns), "dur": _us(row.end_ns) - _us(row.start_ns), "args": args}
    if row.open:
        event["name"] += OPEN_SUFFIX
        event["args"]["open"] = True
        event["cname"] = "terrible"
    return event


def _flows(spans: pd.DataFrame, where: dict[str, tuple[int, int]]) -> list[dict]:
    """A flow arrow from each parent to each child that runs in another process."""
    by_id = spans.set_index("span_id")[["process_id", "start_ns", "end_ns", "name"]]
    by_id = by_id[~by_id.index.duplicated()]
    children = spans[spans["parent_span_id"].isin(by_id.index)]
    out = []
    for n, child in enumerate(children.itertuples(index=False)):
        parent = by_id.loc[child.parent_span_id]
        if parent["process_id"] == child.process_id:
            continue
        ts = min(max(int(child.start_ns), int(parent["start_ns"])), int(parent["end_ns"]))
        ppid, ptid = where[child.parent_span_id]
        cpid, ctid = where[child.span_id]
        name = f"{parent['name']} → {child.name}"
        out.append({"ph": "s", "id": n + 1, "name": name, "cat": "flow", "pid": ppid, "tid": ptid, "ts": _us(ts)})
        out.append({"ph": "f", "bp": "e", "id": n + 1, "name": name, "cat": "flow", "pid": cpid, "tid": ctid,
                    "ts": _us(child.start_ns)})
    return out


def write(con, out: str | Path, *, steps: Steps = None) -> int:
    """Write the trace to `out` (temp file + rename); returns the number of events."""
    trace = chrome_trace(con, steps=steps)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(_json.dumps(trace, separators=(",", ":")))
    tmp.replace(out)
    return len(trace["traceEvents"])

