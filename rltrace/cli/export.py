"""`rltrace export RUN_DIR --format FORMAT ...`: a stored run in another tool's format.

A small dispatcher: each format lives in its own module and registers its options here.
  chrome  Chrome Trace Event JSON for Perfetto / chrome://tracing (rltrace.export.chrome)
  otlp    replay the spans to an OpenTelemetry backend over OTLP/HTTP (rltrace.export.otlp)
  slime   a frozen batch as a slime rollout dump for --load-debug-rollout-data (rltrace.replay.slime_export)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import Progress

from rltrace.cli._console import Console
from rltrace import store
from rltrace.store import objstore
from rltrace._config import RltraceError
from rltrace.analysis import parse_steps
from rltrace.cli import _options

FORMATS = ("chrome", "otlp", "slime")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run as a Perfetto/Chrome trace or a slime rollout dump, or replay it to an OTLP backend")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--format", required=True, choices=FORMATS, help="chrome: trace JSON; otlp: send to --endpoint; slime: rollout dump")
    p.add_argument("--out", metavar="FILE", help="chrome: output file (default RUN_DIR/trace.json); slime: output file, may hold {rollout_id}")
    p.add_argument("--endpoint", metavar="URL", help="otlp: backend address, e.g. http://localhost:6006")
    p.add_argument("--steps", metavar="A:B", help="only steps A to B inclusive")
    p.add_argument("--step", type=int, metavar="N", help="slime: the frozen batch of step N (default: every batch)")
    _options.skip_corrupt(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.format == "slime":
        from rltrace.replay.slime_export import export_command

        _check_template(args.out)

        return export_command(args)
    steps = parse_steps(args.steps)
    return {"chrome": _chrome, "otlp": _otlp}[args.format](args, steps)


def _check_template(out: str | None) -> None:
    """`--out` for slime is a path template: only `{rollout_id}` may stand in braces."""
    if out is None:
        return
    try:
        out.format(rollout_id=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise RltraceError(
            f"--out {out!r}: braces name a field ({exc}); only {{rollout_id}} is filled in, write {{{{ and }}}} for literal braces"
        ) from None


def _chrome(args: argparse.Namespace, steps) -> int:
    from rltrace.export import chrome

    out = Path(args.out) if args.out else (Path("trace.json") if objstore.is_uri(args.run_dir) else Path(args.run_dir) / "trace.json")
    if not out.parent.is_dir():
        raise RltraceError(f"cannot write {out}: folder {out.parent} does not exist")
    console = Console(stderr=True)
    with console.status("writing Chrome trace…"):
        events = chrome.write(store.open(args.run_dir, skip_corrupt=args.skip_corrupt), out, steps=steps)
    console.print(f"wrote {events} events to {out}; open it at https://ui.perfetto.dev or chrome://tracing")
    if events > chrome.LARGE_TRACE_EVENTS:
        console.print("[yellow]large trace: Perfetto's web UI may struggle; export fewer steps with --steps A:B[/]")
    return 0


def _otlp(args: argparse.Namespace, steps) -> int:
    from rltrace.export import otlp

    if not args.endpoint:
        raise RltraceError("--format otlp needs --endpoint URL (e.g. http://localhost:6006)")
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("replaying spans", total=None)
        result = otlp.replay(store.open(args.run_dir, skip_corrupt=args.skip_corrupt), args.endpoint, steps=steps,
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
    console.print(f"sent {result.sent} spans to {result.url}"
                  + (f"; {result.open_skipped} open spans left out (OTLP needs an end time)" if result.open_skipped else ""))
    return 0
