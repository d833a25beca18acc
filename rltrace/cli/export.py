"""`rltrace export RUN_DIR --format FORMAT --out FILE [--step N]`: a run in another tool's format.

Each format is one function `command(args) -> int` in its own module, named in FORMATS and
imported only when chosen (so `rltrace --help` stays fast and torch stays optional).
"""

from __future__ import annotations

import argparse
import importlib

FORMATS = {
    "slime": "rltrace.replay.slime_export:export_command",  # a frozen batch as a slime rollout dump
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run (or part of it) in another tool's format: " + ", ".join(FORMATS))
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--out", required=True, metavar="FILE", help="output file (slime: may hold {rollout_id})")
    p.add_argument("--step", type=int, default=None, help="only this step")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    module, _, name = FORMATS[args.format].partition(":")
    return getattr(importlib.import_module(module), name)(args)
