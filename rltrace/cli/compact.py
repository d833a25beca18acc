"""`rltrace compact RUN_DIR`: merge small parts into large sorted ones; safe while writers run."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import Progress

from rltrace.cli._console import Console
from rltrace import _names, analysis, store
from rltrace.analysis import summary
from rltrace.cli import _options
from rltrace.cli._progress import analysing
from rltrace.store.compact import GRACE_S, TARGET_ROWS, writing_into
from rltrace.store.parts import write_part


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compact",
        help="merge small part files into large ones sorted by step (safe while the run is being written)",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--target-rows", type=int, default=TARGET_ROWS, help="rows per merged part")
    p.add_argument(
        "--grace", type=float, default=GRACE_S, help="seconds replaced parts stay for readers that listed them (default %(default)s)"
    )
    _options.skip_corrupt(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    console = Console()
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        tasks: dict[str, int] = {}

        def progress(table: str, done: int, total: int) -> None:
            if table not in tasks:
                tasks[table] = bar.add_task(f"compacting {table}", total=total)
            bar.update(tasks[table], completed=done)

        results = store.compact(args.run_dir, target_rows=args.target_rows, grace_s=args.grace, progress=progress,
                                skip_corrupt=args.skip_corrupt)
    for r in results:
        console.print(f"{r.table}: {r.parts_before} parts -> {r.parts_after} ({r.rows} rows)")
    with analysing(console, "precomputing per-step summaries…"):
        with writing_into(args.run_dir):
            rows = write_summaries(args.run_dir, skip_corrupt=args.skip_corrupt)
    console.print(f"step_summary: {rows} rows (reports reuse them while the steps are unchanged)")
    return 0


def write_summaries(run_dir, *, skip_corrupt: bool = False) -> int:
    """Store every step's summary (docs/analysis.md) so reports over large runs stay fast (an
    `s3://` run's: written in the local copy the connection read, then uploaded)."""
    from rltrace.store import objstore

    snap = store.scan(run_dir, skip_corrupt=skip_corrupt)
    con = store.connect(snap)
    table = analysis.summary_table(con)
    folder = Path(snap.run_dir) / _names.STEP_SUMMARY.folder
    digest = summary.parts_digest(con)  # the span parts this summary was computed from
    path = write_part(folder, "step_summary.parquet", table, _names.STEP_SUMMARY, {_names.META_SUMMARY_OF: digest.encode()})
    if objstore.is_uri(run_dir):
        objstore.upload(run_dir, snap.run_dir, path)
    return table.num_rows
