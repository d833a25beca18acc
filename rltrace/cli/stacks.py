"""`rltrace stacks RUN [--wait S] [--json]`: every live process's Python stacks, and who waits on whom."""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

from rltrace.analysis._format import seconds_text, term
from rltrace.cli import _options
from rltrace.cli._console import Console

OWN_THREADS = ("rltrace-", "OtelBatchSpanRecordProcessor")  # rltrace's threads and its OTel pipeline's: one line
SHOWN_FRAMES = 12  # innermost frames printed per thread (the JSON output has them all)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks",
        help="ask every live process of a run for its Python stacks, and name what each blocked one waits on",
        description="Write a request into the run that every live process answers within a few seconds with every "
        "thread's Python stack and open spans (no ptrace: rltrace's own thread in each process takes them; a local "
        "dir or s3://). Prints the stacks and the blocking edges: a collective another rank never entered, a rank "
        "that stopped, a read from a host that never answers, a queue with no producer (docs/hangs.md).",
    )
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--wait", type=float, default=10.0, metavar="S",
                   help="seconds to wait for every live process to answer (default 10)")
    p.add_argument("--native", action="store_true",
                   help="also ask for native frames (each process runs py-spy dump --native on itself, where py-spy "
                   "is installed and may read the process)")
    p.add_argument("--no-ask", action="store_true", help="show the stacks already in the run; ask no process")
    p.add_argument("--bundle", metavar="FILE.tar.gz",
                   help="also write a hang bundle to attach to a bug report: the edges, stacks, open spans, "
                   "processes' last heartbeats, alerts, crashes and the last steps' times, as JSON")
    p.add_argument("--json", action="store_true", help="print the stacks and edges as JSON")
    _options.skip_corrupt(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from rltrace import store
    from rltrace.stacks import blocking, capture

    started = time.monotonic()
    answered, expected = set(), {}
    if not args.no_ask:
        _, answered, expected = capture.ask_and_wait(args.run_dir, timeout=max(args.wait, 0.0), native=args.native)
    took = time.monotonic() - started
    now_ns = time.time_ns()
    con = store.open(args.run_dir, skip_corrupt=args.skip_corrupt)
    try:
        found = blocking.edges(con, now_ns)
        dumps = blocking.latest(con)
        missing = {p: n for p, n in expected.items() if p not in answered}
        if args.json:
            print(json.dumps({"answered": sorted(answered), "missing": missing, "edges": [e.as_dict() for e in found],
                              "stacks": json.loads(dumps.to_json(orient="records"))}, indent=1))
        else:
            out = Console(highlight=False, soft_wrap=True, record=bool(args.bundle))
            _print(out, args, found, dumps, answered, expected, missing, took)
        if args.bundle:
            from rltrace.stacks import bundle

            text = "" if args.json else out.export_text()
            bundle.write(con, Path(args.bundle), text=text, now_ns=now_ns)
            if not args.json:
                print(f"Hang bundle: {args.bundle}")
    finally:
        con.close()
    return 0


def _print(out, args, found, dumps, answered, expected, missing, took) -> None:
    if not args.no_ask:
        out.print(f"Asked {len(expected)} live process(es) for their stacks; {len(answered & set(expected))} answered "
                  f"in {seconds_text(took)}.", markup=False)
    for p, name in sorted(missing.items(), key=lambda kv: kv[1]):
        out.print(term(f"{name} ({p}) did not answer within {seconds_text(args.wait)}: it holds the GIL in native "
                       "code, or runs with RLTRACE_STACKS=0."), markup=False)
    if found:
        out.print()
        out.print("[bold]Blocking[/bold]")
        for e in found:
            out.print("  " + term(e.text), markup=False)
            for line in e.proof:
                out.print("      " + term(line), markup=False)
    elif len(dumps):
        out.print()
        out.print("No thread with open work is blocked in a known call.", markup=False)
    _print_stacks(out, dumps)


def _print_stacks(out, dumps) -> None:
    helpers = {}
    for process_id, rows in dumps.groupby("process_id", sort=False):
        first = rows.iloc[0]
        rank = "" if first["rank"] is None or first["rank"] != first["rank"] else int(first["rank"])
        when = datetime.datetime.fromtimestamp(first["time_ns"] / 1e9).strftime("%H:%M:%S")
        out.print()
        out.print(term(f"{first['role']}{rank} on {first['host']} (pid {first['pid']}), stacks at {when} "
                       f"({first['trigger']})"), markup=False)
        for r in rows.itertuples():
            name = r.thread_name or f"thread {r.thread_id}"
            spans = json.loads(r.spans or "[]")
            if name.startswith(OWN_THREADS) and not spans:
                helpers.setdefault(process_id, []).append(name)
                continue
            opened = " < ".join(s["phase"] + ("" if s.get("step") is None else f" (step {s['step']})") for s in spans)
            peer = f", reading from {r.peer}" if isinstance(r.peer, str) else ""
            out.print(term(f"  Thread {name}" + (f": open {opened}" if opened else "") + peer), markup=False)
            frames = json.loads(r.frames or "[]")
            for f in reversed(frames[:SHOWN_FRAMES]):
                out.print(term(f'    File "{f[0]}", line {f[1]}, in {f[2]}'), markup=False)
                if f[3]:
                    out.print(term(f"      {f[3]}"), markup=False)
            if isinstance(r.native, str) and r.native:
                out.print("    native frames (py-spy), innermost first:", markup=False)
                for line in r.native.splitlines()[:SHOWN_FRAMES * 2]:
                    out.print(term(f"      {line}"), markup=False)
        if helpers.get(process_id):
            out.print(term(f"  rltrace's own threads: {', '.join(helpers[process_id])}"), markup=False)
