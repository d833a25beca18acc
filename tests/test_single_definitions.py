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


def test_pages_read_figures_from_the_report_only():
    """A dashboard page formats the report's figures; it never calls an analysis itself, and the
    data layer hands out the report, records and one-step drill-downs, not analyses."""
    import ast

    for page in sorted((REPO / "ui").rglob("*.py")):
        tree = ast.parse(page.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rltrace.analysis"):
                names = {a.name for a in node.names}
                assert node.module in ("rltrace.analysis", "rltrace.analysis._steps") and (
                    names <= {"_format", "Steps"} or page.name == "data.py"), f"{page.name}: {ast.unparse(node)}"
    from rltrace.ui import data

    analyses = {name for name in dir(data.analysis) if not name.startswith("_")}
    used = {node.attr for node in ast.walk(ast.parse((REPO / "ui" / "data.py").read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "analysis"}
    records = {"critical_path", "batch_mismatch", "step_timeline", "sample_timeline", "processes", "resource_samples",
               "attached",  # one step's spans and path, per-sample rows, processes, utilisation samples, profiles
               "WhatIf"}  # the scenarios a user picks on the What-if page: no report can hold every knob setting
    assert used & analyses <= records
