"""A hang bundle: what a user attaches to a bug report about a stuck run, in one .tar.gz.

`rltrace stacks RUN --bundle hang.tar.gz` writes, as JSON files: the blocking edges, every
process's latest stacks, the open spans (with their state), the processes (last heartbeats,
counts), the alerts `rltrace watch` raised, the crashes, and the last steps' wall times; plus
`stacks.txt`, the command's own text output.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

LAST_STEPS = 20  # steps' wall times kept


def _records(frame) -> list[dict]:
    return json.loads(frame.to_json(orient="records", default_handler=str))


def write(con, out: Path, *, text: str, now_ns: int | None = None) -> list[str]:
    """Write the bundle of the run open on `con` to `out`; returns the names of its files."""
    from rltrace.analysis import health, step_breakdown
    from rltrace.stacks.blocking import edges, latest

    now_ns = time.time_ns() if now_ns is None else now_ns
    last = con.execute("SELECT max(step) FROM spans WHERE step IS NOT NULL").fetchall()[0][0]
    steps = None if last is None else (int(last) - LAST_STEPS + 1, int(last))
    files = {
        "edges.json": [e.as_dict() for e in edges(con, now_ns)],
        "stacks.json": _records(latest(con)),
        "open_spans.json": _records(health.open_spans(con, now_ns)),
        "processes.json": _records(health.processes(con)),
        "alerts.json": _records(con.execute("SELECT * FROM alerts ORDER BY time_ns").df()),
        "crashes.json": _records(health.crashes(con)),
        "steps.json": _records(step_breakdown(con, steps)),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, value in [*((n, json.dumps(v, indent=1).encode()) for n, v in files.items()),
                            ("stacks.txt", text.encode())]:
            info = tarfile.TarInfo(f"hang/{name}")
            info.size, info.mtime = len(value), int(now_ns / 1e9)
            tar.addfile(info, io.BytesIO(value))
    tmp.replace(out)
    return [*files, "stacks.txt"]
