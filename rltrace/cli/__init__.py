"""The `rltrace` command. Each subcommand lives in its own module with `register(subparsers)`.

Errors that a user can act on (`RltraceError`) print as one line and exit with status 2;
anything else is a bug in rltrace and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from rltrace._config import RltraceError
from rltrace.analysis._format import shown
from rltrace.cli import collect, compact, export, importer, info, profile, replay, report, run, ui, watch

COMMANDS = [info, compact, report, replay, importer, export, profile, ui, watch, run, collect]


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
        try:
            code = args.func(args) or 0
        except Exception as exc:  # a part merged away meanwhile, or one whose footer reads but whose data pages do not
            if not (_merged_away(exc) or _damaged_parts(args, exc)):
                raise
            code = args.func(args) or 0  # once more: on the run as it is now (--skip-corrupt: without the damaged parts)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit-time flush
        return code
    except RltraceError as exc:
        print(f"rltrace: error: {shown(exc)}", file=sys.stderr)  # it may quote a file's text: escapes stay inert
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rltrace report --json | head`: the reader has what it wanted
        _quiet_stdout()
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so Python's exit-time flush of the closed pipe raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests capture it)
        pass


def _merged_away(exc: Exception) -> bool:
    """Whether a query failed because a part it listed is gone: a writer merged it into a larger
    part and deleted it after the grace (`RLTRACE_MERGE_GRACE`) while this command ran."""
    import duckdb

    text = str(exc)
    return isinstance(exc, (duckdb.IOException, FileNotFoundError)) and (
        "No files found that match the pattern" in text or "No such file or directory" in text)


def _damaged_parts(args: argparse.Namespace, exc: Exception) -> bool:
    """After a DuckDB error: find the damaged parts of the run and either name them (raising a
    one-line error) or, with --skip-corrupt, return True so the command runs again without them."""
    import duckdb

    from rltrace.store import CorruptPartError
    from rltrace.store.views import find_damaged

    run_dir = getattr(args, "run_dir", None)
    if not isinstance(exc, duckdb.Error) or not isinstance(run_dir, str):
        return False
    damaged = find_damaged(run_dir)
    if not damaged:
        return False
    if getattr(args, "skip_corrupt", False):
        for line in damaged:
            print(f"rltrace: skipping {line}", file=sys.stderr)
        return True
    hint = " (rerun with --skip-corrupt to skip it)" if hasattr(args, "skip_corrupt") else ""
    raise CorruptPartError("; ".join(damaged) + hint) from None


if __name__ == "__main__":  # python -m rltrace.cli
    sys.exit(main())
