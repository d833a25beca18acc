"""What each headline figure of a report rests on, decided once: every view reads this record.

Each figure gets a kind (docs/analysis.md, "What each figure rests on"):

- **measured**: from spans a traced process recorded;
- **imported**: from a log another program wrote: a metric log (`rltrace import metrics`, the
  field it came from is named) or imported trace timestamps (slime's own traces);
- **derived**: computed from other figures by a stated formula (t_sync = t_R + t_T + t_W);
- **assumed**: a default stands in for a value nobody recorded;
- **not recorded**: the run holds no evidence for it. Its value is None, never 0.

Overlap of stages is measured only on traced spans: imported metric logs give how long each
stage took, not when it ran (their spans are laid one after another), so the overlap of such a
run is not recorded; imported traces give their own timestamps, so theirs is imported.
"""

from __future__ import annotations

from rltrace._phases import COST_COLUMN, STAGES, phases_of
from rltrace.importers.metrics import METRIC_ATTR, SOURCE, SOURCE_ATTR
from rltrace.store.imports import SERVICE_NAME as IMPORTER

MEASURED, DERIVED, IMPORTED, ASSUMED, NOT_RECORDED = "measured", "derived", "imported", "assumed", "not recorded"
KINDS = (MEASURED, DERIVED, IMPORTED, ASSUMED, NOT_RECORDED)

#: The report keys each cost-model term is read from, with the stages whose spans hold it.
STAGES_OF = {"t_R": ("rollout", "reward"), "t_rollout": ("rollout",), "t_reward": ("reward",), "t_T": ("train",),
             "t_W": ("weight_sync",)}
#: Figures computed from others, with their formula.
FORMULAS = {
    "t_sync": "t_R + t_T + t_W",
    "async_bound": "max(t_R, t_T) + t_W",
    "async_speedup_bound": "t_sync / async_bound",
}
#: Every figure this record covers, in the order the views list them.
FIGURES = ("t_R", "t_rollout", "t_reward", "t_T", "t_W", "wall_s", "t_sync", "async_bound", "async_speedup_bound",
           "achieved_speedup", "B_W", "t_0")


def sources(con) -> dict:
    """Where the run's spans came from, per stage: {stage: {"imported": n, "metrics": [field, ...],
    "traced": bool, "from_metrics": bool}} plus "step" (the imported step spans' field).

    Imported spans are those of an importing process (`rltrace import metrics`, a slime import:
    their process record names the importer's service); a traced run reads no span here. A
    stage with imported spans is then checked for one traced span."""
    importers = [p for (p,) in con.execute(
        "SELECT DISTINCT process_id FROM processes WHERE service_name = ?", [IMPORTER]).fetchall()]
    rows = [] if not importers else con.execute(
        f"""SELECT coalesce(phase, name) AS phase, count(*) AS n,
                   list(DISTINCT attr(attributes, '{METRIC_ATTR}')) FILTER (attr(attributes, '{METRIC_ATTR}') IS NOT NULL),
                   bool_or(attr(attributes, '{SOURCE_ATTR}') = '{SOURCE}')
            FROM spans WHERE NOT is_open AND list_contains(?, process_id) GROUP BY 1""", [importers]).fetchall()
    by_phase = {phase: (n, sorted(fields or []), bool(metrics)) for phase, n, fields, metrics in rows}
    out: dict = {}
    for stage in (*COST_COLUMN, "step"):
        phases = phases_of(stage) or (stage,)
        mine = [by_phase[p] for p in phases if p in by_phase]
        imported = sum(m[0] for m in mine)
        traced = True
        if imported:
            traced = bool(con.execute(
                "SELECT 1 FROM spans WHERE NOT is_open AND NOT list_contains(?, process_id) "
                "AND list_contains(?, coalesce(phase, name)) LIMIT 1", [importers, list(phases)]).fetchall())
        out[stage] = {"imported": imported, "metrics": sorted({f for m in mine for f in m[1]}),
                      "from_metrics": any(m[2] for m in mine), "traced": traced}
    return out


def _record(value, kind: str, basis: str) -> dict:
    return {"value": value, "kind": kind, "basis": basis}


