"""User-facing text names what it computes, never documents users have not seen."""

from __future__ import annotations

import re

from .conftest import REPO

#: Internal planning documents and tracker numbers; users read the docs and the code, not these.
JARGON = re.compile(r"seed's|\bthe seed\b|\bthe brief\b|brief's|\bBRIEF\b|\(issue \d+\)|\bissue \d+\)")
FOLDERS = ("rltrace", "replay", "profiling", "ui", "docs", "examples", "benchmarks")


def test_no_internal_jargon_reaches_users():
    hits = []
    paths = [REPO / "README.md"] + [p for f in FOLDERS for p in (REPO / f).rglob("*")
                                    if p.suffix in {".py", ".md"} and "rltrace/replay" not in str(p)]
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if JARGON.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
