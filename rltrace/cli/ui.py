"""`rltrace ui RUN_DIR [RUN_DIR ...] [--port P] [--host H] [--model PATH --kv-bandwidth B ...]`: the
dashboard, on localhost by default; the serving options are `rltrace report`'s (the Engine page uses them).

Starts Streamlit headless on `ui/app.py` with the run dirs in RLTRACE_UI_RUNS (a JSON list), the
serving options in RLTRACE_UI_SERVING (JSON),
behind a Host header check (`ui/serve.py`: only this machine's names and --host are answered).
Runs are only read: the dashboard opens in-memory DuckDB views over the Parquet parts and writes
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rltrace._config import RltraceError, paths_value
from rltrace.cli import _options
from rltrace.store import objstore, read_manifest

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
LOOPBACK_NAMES = ["localhost", "127.0.0.1", "[::1]"]  # Host headers a browser on this machine sends
EVERY_INTERFACE = {"0.0.0.0", "::", ""}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ui",
        help="the dashboard: timelines, waiting stages, reward vs mismatch, batches, profiles (Streamlit)",
        description="Serve the rltrace dashboard for one or more runs (read-only; docs/ui.md).",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs to show (the first is shown first)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    p.add_argument(
        "--host", default=DEFAULT_HOST,
        help="address to bind (default %(default)s: this machine only; the dashboard has no login)",
    )
    _options.skip_corrupt(p)
    _options.serving(p)
    p.set_defaults(func=main)


def app_path() -> Path:
    import rltrace.ui

    return Path(rltrace.ui.__file__).resolve().parent / "app.py"


def command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The Streamlit command line and environment for these arguments (after checking the runs)."""
    runs = []
    for run_dir in args.run_dirs:
        if objstore.is_uri(run_dir):  # read through a local copy, refreshed as the dashboard refreshes
            read_manifest(run_dir)
            runs.append(run_dir)
            continue
        read_manifest(Path(run_dir))  # a StoreError naming the dir if it is not a run
        runs.append(str(Path(run_dir).resolve()))
    serving = checked_serving(_options.serving_values(args))
    if not 0 < args.port < 65536:
        raise RltraceError(f"--port {args.port} is not a TCP port: use 1-65535 (default {DEFAULT_PORT})")
    argv = [
        sys.executable, "-m", "rltrace.ui.serve", "--hosts", ",".join(served_hosts(args.host)), "run", str(app_path()),
        "--server.address", args.host,
        "--server.port", str(args.port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
    ]
    env = dict(os.environ, RLTRACE_UI_RUNS=paths_value(runs), RLTRACE_UI_SKIP_CORRUPT="1" if args.skip_corrupt else "0",
               RLTRACE_UI_SERVING=json.dumps(serving), STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    return argv, env


def checked_serving(options: dict) -> dict:
    """The serving options with the model path made absolute, refused here (one line, before the
    dashboard starts) when `rltrace report` would refuse them."""
    import duckdb

    from rltrace.analysis import configure_serving

    if options.get("model") is not None and not objstore.is_uri(options["model"]):
        options = {**options, "model": str(Path(options["model"]).expanduser().resolve())}
    configure_serving(duckdb.connect(), **options)  # RltraceConfigError / DtypeError naming the bad value
    return options


def served_hosts(bind: str) -> list[str]:
    """Host names the dashboard answers (a DNS rebinding guard, see ui/serve.py): this machine's
    names, plus the --host address; `*` (any) when bound to every interface."""
    if bind in EVERY_INTERFACE:
        return ["*"]
    host = f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind
    return list(dict.fromkeys([*LOOPBACK_NAMES, host.lower()]))


def main(args: argparse.Namespace) -> int:
    argv, env = command(args)
    if args.host not in LOOPBACK:
        print(f"rltrace: warning: serving on {args.host}: anyone who can reach this port can read these runs", file=sys.stderr)
    print(f"rltrace: dashboard for {len(args.run_dirs)} run(s) at http://{args.host}:{args.port}  (Ctrl-C to stop)", file=sys.stderr)
    os.execvpe(argv[0], argv, env)  # Streamlit takes over this process (signals, exit status)
    return 0
