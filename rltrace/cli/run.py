"""`rltrace run [--run-dir DIR] -- COMMAND ...`: trace a program that never imports rltrace.

Like `opentelemetry-instrument`: the command runs with RLTRACE_RUN_DIR set (to `--run-dir`, else
to RLTRACE_RUN_DIR as it was, else to a new runs/<date-time>) and rltrace's
start-up folder first on PYTHONPATH, so its `sitecustomize` runs in every Python process the
command starts (children, torchrun ranks, Ray workers that inherit the environment) and loads
the registered instrumentors there. The command's exit status is this command's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rltrace._config import RltraceError, resolve
from rltrace.store import objstore

BOOTSTRAP = Path(__file__).resolve().parents[1] / "integrations" / "bootstrap"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a command with every Python process it starts traced (zero code changes)",
        usage="rltrace run [--run-dir DIR] -- COMMAND [ARG ...]",
        description="Run COMMAND with rltrace's instrumentors loaded in every Python process it starts. "
        "RLTRACE_DISABLED=1 runs it untouched.",
    )
    p.add_argument("--run-dir", metavar="DIR",
                   help="run directory to record into (default: $RLTRACE_RUN_DIR if set, else a new runs/<date-time>)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command, after --")
    p.set_defaults(func=main)


def _new_run_dir() -> Path:
    base = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def environment(run_dir: Path | str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: RLTRACE_RUN_DIR, and the start-up folder leading PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["RLTRACE_RUN_DIR"] = run_dir if objstore.is_uri(run_dir) else str(Path(run_dir).resolve())
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BOOTSTRAP)]
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), *rest])
    from rltrace.integrations._load import CACHE_ENV, entry_points_cache

    env[CACHE_ENV] = entry_points_cache()
    return env


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise RltraceError("rltrace run needs a command to run, e.g. rltrace run -- python train.py")
    disabled = resolve("disabled")
    chosen = args.run_dir or resolve("run_dir")  # the flag, else RLTRACE_RUN_DIR as a job script sets it
    run_dir = (chosen if objstore.is_uri(chosen) else Path(chosen)) if chosen else _new_run_dir()
    env = dict(os.environ) if disabled else environment(run_dir)
    if not disabled:
        print(f"rltrace: recording into {run_dir}", file=sys.stderr)
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise RltraceError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise RltraceError(f"command is not executable: {command[0]}") from None
    # Ctrl-C reaches the command through the terminal; SIGTERM is passed on.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not disabled:
        if objstore.is_uri(run_dir) or (run_dir / "run.json").exists():
            print(f"rltrace: trace in {run_dir}: rltrace info {run_dir} · rltrace report {run_dir}", file=sys.stderr)
        else:
            print("rltrace: nothing was recorded (no instrumented library ran)", file=sys.stderr)
    return 128 - code if code < 0 else code
