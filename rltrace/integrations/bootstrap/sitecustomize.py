"""Loaded by every Python process that `rltrace run` starts (its folder leads PYTHONPATH).

It first runs the `sitecustomize` this one shadows, if any, then `rltrace.integrations._load.start`.
It never stops the program: any fault is one line on stderr.
"""

import os
import sys


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"Error in sitecustomize ({spec.origin}): {type(exc).__name__}: {exc}\n")


def _start() -> None:
    if os.environ.get("RLTRACE_DISABLED", "").strip().lower() in ("1", "true", "yes", "on"):
        return
    try:
        from rltrace.integrations._load import start
    except ImportError as exc:
        sys.stderr.write(
            f"rltrace: not tracing {sys.executable}: rltrace cannot be imported there ({exc}); "
            "run the command with the Python environment that has rltrace installed\n"
        )
        return
    try:
        start()
    except Exception as exc:
        sys.stderr.write(f"rltrace: start-up failed ({type(exc).__name__}: {exc}); the program runs untraced\n")


_chain()
_start()
