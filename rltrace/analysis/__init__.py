"""Analyses of a run: plain functions over the connection from `rltrace.store.open(run_dir)`
that return pandas DataFrames or plain dicts (columns and units in each docstring; the
definitions in docs/analysis.md). No plotting, no paths: `rltrace report` and the dashboard draw.

    con = rltrace.store.open("runs/exp1")
    analysis.cost_summary(con)             # t_R, t_T, t_W, t_sync, async bound, ...
    analysis.top_waits(con, steps=(10, 20))
"""

from rltrace.analysis._steps import StepRangeError, parse_steps
from rltrace.analysis.costs import (
    cost_model,
    cost_summary,
    fit_bandwidth,
    nested_stages,
    trainer_steps,
    weight_sync_fit,
    weight_sync_points,
)
from rltrace.analysis.cache_geometry import geometry as cache_geometry
from rltrace.analysis.critical_path import common_paths, critical_path
from rltrace.analysis.delta_sync import delta_sync
from rltrace.analysis.engine_requests import engine_requests
from rltrace.analysis.health import crashes, drops, open_spans, processes, restarts, startups, unstepped
from rltrace.analysis.long_tail import long_tail, stragglers
from rltrace.analysis.long_tail import samples as generation_samples
from rltrace.analysis.metrics import step_metrics
from rltrace.analysis.mismatch import batch_mismatch, mismatch, trends
from rltrace.analysis.mismatch import missing as mismatch_missing
from rltrace.analysis.profiles import attached, for_phase, has_profiles
from rltrace.analysis.rollout import engine, engine_summary, rollout, train_means
from rltrace.analysis.resources import idle_devices, phase_resources
from rltrace.analysis.resources import notes as resource_notes
from rltrace.analysis.resources import samples as resource_samples
from rltrace.analysis.serving import configure as configure_serving
from rltrace.analysis.serving import section as serving_section
from rltrace.analysis.staleness import histogram as staleness_histogram
from rltrace.analysis.staleness import staleness
from rltrace.analysis.steps import phase_breakdown, phase_rows, phase_totals, stage_children, step_breakdown
from rltrace.analysis.summary import table as summary_table
from rltrace.analysis.sync import sync_children, sync_growth
from rltrace.analysis.timeline import sample_timeline, step_timeline
from rltrace.analysis.waits import by_step as waits_by_step, top_waits, waits
from rltrace.analysis.waits import totals as waits_total
from rltrace.analysis.waits import imbalance
from rltrace.analysis.whatif import Scenario as WhatIf
from rltrace.analysis.whatif import whatif as what_if

__all__ = [
    "StepRangeError",
    "parse_steps",
    "step_breakdown",
    "phase_breakdown",
    "phase_totals",
    "phase_rows",
    "stage_children",
    "cost_model",
    "cost_summary",
    "nested_stages",
    "trainer_steps",
    "weight_sync_points",
    "weight_sync_fit",
    "fit_bandwidth",
    "waits",
    "top_waits",
    "waits_by_step",
    "waits_total",
    "critical_path",
    "common_paths",
    "long_tail",
    "stragglers",
    "generation_samples",
    "staleness",
    "staleness_histogram",
    "step_metrics",
    "mismatch",
    "batch_mismatch",
    "mismatch_missing",
    "trends",
    "rollout",
    "engine",
    "engine_summary",
    "train_means",
    "open_spans",
    "crashes",
    "drops",
    "processes",
    "unstepped",
    "restarts",
    "startups",
    "imbalance",
    "step_timeline",
    "sample_timeline",
    "has_profiles",
    "attached",
    "for_phase",
    "summary_table",
    "phase_resources",
    "idle_devices",
    "resource_notes",
    "resource_samples",
    "sync_children",
    "sync_growth",
    "engine_requests",
    "cache_geometry",
    "configure_serving",
    "serving_section",
    "delta_sync",
    "WhatIf",
    "what_if",
]
