"""`rltrace import FORMAT PATH... --out RUN_DIR`: bring another tool's dumps into a run store."""

from __future__ import annotations

import argparse
import importlib

from rltrace.importers import frameworks

FORMATS = {
    "slime": "rltrace.replay.slime:import_command",  # --save-debug-rollout-data / --save-debug-train-data dumps
    "metrics": "rltrace.importers.metrics:command",  # TensorBoard event files, JSONL / CSV scalar logs
}
FRAMEWORKS = ("auto", *frameworks.FRAMEWORKS)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="convert another tool's dumps into a run: " + ", ".join(FORMATS))
    p.add_argument("format", choices=sorted(FORMATS))
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="slime: dump files, or directories searched for *.pt; metrics: TensorBoard log dirs "
                        "(searched recursively), event files, .jsonl or .csv logs")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to create or add to")
    p.add_argument("--trust-pickle", action="store_true", help="load dumps the safe loader refuses (runs the full unpickler: only for files you trust)")
    p.add_argument("--framework", choices=FRAMEWORKS, default="auto",
                   help="metrics: which framework wrote the log (its names map to rltrace's); auto by default")
    p.add_argument("--drop-field", action="append", default=[], metavar="NAME", help="leave this sample field out (e.g. multimodal_inputs)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    module, _, name = FORMATS[args.format].partition(":")
    return getattr(importlib.import_module(module), name)(args)