def _stages_record(value, stages: tuple[str, ...], src: dict, present: set[str]) -> dict:
    """A figure read from the spans of `stages` (`present`: the stages with spans): measured,
    imported (with the fields) or not recorded."""
    if value is None:
        names = " or ".join(stages)
        return _record(None, NOT_RECORDED, f"no {names} span")
    fields = [f for s in stages for f in src[s]["metrics"]]
    imported = [s for s in stages if src[s]["imported"]]
    traced = [s for s in stages if s in present and (src[s]["imported"] == 0 or src[s]["traced"])]
    if imported and not traced:
        how = ", ".join(dict.fromkeys(fields)) if fields else "imported trace timestamps"
        return _record(value, IMPORTED, how)
    if imported:
        return _record(value, MEASURED, "spans, some imported (" + (", ".join(dict.fromkeys(fields)) or "traces") + ")")
    return _record(value, MEASURED, "spans")


def figures(r: dict, src: dict) -> dict:
    """{figure: {value, kind, basis}} for FIGURES, from the report dict `r` (its cost model, async
    overlap and weight-sync fit) and `sources(con)`."""
    present = {stage for stage, key in COST_COLUMN.items() if r.get(key) is not None}
    out = {key: _stages_record(r.get(key), stages, src, present) for key, stages in STAGES_OF.items()}
    steps = src["step"]
    if r.get("wall_s") is None:
        out["wall_s"] = _record(None, NOT_RECORDED, "no finished step")
    elif steps["imported"] and not steps["traced"] and steps["metrics"]:
        out["wall_s"] = _record(r["wall_s"], IMPORTED, ", ".join(steps["metrics"]))
    elif any(src[s]["imported"] and not src[s]["traced"] for s in COST_COLUMN):
        out["wall_s"] = _record(r["wall_s"], IMPORTED, "first start to last end of the imported spans")
    else:
        out["wall_s"] = _record(r["wall_s"], MEASURED, "first start to last end of the step's spans")
    for key, formula in FORMULAS.items():
        value = r.get(key)
        recorded = [t for t in ("t_R", "t_T", "t_W") if out[t]["kind"] != NOT_RECORDED]
        out[key] = (_record(value, DERIVED, formula + ("" if len(recorded) == 3 else
                                                       f" ({', '.join(t for t in ('t_R', 't_T', 't_W') if t not in recorded)} not recorded, left out)"))
                    if value is not None and recorded else _record(None, NOT_RECORDED, "no stage recorded"))
    out["achieved_speedup"] = _overlap(r, src)
    fit = r.get("weight_sync_fit") or {}
    for key in ("B_W", "t_0"):
        if fit.get(key) is None:
            why = ("no weight_sync span with a payload size" if not fit.get("n") else
                   "one payload size: B_W and t_0 need several to separate" if (fit.get("sizes") or 0) < 2 else
                   "sync time does not grow with payload: bandwidth is not measurable" if key == "B_W" else
                   "the fit does not separate a fixed cost from the payload's")
            out[key] = _record(None, NOT_RECORDED, why)
        elif fit.get("regime") == "latency":
            out[key] = _record(fit[key], DERIVED, "median time of the syncs kept: it does not grow with payload")
        else:
            out[key] = _record(fit[key], DERIVED, "robust fit of weight_sync spans: seconds ≈ bytes / B_W + t_0")
    return out


def _overlap(r: dict, src: dict) -> dict:
    """Measured overlap only from traced spans (see the module doc)."""
    a = r.get("async") or {}
    value = a.get("achieved_speedup")
    if value is None:
        return _record(None, NOT_RECORDED, "no stage time")
    stages = [s for s in STAGES if src[s]["imported"]]
    if any(src[s]["from_metrics"] for s in stages):
        return _record(None, NOT_RECORDED, "imported metric logs give how long stages took, not when they ran")
    if stages:
        return _record(value, IMPORTED, "stages running at once in the imported traces' timestamps")
    return _record(value, MEASURED, "stages running at once in the spans")


def text(record: dict) -> str:
    """A figure's kind in words: `measured`, `imported (perf/rollout_time)`, `derived: t_R + t_T + t_W`,
    `not recorded (no reward span)` (what the text report and every page print)."""
    kind, basis = record["kind"], record.get("basis")
    if kind == DERIVED:
        return f"derived: {basis}"
    if kind == MEASURED and basis == "spans" or not basis:
        return kind
    return f"{kind} ({basis})"
