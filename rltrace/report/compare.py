"""Two runs side by side: phase times, the cost model, reward and mismatch."""

from __future__ import annotations

from rltrace._names import WEIGHT_SYNC_CHILDREN


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def compare(this: dict, other: dict) -> list[dict]:
    """Rows of {what, unit, this, other, ratio (this / other)} from two `build()` dicts."""
    rows = []

    def add(what: str, unit: str, a, b) -> None:
        rows.append({"what": what, "unit": unit, "this": a, "other": b, "ratio": _ratio(a, b)})

    for key in ("t_R", "t_T", "t_W", "t_sync", "async_bound"):
        add(key, "s/step (median)", this[key], other[key])
    add("step period", "s (median)", this["async"]["period_s"], other["async"]["period_s"])
    add("measured overlap", "x", this["async"]["achieved_speedup"], other["async"]["achieved_speedup"])
    phases_a = {p["phase"]: p["per_step_s"] for p in this["phases"]}
    phases_b = {p["phase"]: p["per_step_s"] for p in other["phases"]}
    for phase in sorted(set(phases_a) | set(phases_b), key=lambda p: -max(phases_a.get(p) or 0, phases_b.get(p) or 0)):
        add(f"phase {phase}", "s/step (mean)", phases_a.get(phase), phases_b.get(phase))
    children_a = {c["child"]: c["median_s"] for c in (this.get("weight_sync_children") or {}).get("children", [])}
    children_b = {c["child"]: c["median_s"] for c in (other.get("weight_sync_children") or {}).get("children", [])}
    for child in [c for c in WEIGHT_SYNC_CHILDREN if c in children_a or c in children_b]:
        add(f"weight_sync {child}", "s/sync (median)", children_a.get(child), children_b.get(child))
    add("reward_mean", "mean over steps", this["reward"]["mean"], other["reward"]["mean"])
    add("reward_mean", "last step", this["reward"]["last"], other["reward"]["last"])
    trends_a = {t["metric"]: t for t in this["mismatch"]["trends"]}
    trends_b = {t["metric"]: t for t in other["mismatch"]["trends"]}
    for metric in sorted(set(trends_a) | set(trends_b)):
        add(metric, "mean over steps", (trends_a.get(metric) or {}).get("mean"), (trends_b.get(metric) or {}).get("mean"))
    add("staleness", "mean", this["staleness"]["mean"], other["staleness"]["mean"])
    said = {"reward_mean", *trends_a, *trends_b}
    scalars_a = {m["name"]: m for m in this.get("scalars") or []}
    scalars_b = {m["name"]: m for m in other.get("scalars") or []}
    for name in sorted((set(scalars_a) | set(scalars_b)) - said):  # every other logged scalar: your `loss` too
        add(name, "mean over steps", (scalars_a.get(name) or {}).get("mean"), (scalars_b.get(name) or {}).get("mean"))
    return rows
