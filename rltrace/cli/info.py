"""`rltrace info RUN_DIR`: what is in a run — processes, steps, phases, open spans, drops."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time

from rich.table import Table

from rltrace.cli._console import Console

from rltrace import _json, _names, analysis, store
from rltrace.analysis._format import seconds_text, term
from rltrace.analysis import health
from rltrace.analysis.health import STALE_AFTER_S
from rltrace.cli import _options
from rltrace.report import plain
from rltrace.report.findings import crash_sentence, unstepped_sentence
from rltrace.store import rows as store_rows


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="processes, steps, phases, span counts, open spans and drops of a run")
    p.add_argument("run_dir", metavar="RUN_DIR")
    _options.skip_corrupt(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    p.set_defaults(func=main)


def collect(run_dir: str, *, skip_corrupt: bool = False) -> dict:
    """Everything `rltrace info` shows, as plain data. Every page of every part is read first, so
    `info` finds any damage a report would meet (and, with `skip_corrupt`, leaves out the same parts)."""
    snap = store.scan(run_dir, skip_corrupt=skip_corrupt)
    store.check_pages(snap)
    con = store.connect(snap)
    try:  # closed here: DuckDB removes what it spilled to disk when its connection closes
        return _collect(con, snap, run_dir)
    finally:
        con.close()


def _collect(con, snap, run_dir: str) -> dict:
    def rows(sql: str, params: list | None = None) -> list[dict]:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    now_ns = time.time_ns()
    processes = plain(health.process_states(con, analysis.processes(con), now_ns))
    counts = rows(
        """SELECT count(*) FILTER (NOT is_open) AS finished, count(*) FILTER (is_open) AS open,
                  min(step) FILTER (NOT is_open) AS first_step, max(step) FILTER (NOT is_open) AS last_step,
                  count(DISTINCT step) FILTER (NOT is_open) AS steps
           FROM spans"""
    )[0]
    # the steps the report counts: trainer steps with a finished span; the steps work ran ahead into apart
    trained, ahead = analysis.trainer_steps(con, None)
    counts["ran_ahead"] = ahead
    if ahead:
        counts["last_step"], counts["steps"] = trained[1], counts["steps"] - len(ahead)
    counts["open_only_steps"] = [r["step"] for r in rows(
        "SELECT DISTINCT step FROM spans WHERE is_open AND step IS NOT NULL AND step NOT IN "
        "(SELECT DISTINCT step FROM spans WHERE NOT is_open AND step IS NOT NULL) ORDER BY step")]
    phases = rows(
        """SELECT coalesce(phase, name) AS phase, count(*) AS spans, sum(duration_s) AS total_s,
                  avg(duration_s) AS mean_s, max(duration_s) AS max_s
           FROM spans WHERE NOT is_open GROUP BY 1 ORDER BY total_s DESC NULLS LAST"""
    )
    # and spans rltrace ended because their process exited with them open; state as the report says
    cols = ["process_id", "role", "rank", "name", "phase", "step", "start_ns", "span_id", "age_s", "open_s", "state",
            "in_progress"]
    open_spans = plain(analysis.open_spans(con, now_ns=now_ns))
    health.mark_in_progress(con, open_spans)
    at_exit = sum(span["state"] in ("exited", "crashed") for span in open_spans)
    open_spans = [{k: span[k] for k in cols} for span in open_spans]
    counts["finished"] -= at_exit  # one count per span: those ended at exit are counted as open
    counts["open"] += at_exit
    counts["open_at_exit"] = at_exit
    crashes = rows("SELECT role, rank, kind, thread_name, exc_type, message, phase, step, process_id FROM crashes ORDER BY time_ns")
    tables = {name: sum(p.rows for p in parts) for name, parts in snap.parts.items()}
    frozen = rows("SELECT count(DISTINCT (step, batch_id)) AS n FROM batches")[0]["n"] if tables.get("batches") else 0
    return {
        "run_dir": str(run_dir),
        "run_id": snap.manifest["run_id"],
        "name": snap.manifest.get("name"),
        "created": snap.manifest.get("created"),
        "rows": tables,
        "frozen_batches": frozen,
        "parts": {name: len(parts) for name, parts in snap.parts.items()},
        "spans": counts,
        "phases": phases,
        "processes": processes,
        "open_spans": open_spans,
        "crashes": crashes,
        "unstepped": health.unstepped(con),
        "spans_dropped": sum(p["spans_dropped"] or 0 for p in processes),
        "rows_dropped": sum(p["rows_dropped"] or 0 for p in processes),
        "attributes_dropped": sum(p["attributes_dropped"] or 0 for p in processes),
        "drop_reasons": _reasons(processes),
        "skipped_parts": snap.skipped,
    }


def _reasons(processes: list[dict]) -> list[dict]:
    """Every process's drop reasons, summed over processes: {table, column, reason, count}."""
    total: dict[tuple, int] = {}
    for p in processes:
        try:
            records = json.loads(p.pop("drop_reasons") or "[]")
        except ValueError:
            continue
        for r in records if isinstance(records, list) else []:
            if isinstance(r, dict):
                key = (r.get("table"), r.get("column"), r.get("reason"))
                total[key] = total.get(key, 0) + int(r.get("count") or 0)
    return [{"table": t, "column": c, "reason": r, "count": n} for (t, c, r), n in total.items()]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _ago(ns: int | None, now_ns: int) -> str:
    if ns is None:
        return "-"
    seconds = (now_ns - ns) / 1e9
    if seconds < 7200:
        return f"{seconds_text(round(seconds))} ago"
    return dt.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")


