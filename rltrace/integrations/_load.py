"""Find the registered instrumentors and apply them: what `rltrace run` does in every process.

Sources, in order: the package entry point group `rltrace.instrumentors` (each names a
`BaseInstrumentor` subclass, an object with `instrument()`, or a plain callable), then
`RLTRACE_INSTRUMENTORS` ("module:attr,module:attr"). One that cannot be loaded or fails is one
warning naming it; the others still load and the command still runs.

`rltrace run` scans the entry points once and hands the list to the command's processes
(`RLTRACE_ENTRY_POINTS`, tagged with the Python environment it holds for), so a process of the
same environment starts without scanning every installed distribution.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from importlib import import_module

GROUP = "rltrace.instrumentors"
ENV = "RLTRACE_INSTRUMENTORS"
CACHE_ENV = "RLTRACE_ENTRY_POINTS"

_started = False


def _disabled() -> bool:
    from rltrace._config import resolve

    try:
        return bool(resolve("disabled"))
    except ValueError:
        return False  # a malformed value is reported by rltrace.init itself, once


def _path_key() -> list[str]:
    """sys.path without the script's folder and rltrace's start-up folder: where distributions are found."""
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
    return [p for p in sys.path[1:] if os.path.abspath(p or os.curdir) != boot]


def entry_points() -> list[tuple[str, str]]:
    """(name, "module:attr") of the `rltrace.instrumentors` entry points of this environment."""
    try:
        cached = json.loads(os.environ.get(CACHE_ENV) or "null")
        if cached and cached["prefix"] == sys.prefix and cached["path"] == _path_key():
            return [tuple(ep) for ep in cached["entry_points"]]
    except (ValueError, KeyError, TypeError):
        pass
    from importlib import metadata

    return [(ep.name, ep.value) for ep in metadata.entry_points(group=GROUP)]


def entry_points_cache() -> str:
    """The value of RLTRACE_ENTRY_POINTS that lets processes of this environment skip the scan."""
    return json.dumps({"prefix": sys.prefix, "path": _path_key(), "entry_points": entry_points()})


def registered() -> list[tuple[str, str]]:
    """(name, "module:attr") of every instrumentor: entry points first, then RLTRACE_INSTRUMENTORS."""
    out, seen = [], set()
    for name, value in entry_points():
        if value not in seen:
            seen.add(value)
            out.append((name, value))
    for value in os.environ.get(ENV, "").split(","):
        value = value.strip()
        if value and value not in seen:
            seen.add(value)
            out.append((value, value))
    return out


def _load_object(value: str):
    module_name, _, attr = value.partition(":")
    obj = import_module(module_name.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj


def _apply(obj) -> None:
    if isinstance(obj, type):
        obj = obj()
    if hasattr(obj, "instrument"):
        obj.instrument()
    elif callable(obj):
        obj()
    else:
        raise TypeError(f"{obj!r} is neither callable nor has an instrument() method")


def load_instrumentors() -> list[str]:
    """Load and apply every registered instrumentor; return the names that loaded."""
    loaded = []
    for name, value in registered():
        try:
            _apply(_load_object(value))
        except Exception as exc:
            warnings.warn(
                f"rltrace: instrumentor {name!r} ({value}) failed: {type(exc).__name__}: {exc}; "
                "the program runs without it",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            loaded.append(name)
    return loaded


def start() -> None:
    """Process start-up under `rltrace run`: record crashes, then load the instrumentors (once).

    The run itself starts lazily, from RLTRACE_RUN_DIR, the first time something is recorded,
    so processes of the command that never touch an instrumented library write nothing.
    """
    global _started
    if _started or _disabled():
        return
    _started = True
    from rltrace import _crash

    _crash.install()
    load_instrumentors()
