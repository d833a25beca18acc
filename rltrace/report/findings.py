"""Plain sentences from a report dict: the bottleneck, the top waits, stragglers, hangs, what
async could gain. Each sentence states a measured number and where it comes from."""

from __future__ import annotations

from collections import defaultdict

TAIL_SHARE = 0.25  # a long tail worth a sentence: this share of the step, median over steps
SYNC_SHARE = 0.25  # weight sync worth a sentence: this share of t_sync
WAIT_SHARE = 0.10  # a wait worth a sentence: this share of the run's step time


def _who(role, rank) -> str:
    return "?" if role is None else f"{role}{'' if rank is None else int(rank)}"


def _gb(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def sentences(r: dict) -> list[str]:
    out: list[str] = []
    for part in (_bottleneck, _waits, _stragglers, _weight_sync, _async, _hangs, _drops, _staleness, _mismatch):
        out.extend(part(r))
    return out


def _bottleneck(r: dict) -> list[str]:
    b = r.get("bottleneck")
    if not b:
        return ["No step has rollout, reward, train or weight_sync spans: nothing to model."]
    where = f" on {_who(b['role'], b['rank'])}" if b.get("role") else ""
    share = f" ({b['share']:.0%} of a step)" if b.get("share") is not None else ""
    text = (
        f"Bottleneck: {b['stage']}{where}, median {b['median_s']:.3g} s per step{share}; "
        f"t_R = {r['t_R']:.3g} s (rollout {r['t_rollout']:.3g} + reward {r['t_reward']:.3g}), "
        f"t_T = {r['t_T']:.3g} s, t_W = {r['t_W']:.3g} s."
    )
    if b.get("phase") and b["phase"] != b["stage"]:
        text += f" Its largest phase is {b['phase']}."
    out = [text]
    for p in b.get("profiles") or []:
        out.append(f"Profile of a slow {b['phase']} span (step {p['step']}): {p['kind']} {p['profile_id']} at {p['path']}.")
    return out


def _waits(r: dict) -> list[str]:
    total_wall = sum(s["wall_s"] or 0 for s in r["steps"])
    if not total_wall or not r["waits"]:
        return []
    seconds: dict[tuple, float] = defaultdict(float)
    names: dict[tuple, str] = {}
    for w in r["waits"]:
        key = (_who(w["role"], w["rank"]), w["waited_for"])
        seconds[key] += w["seconds"]
        names[key] = w["waited_for_process"]
    out = []
    for (who, what), s in sorted(seconds.items(), key=lambda kv: -kv[1])[:3]:
        if s / total_wall < WAIT_SHARE:
            break
        if what == "untraced":
            out.append(f"{who} waited {s:.3g} s ({s / total_wall:.0%} of step time) while no recorded phase ran.")
        else:
            out.append(f"{who} waited {s:.3g} s ({s / total_wall:.0%} of step time) for {what}.")
    return out


def _stragglers(r: dict) -> list[str]:
    out = []
    shares = sorted(t["tail_share"] for t in r["long_tail"] if t.get("tail_share") is not None)
    if shares and shares[len(shares) // 2] >= TAIL_SHARE:
        out.append(f"The rollout long tail (last sample minus median finish) costs a median {shares[len(shares) // 2]:.0%} of each step.")
    s = r["stragglers"]
    if s:
        worst = max(s, key=lambda x: x["after_median_s"])
        ratio = worst.get("len_ratio") or worst.get("time_ratio")
        ratio_text = f", {ratio:.1f}x the median length" if worst.get("len_ratio") else ""
        out.append(
            f"{len(s)} straggler sample(s) in {len({x['step'] for x in s})} step(s); worst: sample "
            f"{worst['sample_id']} at step {worst['step']}{ratio_text}, finished {worst['after_median_s']:.3g} s "
            "after the median sample."
        )
    return out


def _weight_sync(r: dict) -> list[str]:
    fit, out = r["weight_sync_fit"], []
    if fit.get("B_W"):
        quality = f" (R² {fit['r2']:.2f})" if fit.get("r2") is not None else ""
        out.append(f"Weight sync fit over {fit['n']} syncs: B_W = {_gb(fit['B_W'])}, t_0 = {fit['t_0']:.3g} s{quality}.")
    elif fit.get("effective_B_W"):
        out.append(
            f"Weight sync moved {_gb(fit['effective_B_W'])} on average over {fit['n']} syncs "
            f"({fit['sizes']} payload size(s): B_W and t_0 need several sizes to separate)."
        )
    if r["t_sync"] and r["t_W"] / r["t_sync"] >= SYNC_SHARE:
        out.append(f"Weight sync takes {r['t_W'] / r['t_sync']:.0%} of the synchronous step (t_W = {r['t_W']:.3g} s).")
    return out


def _async(r: dict) -> list[str]:
    a = r["async"]
    if not r["t_sync"] or not r["async_speedup_bound"]:
        return []
    if a.get("overlapping") and a.get("period_s"):
        return [
            f"Steps overlap (async): measured step period {a['period_s']:.3g} s against t_sync = {r['t_sync']:.3g} s, "
            f"a {a['achieved_speedup']:.2f}x speed-up; the seed's bound max(t_R, t_T) + t_W = "
            f"{r['async_bound']:.3g} s allows {r['async_speedup_bound']:.2f}x."
        ]
    return [
        f"Async could at best bring a step from t_sync = {r['t_sync']:.3g} s to max(t_R, t_T) + t_W = "
        f"{r['async_bound']:.3g} s ({r['async_speedup_bound']:.2f}x, an optimistic bound)."
    ]


def _hangs(r: dict) -> list[str]:
    out = []
    for o in r["open_spans"]:
        step = "" if o.get("step") is None else f" at step {o['step']}"
        out.append(
            f"Open span: {o['phase']} on {_who(o['role'], o['rank'])}{step} started and never ended "
            f"({o['stalled_s']:.3g} s before the run's last write; {o['age_s']:.0f} s ago): hung or killed."
        )
    return out


def _drops(r: dict) -> list[str]:
    d = r["dropped"]
    if not (d["spans"] or d["rows"]):
        return []
    return [f"Dropped before the store: {d['spans']} spans and {d['rows']} metric/sample rows; figures may be low."]


def _staleness(r: dict) -> list[str]:
    s = r["staleness"]
    if s["max"] is None or not s["max"]:
        return []
    return [f"Staleness: mean {s['mean']:.2f}, max {s['max']:.0f} weight versions."]


def _mismatch(r: dict) -> list[str]:
    out = []
    for t in r["mismatch"]["trends"]:
        if t["steps"] > 1:
            out.append(
                f"{t['metric']} went from {t['first']:.3g} to {t['last']:.3g} over {t['steps']} steps "
                f"(slope {t['slope_per_step']:+.3g} per step, max {t['max']:.3g})."
            )
    return out
