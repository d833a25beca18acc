"""The `rltrace` command. Each subcommand lives in its own module with `register(subparsers)`.

Errors that a user can act on (`RltraceError`) print as one line and exit with status 2;
anything else is a bug in rltrace and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time

from rltrace._config import RltraceError
from rltrace.analysis._format import shown
from rltrace.cli._options import SKIP_CORRUPT_HINT
from rltrace.cli import collect, compact, export, importer, info, profile, replay, report, run, stacks, ui, watch, whatif

COMMANDS = [info, compact, report, whatif, replay, importer, export, profile, ui, watch, stacks, run, collect]


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


#: a step range that starts with a minus (`-1:2`, `-3:`, `-5:-1`): argparse would take it for an option
_NEGATIVE_RANGE = re.compile(r"^-\d")
_STEP_RANGE_COMMANDS = ("report", "export", "whatif")  # the commands with --steps A:B


def step_range_args(argv: list[str]) -> list[str]:
    """`--steps -1:2` as `--steps=-1:2`, which argparse reads as the option's value (it reads only
    plain negative numbers so). Only for the commands that take --steps, and never after `--`."""
    if not argv or argv[0] not in _STEP_RANGE_COMMANDS:
        return argv
    out = list(argv[:1])
    i = 1
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] == "--steps" and i + 1 < len(argv) and _NEGATIVE_RANGE.match(argv[i + 1]):
            out.append(f"--steps={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(step_range_args(list(sys.argv[1:] if argv is None else argv)))
    try:
        try:
            code = args.func(args) or 0
        except Exception as exc:
            if _vanished(exc):  # a part merged or compacted away after this command listed it
                code = _again(args)
            elif _damaged_parts(args, exc):  # a part whose footer reads but whose data pages do not
                code = args.func(args) or 0  # --skip-corrupt: once more, without the damaged parts
            else:
                raise
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit-time flush
        return code
    except RltraceError as exc:
        hint = SKIP_CORRUPT_HINT if _could_skip(args, exc) else ""
        print(f"rltrace: error: {shown(exc)}{hint}", file=sys.stderr)  # it may quote a file's text: escapes stay inert
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rltrace report --json | head`: the reader has what it wanted
        _quiet_stdout()
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13)


#: Commands that only read a run and print: once their output is flushed the process ends at once,
#: without the interpreter's teardown of the DuckDB, Arrow and pandas objects they made (~0.1 s of
#: a report on 1M spans, whose whole run is ~1.3 s). Every file they write is closed by then.
READ_ONLY = frozenset({"report", "info", "whatif"})


def console() -> None:
    """The `rltrace` console script: `main()`, then exit (a read-only command without teardown)."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in READ_ONLY:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            _quiet_stdout()
            code = 141
        except (OSError, ValueError):
            pass
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so Python's exit-time flush of the closed pipe raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests capture it)
        pass


def _vanished(exc: Exception) -> bool:
    from rltrace.store.views import vanished

    return vanished(exc)


#: Reads of a run whose parts vanished before a command gives up: writers that exit one after
#: another each remove their merged-away parts within a second (`merge.EXIT_GRACE_S`).
READS = 5


def _again(args: argparse.Namespace) -> int:
    """The command again, on the parts as they are now, up to `READS` reads in all; then a one-line error."""
    from rltrace.store.views import backoff

    for attempt in range(2, READS + 1):
        time.sleep(max(backoff(attempt + 2), 0.2 * (attempt - 1)))  # what removes them (writers leaving, a compaction) is at work
        try:
            return args.func(args) or 0
        except Exception as exc:
            if not _vanished(exc):
                raise
    raise RltraceError(
        f"the run's parts changed on each of {READS} reads of this command (writers merging their parts or "
        "exiting, or a compaction with a short --grace, removed the ones it had listed): run it again once "
        "they are done, and give `rltrace compact` a longer --grace (the default, 5 s, covers most reads)"
    ) from None


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
        return True  # the second run's scan names each part it skips
    raise CorruptPartError("; ".join(damaged)) from None


def _could_skip(args: argparse.Namespace, exc: Exception) -> bool:
    """A damaged part stopped a command that has --skip-corrupt and was not given it."""
    from rltrace.store import CorruptPartError

    return isinstance(exc, CorruptPartError) and getattr(args, "skip_corrupt", None) is False


if __name__ == "__main__":  # python -m rltrace.cli
    sys.exit(main())
