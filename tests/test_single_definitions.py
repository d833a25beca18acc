"""Each fact is stated once: the phase taxonomy is rltrace._phases, whatever reads it."""

from __future__ import annotations

import importlib
import re

from rltrace import _names, _phases
from rltrace.ui import charts, style

from .conftest import REPO


def test_the_stage_map_is_the_taxonomy_everywhere():
    waits = importlib.import_module("rltrace.analysis.waits")  # the module, not the function of that name
    assert waits.STAGE_OF is _phases.STAGE_OF
    assert charts.STAGES == [(_phases.COST_COLUMN[s], s) for s in _phases.STAGES]
    assert list(style.STAGE_COLORS) == list(_phases.STAGES)
    assert set(_phases.STAGE_OF) <= set(_names.PHASES)  # every staged phase is a standard phase name


def test_no_second_stage_map_or_phase_list_in_the_source():
    """A dict literal mapping `generate` to rollout, or a tuple of the four stages, outside the taxonomy."""
    pattern = re.compile(r'"generate"\s*:\s*"(rollout|R)"|\("rollout",\s*"reward",\s*"train",\s*"weight_sync"\)')
    offenders = [str(p.relative_to(REPO)) for folder in ("rltrace", "replay", "profiling", "ui")
                 for p in (REPO / folder).rglob("*.py")
                 if not p.is_symlink() and "rltrace/replay" not in str(p) and "rltrace/ui" not in str(p)
                 and "rltrace/profiling" not in str(p) and p.name != "_phases.py" and pattern.search(p.read_text())]
    assert offenders == []
