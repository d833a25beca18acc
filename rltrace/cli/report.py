"""`rltrace report RUN_DIR [--steps A:B] [--json] [--compare OTHER_RUN]`: where the time goes."""

from __future__ import annotations

import argparse
import sys

from rltrace.cli._console import Console
from rltrace import _json, report, store
from rltrace.analysis import configure_serving, parse_steps
from rltrace.cli import _options
from rltrace.cli._progress import analysing


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="bottleneck, waits, critical path, stragglers, cost model and hangs of a run",
        description="Where a run's step time goes (docs/analysis.md lists every --json key).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--steps", metavar="A:B", help="only steps A to B inclusive (A:, :B or one step also work; negative steps too: -1:2)")
    p.add_argument("--json", action="store_true", help="print the report as JSON with stable keys")
    p.add_argument("--full", action="store_true", help="print every table (phases, steps, critical paths), not one screen")
    p.add_argument("--compare", metavar="OTHER_RUN", help="put another run side by side")
    _options.skip_corrupt(p)
    _options.serving(p)
    p.set_defaults(func=main)


def collect(run_dir: str, *, steps=None, skip_corrupt: bool = False, serving: dict | None = None) -> dict:
    """The report of one run; `serving`: the options of `analysis.configure_serving` (model, kv_dtype, ...)."""

    def build() -> tuple[dict, dict]:
        snap = store.scan(run_dir, skip_corrupt=skip_corrupt)
        con = store.connect(snap)
        try:
            if serving:
                configure_serving(con, **serving)
            return report.build(con, steps=steps, skipped=snap.skipped), snap.manifest
        finally:
            con.close()

    data, manifest = store.skipping_damaged(run_dir, skip_corrupt, build)  # this run's and --compare's alike
    return {"run": {"name": manifest.get("name"), "run_id": manifest["run_id"], "run_dir": str(run_dir)}, **data}


def main(args: argparse.Namespace) -> int:
    steps = parse_steps(args.steps)
    console = Console()
    serving = _options.serving_values(args)
    with analysing(console, "analysing run…") if not args.json else _nothing():
        data = collect(args.run_dir, steps=steps, skip_corrupt=args.skip_corrupt, serving=serving)
        if args.compare:
            other = collect(args.compare, steps=steps, skip_corrupt=args.skip_corrupt, serving=serving)
            data["compare"] = {"run": other["run"], "rows": report.compare(data, other)}
    if args.json:  # indented for a person at a terminal; one line for a program (3x faster to write)
        print(_json.dumps(report.plain(data), indent=2 if sys.stdout.isatty() else None))
        return 0
    report.render(data, console, full=args.full)
    if args.compare:
        report.render_compare(data["compare"]["rows"], data["run"]["name"], data["compare"]["run"]["name"], console)
    return 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
