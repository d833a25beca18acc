"""Errors of debug replay. Each is an `RltraceError`: the CLI prints it as one line, exit status 2."""

from __future__ import annotations

from rltrace._config import RltraceError
from rltrace.store import CorruptPartError


class ReplayError(RltraceError):
    """A frozen batch, a replay or an entry point cannot be used; the message names the file and field."""


class DamagedBatchError(ReplayError, CorruptPartError):
    """A frozen batch's file is damaged (its footer reads, its data does not)."""


class TokenizerMismatchError(ReplayError):
    """The tokenizer given is not the one the batch was frozen with (its vocabulary hash differs)."""


class SlimeDumpError(ReplayError):
    """A slime debug dump cannot be converted; the message names the file, the sample and the field."""
