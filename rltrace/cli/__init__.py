"""The `rltrace` command. Each subcommand lives in its own module with `register(subparsers)`.

Errors that a user can act on (`RltraceError`) print as one line and exit with status 2;
anything else is a bug in rltrace and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys

from rltrace._config import RltraceError
from rltrace.cli import compact, export, importer, info, profile, replay, report, run, ui

COMMANDS = [info, compact, report, replay, importer, export, profile, ui, run]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rltrace",
        description="Observability for RL post-training runs recorded with rltrace.",
    )
    parser.add_argument("--version", action="version", version=f"rltrace {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def _version() -> str:
    from rltrace import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except RltraceError as exc:
        print(f"rltrace: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # python -m rltrace.cli
    sys.exit(main())
