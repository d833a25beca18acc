"""`rltrace profile list RUN_DIR` and `rltrace profile show RUN_DIR PROFILE_ID`: the py-spy and
torch.profiler captures of a run, the spans they explain, their top frames and how to open them."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys

from rich import box
from rich.table import Table

from rltrace.cli._console import Console
from rltrace import _json, store
from rltrace.analysis._format import size_text, process_name, seconds_text, share_text, term
from rltrace.cli import _options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="profiles (py-spy, torch.profiler) attached to slow or hung phases")
    commands = p.add_subparsers(dest="profile_command", metavar="ACTION", required=True)
    listing = commands.add_parser("list", help="every profile of a run: phase, step, trigger, status, top frame")
    listing.add_argument("run_dir", metavar="RUN_DIR")
    listing.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    _options.skip_corrupt(listing)
    listing.set_defaults(func=main_list)
    show = commands.add_parser("show", help="one profile: its span, top frames, file and how to open it")
    show.add_argument("run_dir", metavar="RUN_DIR")
    show.add_argument("profile_id", metavar="PROFILE_ID", help="the id, or its first characters")
    show.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    _options.skip_corrupt(show)
    show.set_defaults(func=main_show)


WIDE = 110  # columns from which `profile list` shows every column


def _console() -> Console:
    """A terminal's own width; piped output is not squeezed to 80 columns (ids stay whole for grep)
    unless COLUMNS says how wide to be."""
    if sys.stdout.isatty():
        return Console(soft_wrap=True)
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() else 200, soft_wrap=True)


def _status(status: str) -> str:
    colour = {"ok": "green", "running": "yellow"}.get(status, "red")
    return f"[{colour}]{term(status)}[/]"


def main_list(args: argparse.Namespace) -> int:
    from rltrace.profiling import list_profiles
    from rltrace.profiling.query import inside_text

    rows = list_profiles(store.open(args.run_dir, skip_corrupt=args.skip_corrupt))
    if args.json:
        print(_json.dumps(rows, indent=2, default=str))
        return 0
    console = _console()
    if not rows:
        console.print(
            f"No profiles in {term(args.run_dir)}. Turn profiling on with RLTRACE_PROFILE_SLOW=3, "
            "RLTRACE_HANG_TIMEOUT=SECONDS or RLTRACE_TORCH_PROFILE=PHASE:STEPS (docs/profiling.md)."
        )
        return 0
    t = Table(title=f"Profiles of {term(args.run_dir)}", title_justify="left", box=box.SIMPLE_HEAD)
    wide = console.width >= WIDE  # narrower: the trigger (and a status other than ok) joins the kind
    columns = ("id", "step", "phase", "process", "kind", *(("trigger", "status") if wide else ()), "size", "top frame")
    for col in columns:
        t.add_column(col, justify="right" if col in ("step", "size") else "left",
                     no_wrap=col not in ("top frame", "kind"), overflow="fold")
    for r in rows:
        top = "-" if r["top_frame"] is None else f"{term(r['top_frame'])} ({share_text(r['top_self_share'])})"
        if inside_text(r):
            top += f" · {inside_text(r)}"
        kind = term(r["kind"]) if wide else f"{term(r['kind'])} ({term(r['trigger'])})" + (
            "" if r["status"] == "ok" else f" {_status(r['status'])}")
        t.add_row(
            term(r["profile_id"][:8]),
            "" if r["step"] is None else str(r["step"]),
            term(r["phase"] or "-"),
            term(process_name(r["role"], r["rank"])),
            kind,
            *((term(r["trigger"]), _status(r["status"])) if wide else ()),
            size_text(r["size_bytes"]),
            top,
        )
    console.print(t)
    console.print("Details: rltrace profile show RUN_DIR ID (the first characters of the id are enough)", soft_wrap=False)
    return 0


def main_show(args: argparse.Namespace) -> int:
    from rltrace.profiling import artefact_path, get_profile, top_frames
    from rltrace.profiling.query import how_to_open, inside_text

    con = store.open(args.run_dir, skip_corrupt=args.skip_corrupt)
    profile = get_profile(con, args.profile_id)
    frames = top_frames(con, profile["profile_id"])
    path = artefact_path(args.run_dir, profile["path"])
    if args.json:
        print(_json.dumps({**profile, "file": str(path) if path else None, "frames": frames}, indent=2, default=str))
        return 0
    console = _console()
    p = profile
    started = dt.datetime.fromtimestamp(p["started_ns"] / 1e9).strftime("%Y-%m-%d %H:%M:%S")
    seconds = "" if p["ended_ns"] is None else f", {seconds_text((p['ended_ns'] - p['started_ns']) / 1e9)}"
    console.print(f"[bold]profile {term(p['profile_id'])}[/]  {term(p['kind'])} ({term(p['trigger'])})  {_status(p['status'])}")
    console.print(term(
        f"phase {p['phase']} · step {p['step']} · {p['process_id']} (pid {p['pid']}, thread {p['native_thread_id']})"
    ))
    console.print(term(f"span {p['trace_id']}/{p['span_id']} ({p['span_name']})"))
    console.print(f"why: {term(p['reason'])}")
    console.print(f"taken {started}{seconds}" + ("" if p["samples"] is None else f", {p['samples']} samples/events")
                  + (f" ({inside_text(p)})" if inside_text(p) else ""))
    if p["message"]:
        console.print(f"[yellow]note:[/] {term(p['message'])}")
    if frames:
        dump = p["kind"] == "pyspy_dump"
        title = "Stack of the phase's thread (innermost first)" if dump else "Top frames by self time"
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("#", "frame", "where", "self", "total", "thread"):
            t.add_column(col, justify="right" if col in ("#", "self", "total") else "left")
        for f in frames:
            where = "" if f["file"] is None else f"{f['file']}:{f['line']}"
            t.add_row(
                str(f["rank"]),
                term(f["frame"]),
                term(where),
                f"{f['self_share']:.1%}",
                f"{f['total_share']:.1%}",
                term(f["thread"] or ""),
            )
        console.print(t)
    if path is None:
        console.print("No file was written.")
    elif not path.exists():
        console.print(f"[red]file missing:[/] {term(path)}")
    else:
        console.print(f"file: {term(path)}")
        console.print(f"open: {term(how_to_open(p['kind'], path))}")
    return 0
