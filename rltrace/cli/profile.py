"""`rltrace profile list RUN_DIR` and `rltrace profile show RUN_DIR PROFILE_ID`: the py-spy and
torch.profiler captures of a run, the spans they explain, their top frames and how to open them."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from rich import box
from rich.console import Console
from rich.table import Table

from rltrace import store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="profiles (py-spy, torch.profiler) attached to slow or hung phases")
    commands = p.add_subparsers(dest="profile_command", metavar="ACTION", required=True)
    listing = commands.add_parser("list", help="every profile of a run: phase, step, trigger, status, top frame")
    listing.add_argument("run_dir", metavar="RUN_DIR")
    listing.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    listing.set_defaults(func=main_list)
    show = commands.add_parser("show", help="one profile: its span, top frames, file and how to open it")
    show.add_argument("run_dir", metavar="RUN_DIR")
    show.add_argument("profile_id", metavar="PROFILE_ID", help="the id, or its first characters")
    show.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    show.set_defaults(func=main_show)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _console() -> Console:
    """A terminal's own width; piped output is not squeezed to 80 columns (ids stay whole for grep)."""
    return Console(soft_wrap=True) if sys.stdout.isatty() else Console(width=200, soft_wrap=True)


def _status(status: str) -> str:
    colour = {"ok": "green", "running": "yellow"}.get(status, "red")
    return f"[{colour}]{status}[/]"


def main_list(args: argparse.Namespace) -> int:
    from rltrace.profiling import list_profiles

    rows = list_profiles(store.open(args.run_dir))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    console = _console()
    if not rows:
        console.print(
            f"No profiles in {args.run_dir}. Turn profiling on with RLTRACE_PROFILE_SLOW=3, "
            "RLTRACE_HANG_TIMEOUT=SECONDS or RLTRACE_TORCH_PROFILE=PHASE:STEPS (docs/profiling.md)."
        )
        return 0
    t = Table(title=f"Profiles of {args.run_dir}", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("id", "step", "phase", "process", "kind", "trigger", "status", "size", "top frame"):
        t.add_column(
            col, justify="right" if col in ("step", "size") else "left", no_wrap=col not in ("process", "top frame")
        )
    for r in rows:
        who = r["role"] + ("" if r["rank"] is None else str(r["rank"]))
        top = "-" if r["top_frame"] is None else f"{r['top_frame']} ({r['top_self_share']:.0%})"
        t.add_row(
            r["profile_id"][:8],
            "" if r["step"] is None else str(r["step"]),
            r["phase"] or "-",
            who,
            r["kind"],
            r["trigger"],
            _status(r["status"]),
            _size(r["size_bytes"]),
            top,
        )
    console.print(t)
    console.print("Details: rltrace profile show RUN_DIR ID (the first characters of the id are enough)")
    return 0


def main_show(args: argparse.Namespace) -> int:
    from rltrace.profiling import artefact_path, get_profile, top_frames
    from rltrace.profiling.query import how_to_open

    con = store.open(args.run_dir)
    profile = get_profile(con, args.profile_id)
    frames = top_frames(con, profile["profile_id"])
    path = artefact_path(args.run_dir, profile["path"])
    if args.json:
        print(json.dumps({**profile, "file": str(path) if path else None, "frames": frames}, indent=2, default=str))
        return 0
    console = _console()
    p = profile
    started = dt.datetime.fromtimestamp(p["started_ns"] / 1e9).strftime("%Y-%m-%d %H:%M:%S")
    seconds = "" if p["ended_ns"] is None else f", {(p['ended_ns'] - p['started_ns']) / 1e9:.2f} s"
    console.print(f"[bold]profile {p['profile_id']}[/]  {p['kind']} ({p['trigger']})  {_status(p['status'])}")
    console.print(
        f"phase {p['phase']} · step {p['step']} · {p['process_id']} (pid {p['pid']}, thread {p['native_thread_id']})"
    )
    console.print(f"span {p['trace_id']}/{p['span_id']} ({p['span_name']})")
    console.print(f"why: {p['reason']}")
    console.print(f"taken {started}{seconds}" + ("" if p["samples"] is None else f", {p['samples']} samples/events"))
    if p["message"]:
        console.print(f"[yellow]note:[/] {p['message']}")
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
                f["frame"],
                where,
                f"{f['self_share']:.1%}",
                f"{f['total_share']:.1%}",
                f["thread"] or "",
            )
        console.print(t)
    if path is None:
        console.print("No file was written.")
    elif not path.exists():
        console.print(f"[red]file missing:[/] {path}")
    else:
        console.print(f"file: {path}")
        console.print(f"open: {how_to_open(p['kind'], path)}")
    return 0
