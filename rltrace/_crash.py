"""Crash records: an exception that reaches the top of a thread or of the process is stored.

`install()` chains rltrace's hooks in front of `sys.excepthook` and `threading.excepthook`
(the previous hooks still run, so tracebacks print as before). Each uncaught exception becomes a
row of the `crashes` table: type, message, the innermost frames, and the phases it escaped
through (innermost first; `phase` blocks note themselves on the exception as it passes). Phases
opened with `start_phase` and still open in the dying thread (or process) are ended with that
error. `init` installs the hooks; so does every process that `rltrace run` starts.

This module writes the record; what is running and which phases to end is the API's to know: it
hands its `crashed` function to `set_recorder` when it loads (this module never imports the API).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback

logger = logging.getLogger("rltrace")

TRACEBACK_FRAMES = 12  # innermost frames kept: where it failed, not the whole framework stack
MAX_TEXT = 4000  # characters kept of a message or traceback

_installed = False
_previous_sys = None
_previous_threading = None
_recorder = None  # the API's `crashed(exc, thread=..., kind=...) -> bool`, set when it loads


def set_recorder(recorder) -> None:
    """What the hooks call with an uncaught exception (the API: it knows the run and its phases)."""
    global _recorder
    _recorder = recorder


def install() -> None:
    """Put the crash hooks in place (once per process); the previous hooks keep running after them."""
    global _installed, _previous_sys, _previous_threading
    if _installed:
        return
    _installed = True
    _previous_sys, sys.excepthook = sys.excepthook, _sys_hook
    _previous_threading, threading.excepthook = threading.excepthook, _threading_hook


def _sys_hook(exc_type, exc, tb) -> None:
    if not issubclass(exc_type, SystemExit):
        _safely(exc, threading.main_thread(), "process")
    (_previous_sys or sys.__excepthook__)(exc_type, exc, tb)


def _threading_hook(args) -> None:
    if args.exc_type is not None and not issubclass(args.exc_type, SystemExit) and args.exc_value is not None:
        _safely(args.exc_value, args.thread, "thread")
    (_previous_threading or threading.__excepthook__)(args)


def _safely(exc: BaseException, thread, kind: str) -> None:
    if _recorder is None:  # rltrace's API never loaded: no run to record into
        return
    try:
        _recorder(exc, thread=thread, kind=kind)
    except Exception:
        logger.exception("rltrace: could not record the crash; the traceback below is the program's own")


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def record(run, exc: BaseException, phases: list, *, thread: threading.Thread, kind: str = "process") -> None:
    """Store `exc` in `run` as a crash of this process (`kind` "process") or of `thread` ("thread").

    `phases`: the (phase, step, span id) it escaped through, innermost first.
    """
    from rltrace import _names

    phase, step, span_id = phases[0] if phases else (None, None, None)
    row = {
        **{k: v[0] for k, v in ((k, a.to_pylist()) for k, a in run.process.columns(1).items())},
        "time_ns": time.time_ns(),
        "kind": kind,
        "thread_name": thread.name,
        "thread_id": thread.ident,
        "exc_type": _type_name(exc),
        "message": _clip(str(exc)),
        "traceback": _clip("".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES))),
        "phase": phase,
        "step": step,
        "span_id": span_id,
        "phases": json.dumps([name for name, _, _ in phases]),
    }
    import pyarrow as pa

    table = pa.Table.from_pylist([row], schema=_names.CRASHES_SCHEMA)
    run.submit_rows(_names.CRASHES, 1, table)
    if kind == "process":
        run.flush()  # the interpreter is about to exit; atexit shutdown follows