#: what a row of a table is, where its name says otherwise (a `batches` row is one frozen sample)
_ROW_NAMES = {"batches": "frozen samples", "replays": "replayed samples"}


def render(data: dict, console: Console) -> None:
    now_ns = time.time_ns()
    console.print(f"[bold]{term(data['name'])}[/]  run {term(data['run_id'])}  created {term(data['created'])}")
    derived = {t.name: label for t, label in zip(_names.SPAN_SIDECARS, ("per-part summaries", "stored request rows"))}
    held = [f"{n:,} {_ROW_NAMES.get(k, k)}" + (f" ({data.get('frozen_batches') or 0:,} batch{'' if data.get('frozen_batches') == 1 else 'es'})" if k == "batches" else "")
            + f" in {_count(data['parts'][k], 'part')}" for k, n in data["rows"].items() if n and k not in derived]
    beside = [f"{label} for {_count(data['parts'][k], 'span part')}" for k, label in derived.items() if data["parts"].get(k)]
    console.print(f"{term(data['run_dir'])}  ·  " + (", ".join(held) or "nothing recorded yet")
                  + (f" ({', '.join(beside)})" if beside else ""))
    s = data["spans"]
    steps = "no steps" if s["steps"] == 0 else f"steps {s['first_step']}–{s['last_step']} ({s['steps']} distinct)"
    ahead = s.get("ran_ahead") or []
    if ahead:
        steps += (f"; work ran ahead into step {ahead[0]}" if len(ahead) == 1 else
                  f"; work ran ahead into steps {ahead[0]}–{ahead[-1]}") + ", which the trainer never reached"
    started = s.get("open_only_steps") or []
    if started:
        steps += "; only open spans in step" + ("s " if len(started) > 1 else " ") + ", ".join(map(str, started))
    at_exit = s.get("open_at_exit") or 0
    ended = f" ({at_exit} ended by rltrace when its process exited)" if at_exit else ""
    console.print(f"{s['finished']} finished spans, {s['open']} open{ended} · {steps}")

    t = Table(title="Processes", title_justify="left")
    for col in ("role", "rank", "host:pid", "spans", "open", "dropped", "last heard", "ended"):
        t.add_column(col, justify="right" if col in ("rank", "spans", "open", "dropped") else "left")
    for p in data["processes"]:
        dropped = (p["spans_dropped"] or 0) + (p["rows_dropped"] or 0)
        ended = {
            "crashed": "[red]crashed[/] " + _ago(p["ended_ns"], now_ns),
            "ended": "cleanly " + _ago(p["ended_ns"], now_ns),
            "killed": "[red]no: it stopped (killed)[/]",
        }.get(p.get("state"), "[yellow]not yet (running or hung)[/]")
        t.add_row(
            term(p["role"]),
            "" if p["rank"] is None else str(p["rank"]),
            term(f"{p['host']}:{p['pid']}"),
            str(p["spans"]),
            str(p["open_spans"]),
            f"[red]{dropped}[/]" if dropped else "0",
            _ago(p["heartbeat_ns"], now_ns),
            ended,
        )
    console.print(t)

    t = Table(title="Phases (span durations)", title_justify="left")
    for col in ("phase", "spans", "total", "per span", "longest"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for ph in data["phases"]:
        t.add_row(term(ph["phase"]), str(ph["spans"]), seconds_text(ph["total_s"]), seconds_text(ph["mean_s"]),
                  seconds_text(ph["max_s"]))
    console.print(t)

    for c in data.get("crashes", []):
        console.print("[red]Crash:[/] " + term(crash_sentence(c)))
    if (data.get("unstepped") or {}).get("spans"):
        console.print("[yellow]No step:[/] " + term(unstepped_sentence(data["unstepped"])))
    if data["open_spans"]:
        t = Table(title="[yellow]Open spans[/] (started, never ended: running, hung or killed)", title_justify="left")
        for col in ("role", "rank", "phase", "step", "started", "open for", "its process"):
            t.add_column(col)
        for o in data["open_spans"]:
            t.add_row(
                term(o["role"]),
                "" if o["rank"] is None else str(o["rank"]),
                term(o["phase"] or o["name"]),
                "" if o["step"] is None else str(o["step"]),
                dt.datetime.fromtimestamp(o["start_ns"] / 1e9).strftime("%H:%M:%S"),
                seconds_text(o["open_s"]),
                "alive: in progress" if o.get("in_progress") else
                {"killed": "[red]killed (open at least this)[/]", "running": "alive: hung or still running",
                 "crashed": "[red]crashed: the crash ended it[/]"}.get(o.get("state"), "exited with it open"),
            )
        console.print(t)
    else:
        console.print("No open spans.")
    reasons = data["drop_reasons"]
    if data["spans_dropped"] or data["rows_dropped"] or data["attributes_dropped"] or reasons:
        console.print(
            f"[red]Dropped: {data['spans_dropped']} spans, {data['rows_dropped']} metric/sample rows, "
            f"{data['attributes_dropped']} span attributes[/]" + ("" if reasons else " (reasons not recorded by this rltrace version)")
        )
        for line in store_rows.describe(reasons):
            console.print("  " + term(line))
    else:
        console.print("Nothing dropped.")
    for skipped in data["skipped_parts"]:
        console.print(f"[yellow]skipped corrupt part:[/] {term(skipped)}")


def main(args: argparse.Namespace) -> int:
    data = collect(args.run_dir, skip_corrupt=args.skip_corrupt)
    if args.json:
        print(_json.dumps(data, indent=2, default=str))
    else:
        render(data, Console())
    return 0
