"""torch for reading files someone else wrote: only a version whose restricted loader holds.

`torch.load(..., weights_only=True)` is the promise that loading a dump runs no code from it; on
torch 2.5.1 and older a crafted file gets past it (CVE-2025-32434, fixed in 2.6). torch stays an
optional dependency, so the version is checked where a file is about to be loaded, not at install.
"""

from __future__ import annotations

import re

from rltrace.replay.errors import ReplayError

MIN_SAFE = (2, 6)


def version_tuple(version: str) -> tuple[int, int]:
    """(2, 13) from "2.13.0+cpu"; (0, 0) when unreadable (treated as too old)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def safe_torch():
    """The torch module, if its `weights_only=True` loader can be trusted with untrusted files."""
    import torch

    if version_tuple(torch.__version__) < MIN_SAFE:
        raise ReplayError(
            f"torch {torch.__version__} cannot load files safely (its weights_only loader can run code from a crafted "
            f"file, CVE-2025-32434): install torch>={'.'.join(map(str, MIN_SAFE))} to read dumps"
        )
    return torch
