"""How the TRL integration speaks up: a warning once per kind of gap, and internal faults logged
once while training goes on. Below both `trl` (the entry point) and `_trl_hooks` (the wrappers),
so neither imports the other for it."""

from __future__ import annotations

import logging
import os
import warnings

logger = logging.getLogger("rltrace.integrations.trl")

_warned: set[str] = set()  # keys already warned or logged in this process


def warn_once(key: str, message: str) -> None:
    """A `RuntimeWarning` the user sees once per `key` (a hook point missing, a seam that cannot hold)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def fault(what: str) -> None:
    """An internal error: logged once per place, training goes on (raised under pytest, for our tests)."""
    if "PYTEST_CURRENT_TEST" in os.environ:
        raise
    if what not in _warned:
        _warned.add(what)
        logger.exception("rltrace: %s failed; training continues with less telemetry", what)
