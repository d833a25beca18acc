"""Plain sentences from a report dict: crashes and hangs first, then the bottleneck, the top waits, stragglers,
the weight sync, what async could gain, staleness and mismatch. Each sentence states a measured
number and where it comes from; a metric that did not move materially gets no sentence."""

from __future__ import annotations

from collections import defaultdict

from rltrace.analysis._format import MISMATCH_SOURCES, mismatch_label
from rltrace.analysis._format import number_text as num
from rltrace.analysis._format import process_name as _who
from rltrace.analysis._format import rate_text
from rltrace.analysis._format import seconds_text as sec
from rltrace.analysis._format import size_text
from rltrace.analysis.health import STALE_AFTER_S, killed_timeline, open_text
from rltrace.analysis.waits import on_text
from rltrace.profiling.query import inside_text
from rltrace.report.serving_findings import sentences as _serving

TAIL_SHARE = 0.25  # a long tail worth a sentence: this share of the step, median over steps
STRAGGLER_FACTOR = 4.0  # a straggler worth a sentence: this many times the step's median length or time
SYNC_SHARE = 0.25  # weight sync worth a sentence: this share of t_sync
SYNC_GROWTH = 0.25  # weight sync that grew by this share of its fitted first value over the run
WAIT_SHARE = 0.10  # a wait worth a sentence: this share of the run's step time
ALIGNMENT_GATE = 1e-6  # train_rollout_logprob_abs_diff below this: rollout and training agree exactly
#: Per mismatch metric: its neutral value and the smallest change worth a sentence.
MISMATCH_SCALE = {
    "train_rollout_logprob_abs_diff": (0.0, ALIGNMENT_GATE),
    "mismatch_k3": (0.0, ALIGNMENT_GATE),
    "tis_mean": (1.0, 0.02),
    "tis_clipfrac": (0.0, 0.01),
}
MATERIAL_CHANGE = 0.25  # ... and at least this share of the metric's largest distance from neutral


def sentences(r: dict) -> list[str]:
    out: list[str] = []
    for part in (_skipped, _imported, _crashes, _blocking, _hangs, _unstepped, _ran_ahead, _bottleneck, _nested, _amortised, _outliers, _startups, _restarts, _waits, _imbalance, _stragglers, _weight_sync,
                 _async, _drops, _reward, _staleness, _mismatch, _idle_devices, _engine, _serving):
        out.extend(part(r))
    return out


def _skipped(r: dict) -> list[str]:
    """Damaged parts left out (--skip-corrupt): every figure misses their rows."""
    parts = r.get("skipped_parts") or []
    if not parts:
        return []
    return [f"{len(parts)} damaged part(s) left out (--skip-corrupt): every figure here misses their rows. "
            + "; ".join(parts)]


def _ran_ahead(r: dict) -> list[str]:
    """Steps the trainer never reached that other work ran into: told apart, not in the figures."""
    a = r.get("ran_ahead")
    if not a:
        return []
    steps = a["steps"]
    which = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
    who = ", ".join(a["processes"]) or "no finished span"
    spans = f"{a['spans']} span{'' if a['spans'] == 1 else 's'}"
    return [f"Work ran ahead into {which}, which the trainer never reached ({spans} on {who}): "
            f"left out of every figure here, which counts {len(r['steps'])} trainer steps."]


def _imported(r: dict) -> list[str]:
    """Spans made from imported metric logs hold real durations at made-up places within the step."""
    i = r.get("imported_spans") or {}
    if not i.get("metrics"):
        return []
    share = "All" if i["metrics"] == i["total"] else f"{i['metrics']} of {i['total']}"
    return [f"{share} spans come from imported metric logs (source: metrics): stage durations are the logged ones, "
            "their placement within a step is made up, so overlap, waits, idle gaps, stragglers and critical paths "
            "need traced spans."]


def _unstepped(r: dict) -> list[str]:
    u = r.get("unstepped") or {}
    return [unstepped_sentence(u)] if u.get("spans") else []


def unstepped_sentence(u: dict) -> str:
    """Spans no step holds (`health.unstepped`), with the fix; `info`, `report` and the Overview say it alike."""
    names = [phase for phase, _ in u["phases"]]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    n = u["spans"]
    return (f"{n:,} span{'' if n == 1 else 's'} ({shown}) {'has' if n == 1 else 'have'} no step, so every per-step "
            "figure leaves them out: wrap the step in `rltrace.phase(\"step\", step=…)` or pass `step=`.")


def _startups(r: dict) -> list[str]:
    """Processes that began late in the first step: their start-up, which no wait counts."""
    s = r.get("startups") or []
    if not s:
        return []
    names = [x["name"] for x in s]
    times = [sec(x["seconds"]) for x in s]
    who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    took = times[0] if len(times) == 1 else ", ".join(times[:-1]) + " and " + times[-1]
    return [f"Start-up: {who} began {took} into step {s[0]['step']} (spawning, imports, loading); that is "
            "start-up, not a wait for anything."]


def _restarts(r: dict) -> list[str]:
    """Steps recorded twice: their step times and stage sums hold both attempts."""
    out = []
    for x in (r.get("restarts") or [])[:3]:
        steps = (f"Step {x['first_step']} was" if x["first_step"] == x["last_step"]
                 else f"Steps {x['first_step']}–{x['last_step']} were")
        out.append(f"{steps} recorded twice: {x['name']} ({x['before']}) stopped and a later "
                   f"{x['name']} ({x['after']}) recorded them again (a resumed run, or a run written "
                   "into the same directory); their step times and stage sums hold both attempts.")
    return out


def _imbalance(r: dict) -> list[str]:
    """Sibling processes doing one phase at unequal speed (their idle time is not a wait on each other)."""
    return [f"Imbalance: {i['phase']} on {i['slow_name']} took {i['ratio']:.1f}x {i['fast_name']}'s (median "
            f"{sec(i['slow_s'])} vs {sec(i['fast_s'])} per step, {i['steps']} steps): {i['role']} processes doing "
            "the same work at unequal speed." for i in (r.get("imbalance") or [])[:3]]


def _term(r: dict, key: str) -> str:
    """A cost-model figure in text: `not recorded` when the run has no such span (absent is not zero)."""
    return "not recorded" if r.get(key) is None else sec(r[key])


def _bottleneck(r: dict) -> list[str]:
    b = r.get("bottleneck")
    if not r["steps"]:
        return [no_steps_sentence(r.get("step_range") or {})]
    if not b:
        return ["No step has rollout, reward, train or weight_sync spans: nothing to model."]
    where = f" on {_who(b['role'], b['rank'])}" if b.get("role") else ""
    every = ""
    if (b.get("serves_steps") or 1) > 1:
        every = (f" (ran once, spread over {b['serves_steps']} steps)" if b.get("runs") == 1 else
                 f" (runs every {b['serves_steps']} steps: {sec(b['per_run_s'])} per run)")
    share = f", {b['share']:.0%} of step time" if b.get("share") is not None else ""
    culprit = b.get("culprit")
    inside = f"; most of it in {culprit['phase']} ({culprit['share']:.0%})" if culprit else ""
    rollout = "" if r.get("t_R") is None else f" (rollout {_term(r, 't_rollout')} + reward {_term(r, 't_reward')})"
    text = (
        f"Bottleneck: {b['stage']}{where}, median {sec(b['median_s'])} per step{every}{share}{inside}; "
        f"t_R = {_term(r, 't_R')}{rollout}, t_T = {_term(r, 't_T')}, t_W = {_term(r, 't_W')}."
    )
    if b.get("phase") and b["phase"] != b["stage"] and not culprit:
        text += f" Its largest phase is {b['phase']}."
    out = [text]
    if b.get("within_noise"):
        (a0, a1), (b0, b1) = b["iqr_s"], b["runner_up_iqr_s"]
        out.append(
            f"{b['stage']} and {b['runner_up']} are within noise of each other: {sec(b['median_s'])} vs "
            f"{sec(b['runner_up_median_s'])} median per step, middle half of steps {sec(a0)}–{sec(a1)} vs "
            f"{sec(b0)}–{sec(b1)}; look at both."
        )
    for p in b.get("profiles") or []:
        out.append(f"Profile of a slow {b['phase']} span (step {p['step']}): {_profiles([p])}.")
    return out


def no_steps_sentence(rng: dict) -> str:
    """Why a report has no step: the run has none yet, or the selected range misses them."""
    if not rng.get("run_steps"):
        return "The run has no finished span with a step yet: nothing to report (rltrace info lists what it holds)."
    have = f"the run has steps {rng['run_first']}–{rng['run_last']} ({rng['run_steps']})"
    a, b = rng.get("selected") or (None, None)
    asked = (f"steps {a}–{b}" if a is not None and b is not None and a != b else f"step {a}" if a == b and a is not None
             else f"steps from {a}" if a is not None else f"steps up to {b}" if b is not None else "the steps asked for")
    return f"No finished step in {asked}: {have}; pick steps within it with --steps."


def _nested(r: dict) -> list[str]:
    """Once: stages that ran inside another stage on its thread, and what the outer one keeps."""
    out, by_outer = [], defaultdict(list)
    for n in r.get("nested") or []:
        by_outer[n["outer"]].append(n["inner"])
    own = {"rollout": r.get("t_rollout"), "reward": r.get("t_reward"), "train": r.get("t_T"), "weight_sync": r.get("t_W")}
    for outer, inner in by_outer.items():
        names = " and ".join(sorted(set(inner)))
        verb = "runs" if len(set(inner)) == 1 else "run"
        out.append(
            f"{names} {verb} inside {outer} on the same thread; each instant counts once, for the innermost stage, "
            f"so {outer} counts its own {_term({'x': own.get(outer)}, 'x')} per step."
        )
    return out


def _amortised(r: dict) -> list[str]:
    names = {"t_R": "rollout and reward", "t_T": "train", "t_W": "weight sync", "t_reward": "reward"}
    out = []
    for col, k in (r.get("amortised") or {}).items():
        if col == "t_reward" and "t_R" in r["amortised"]:
            continue
        ran = [s["step"] for s in r["steps"] if s.get(col) is not None]
        if len(ran) == 1:  # one run: how many steps it serves is only known to be at least k
            out.append(f"{names.get(col, col)} ran once, at step {ran[0]}, in these steps: its time is spread over "
                       f"the {k} steps recorded from there ({col} = {_term(r, col)} per step), at least as many as "
                       "it serves.")
            continue
        out.append(f"{names.get(col, col)} runs every {k} steps: each run's time is spread over the {k} steps it "
                   f"serves ({col} = {_term(r, col)} per step).")
    return out


def _profiles(profiles: list[dict]) -> str:
    """Each profile as `kind id at path (96% inside the phase, blocked 91%)`, or its status when it made no file."""
    def one(p: dict) -> str:
        where = f" at {p['path']}" if p.get("path") else f" ({p.get('status') or 'no file'}: no file)"
        share = inside_text(p)
        return f"{p['kind']} {p['profile_id']}{where}" + (f" ({share})" if share else "")
    return "; ".join(one(p) for p in profiles)


def _outliers(r: dict) -> list[str]:
    out, named = [], {p["profile_id"] for o in r["open_spans"] for p in o.get("profiles") or []}
    for o in r.get("outliers") or []:
        text = (
            f"Outlier: {o['stage']} took {sec(o['seconds'])} at step {o['step']} against a median of "
            f"{sec(o['median_s'])} per step ({o['steps_over']} of {len(r['steps'])} steps took over 3x the median"
            + (f": {steps_text(o['over_steps'])}" if len(o.get("over_steps") or []) > 1 else "") + ")."
        )
        profiles = [p for p in o["profiles"] if p["profile_id"] not in named]  # a hang's dump is named once
        out.append(text + (f" Profile: {_profiles(profiles)}." if profiles else ""))
    return out


def steps_text(steps: list[int], most: int = 10) -> str:
    """`steps 5, 11, 17 and 23, every 6 steps`: each step named (the first `most`), and the period
    when they recur at one."""
    steps = sorted(int(x) for x in steps)
    shown = [str(x) for x in steps[:most]] + ([f"{len(steps) - most} more"] if len(steps) > most else [])
    text = "step " + shown[0] if len(shown) == 1 else "steps " + ", ".join(shown[:-1]) + " and " + shown[-1]
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    if len(steps) >= 3 and len(gaps) == 1 and (gap := gaps.pop()) > 1:
        text += f", every {gap} steps"
    return text


def _waits(r: dict) -> list[str]:
    """The waits worth a sentence, each whole (every wait of the steps) and named after the
    processes it waited on by their share."""
    total_wall = sum(s["wall_s"] or 0 for s in r["steps"])
    totals = r.get("waits_total") or []
    if not total_wall or not totals:
        return []
    out = []
    for w in totals[:3]:  # largest first
        s = w["seconds"]
        if s / total_wall < WAIT_SHARE:
            break
        text = f"{_who(w['role'], w['rank'])} waited {sec(s)} ({s / total_wall:.0%} of step time)"
        if w["waited_for"] == "untraced":
            out.append(f"{text} while no recorded phase ran.")
        else:
            out.append(f"{text} for {w['waited_for']}{on_text(w.get('on') or [], w['process_id'])}.")
    return out


def _stragglers(r: dict) -> list[str]:
    out = []
    shares = sorted(t["tail_share"] for t in r["long_tail"] if t.get("tail_share") is not None)
    if shares and shares[len(shares) // 2] >= TAIL_SHARE:
        out.append(f"The rollout long tail (last sample minus median finish) costs a median {shares[len(shares) // 2]:.0%} of each step.")
    s = [x for x in r["stragglers"] if max(x.get("len_ratio") or 0, x.get("time_ratio") or 0) >= STRAGGLER_FACTOR]
    if s:  # the table lists every sample over analysis.stragglers' factor; 2x is an ordinary spread
        worst = max(s, key=lambda x: x["after_median_s"])
        ratio_text = f", {worst['len_ratio']:.1f}x the median length" if worst.get("len_ratio") else ""
        out.append(
            f"{len(s)} straggler sample(s) over {STRAGGLER_FACTOR:g}x the median in {len({x['step'] for x in s})} "
            f"step(s); worst: sample "
            f"{worst['sample_id']} at step {worst['step']}{ratio_text}, finished {sec(worst['after_median_s'])} "
            "after the median sample."
        )
    return out


def _weight_sync(r: dict) -> list[str]:
    fit, out = r["weight_sync_fit"], []
    kept, total = fit.get("kept", fit["n"]), (r.get("weight_sync_children") or {}).get("syncs") or fit["n"]
    counted = f"{kept} syncs" if kept == total else f"{kept} of the {total} syncs"  # one count of syncs per report
    over = counted + (f" of {fit['sizes']} sizes ({size_text(fit['min_bytes'])} to "
                                                  f"{size_text(fit['max_bytes'])})" if fit.get("sizes", 0) > 1 else "")
    if fit.get("regime") == "bandwidth":
        quality = f" (R² {fit['r2']:.2f})" if fit.get("r2") is not None else ""
        t_0 = (f"t_0 = {sec(fit['t_0'])}" if fit.get("t_0") is not None else
               "no fixed cost t_0 stands clear of the noise: the payload explains the time")
        out.append(f"Weight sync fit over {over}, robust to stalls: B_W = {rate_text(fit['B_W'])}, {t_0}{quality}.")
    elif fit.get("regime") == "latency":
        out.append(
            f"Weight sync time does not grow with payload over {over}: latency-bound, median t_0 ≈ {sec(fit['t_0'])}; "
            "bandwidth is not what limits it."
        )
    elif fit.get("effective_B_W"):
        out.append(
            f"Weight sync moved {rate_text(fit['effective_B_W'])} on average over {over} "
            "(one payload size: B_W and t_0 need several sizes to separate)."
        )
    stalls = fit.get("set_aside") or []
    if stalls:
        steps = ", ".join(str(x["step"]) for x in stalls[:5]) + (", ..." if len(stalls) > 5 else "")
        if len(stalls) == 1:
            out.append(f"1 stalled weight sync set aside from the fit: {sec(stalls[0]['seconds'])} at step {steps}.")
        else:
            out.append(f"{len(stalls)} stalled weight syncs set aside from the fit, {sec(stalls[-1]['seconds'])} to "
                       f"{sec(stalls[0]['seconds'])} (steps {steps}, slowest first).")
    if r["t_sync"] and r["t_W"] is not None and r["t_W"] / r["t_sync"] >= SYNC_SHARE:
        out.append(
            f"Weight sync takes {r['t_W'] / r['t_sync']:.0%} of the synchronous step (t_W = {sec(r['t_W'])}): "
            "the cost to fix first."
        )
        out.extend(_sync_largest(r.get("weight_sync_children") or {}))
    out.extend(_sync_growth(r.get("weight_sync_children") or {}))
    return out


def _sync_largest(g: dict) -> list[str]:
    big = next((c for c in g.get("children") or [] if c["child"] == g.get("largest")), None)
    if not big or big.get("share") is None:
        return []
    return [f"Of the weight sync, {big['child']} takes the most: median {sec(big['median_s'])} of "
            f"{sec(g['total']['median_s'])} ({big['share']:.0%})."]


def _sync_growth(g: dict) -> list[str]:
    total = g.get("total")
    if not total or g["syncs"] < 3 or total["growth_s"] <= SYNC_GROWTH * max(total["first_s"], 1e-3):
        return []
    window = g.get("window") or 1
    which = "the first and last sync" if window == 1 else f"medians of the first and last {window}"
    text = f"Weight sync grew from {sec(total['first_s'])} to {sec(total['last_s'])} over {g['syncs']} syncs ({which})"
    grew = next((c for c in g["children"] if c["child"] == g.get("grew")), None)
    if grew is None:
        return [text + "; no recorded child phase (drain, gather, transfer, load, resume) grew with it."]
    share = f", {grew['share_of_growth']:.0%} of the growth" if grew.get("share_of_growth") is not None else ""
    return [text + f"; {grew['child']} grew most, from {sec(grew['first_s'])} to {sec(grew['last_s'])}{share}."]


def _async(r: dict) -> list[str]:
    a = r["async"]
    if not r["t_sync"] or not r["async_speedup_bound"]:
        return []
    used = [k for k in ("t_R", "t_T", "t_W") if k in (r.get("recorded") or [])]
    missing = [k for k in ("t_R", "t_T", "t_W") if k not in used]
    terms = f" ({', '.join(missing)} not recorded, left out)" if missing else ""
    bound = f"max(t_R, t_T) + t_W = {sec(r['async_bound'])} ({r['async_speedup_bound']:.2f}x){terms}"
    overlap = (r.get("figures") or {}).get("achieved_speedup") or {"kind": "measured"}
    if overlap["kind"] == "not recorded":
        return [f"Overlap of stages not recorded ({overlap['basis']}): async could at best bring a step from "
                f"t_sync = {sec(r['t_sync'])} to {bound}, an optimistic bound."]
    if a.get("overlapping"):
        text = (
            f"Stages overlap ({overlap['kind']}): two stages ran at once for {sec(a['concurrent_s'])} of "
            f"{sec(a['stage_s'])} of stage time, a {a['achieved_speedup']:.2f}x speed-up over running them one after another"
        )
        if a["achieved_speedup"] > r["async_speedup_bound"]:
            return [(f"{text}, beyond the async bound {bound}: stages overlap more than it assumes "
                     "(e.g. weight sync with generation).")]
        gain = r["async_speedup_bound"] / a["achieved_speedup"]
        return [f"{text}; the async bound {bound} leaves at most {gain:.2f}x to gain."]
    text = (f"Stages ran one after another (no {overlap['kind']} overlap): async could at best bring a step from "
            f"t_sync = {sec(r['t_sync'])} to {bound}, an optimistic bound.")
    return [text + _replayed(r.get("whatif"), r["t_sync"])]


def _replayed(w: dict | None, t_sync: float) -> str:
    """The one-step-off prediction that replays the run's own samples and stage times (`rltrace whatif`)."""
    if not w or not w.get("predicted_step_s"):
        return ""
    lo, hi = w["interval_s"]
    base = w.get("recorded_step_s") or t_sync
    against = "recorded" if w.get("recorded_step_s") else "t_sync"
    below = ("; below the bound, which counts reward with the rollout and the weight sync after both: here the next "
             "rollout overlaps reward and weight sync too" if w["predicted_step_s"] < (w.get("analytic_s") or 0) else "")
    return (f" Replaying this run's samples and stage times one-step-off (staleness 1): {sec(w['predicted_step_s'])} "
            f"a step against {sec(base)} {against} ({base / w['predicted_step_s']:.2f}x; {sec(lo)}–{sec(hi)} in 90 % "
            f"of replays){below}. In the replay, {w['why']} (rltrace whatif tries other schedules).")


def crash_sentence(c: dict) -> str:
    """"trainer0 crashed at step 3 in `train`: RuntimeError: loss is NaN" (what info and report say)."""
    named = c.get("kind") == "thread" and c.get("thread_name") and c["thread_name"] != "MainThread"
    who = _who(c.get("role"), c.get("rank")) + (f" (thread {c['thread_name']})" if named else "")
    where = ("" if c.get("step") is None else f" at step {c['step']}") + (f" in `{c['phase']}`" if c.get("phase") else "")
    message = (c.get("message") or "").strip().splitlines()
    text = f"{c['exc_type']}: {message[0][:300]}" if message else c["exc_type"]
    after = "; the process went on" if c.get("kind") == "thread" else ""
    if c["exc_type"] == "KeyboardInterrupt":
        return f"{who} was interrupted (Ctrl-C){where}."
    return f"{who} crashed{where}: {text}{after}."


def _crashes(r: dict) -> list[str]:
    """One sentence per crash; the spans its process still had open, which the crash ended, are
    named in it (and get no sentence of their own: they did not hang)."""
    ended: dict[str, list[dict]] = defaultdict(list)
    for o in r.get("open_spans") or []:
        if o.get("state") == "crashed":
            ended[o["process_id"]].append(o)
    out = []
    for c in r.get("crashes") or []:
        text = crash_sentence(c)
        spans = ended.pop(c.get("process_id"), []) if c.get("kind") == "process" else []
        if spans:
            named = ", ".join(f"`{o['phase']}`" + ("" if o.get("step") is None else f" at step {o['step']}")
                              + f" ({open_text(o)})" for o in spans)
            text = text[:-1] + f"; the crash ended what was still open: {named}."
        out.append(text)
    return out


def _reward(r: dict) -> list[str]:
    w = r.get("reward") or {}
    if w.get("first") is None:
        return []
    logged = f" (logged as {', '.join(w['logged_as'])})" if w.get("logged_as") and w["logged_as"] != ["reward_mean"] else ""
    return [f"Reward went from {num(w['first'])} at step {w['first_step']} to {num(w['last'])} at step {w['last_step']}; "
            f"best {num(w['best'])} at step {w['best_step']}{logged}."]


def _blocking(r: dict) -> list[str]:
    """One sentence per blocking edge: the stuck thread, the call it is in, and the other side."""
    return [f"Blocked: {e['text']}" for e in r.get("blocking") or []]


def _hangs(r: dict) -> list[str]:
    out = []
    for o in r["open_spans"]:
        if o.get("state") == "crashed" or o.get("in_progress"):
            continue  # the crash's sentence says the crash ended it; a live step's span is not a hang
        step = "" if o.get("step") is None else f" at step {o['step']}"
        thread_name = o.get("thread_name") or "MainThread"
        named = thread_name != "MainThread" and not thread_name.startswith("Dummy-")  # Dummy-N: a foreign thread
        thread = f" (thread {o['thread_name']})" if named else ""
        where = f"Open span: {o['phase']} on {_who(o['role'], o['rank'])}{thread}{step}"
        state = o.get("state")
        if state == "exited":
            text = f"{where} never ended: {open_text(o)}; hung, or cut off by the exit."
        elif state == "killed":
            how = "hung, then killed" if (o.get("open_s") or 0.0) > STALE_AFTER_S else "killed"
            text = (f"{where} never ended, {open_text(o)}: {killed_timeline(o)}; no error was recorded: {how} "
                    "(e.g. SIGKILL or out of memory).")
        else:
            text = (f"{where} started and never ended ({open_text(o)})"
                    + (" and its process is alive: hung or still running." if state == "running" else ": hung or killed."))
        out.append(text + (f" Profile: {_profiles(o['profiles'])}." if o.get("profiles") else ""))
    return out


def _drops(r: dict) -> list[str]:
    d = r["dropped"]
    out = []
    if d["spans"] or d["rows"]:
        out.append(f"Dropped before the store: {d['spans']} spans and {d['rows']} metric/sample rows; figures may be low "
                   "(`rltrace info` says why).")
    if d.get("attributes"):
        out.append(f"{d['attributes']} span attributes over the attribute limit were not stored (rltrace's own were kept).")
    return out


def _staleness(r: dict) -> list[str]:
    s = r["staleness"]
    if s["max"] is None or not s["max"]:
        return []
    return [f"Staleness: mean {s['mean']:.2f}, max {s['max']:.0f} weight versions."]


def mismatch_missing_sentences(r: dict) -> list[str]:
    """Where an integration could not record mismatch, and why (the report and the Reward page)."""
    return [f"Mismatch not recorded on {_who(m['role'], m['rank'])} ({_steps_text(m)}): {m['reason']}."
            for m in r["mismatch"].get("missing") or []]


def _mismatch(r: dict) -> list[str]:
    out = mismatch_missing_sentences(r)
    for t in r["mismatch"]["trends"]:
        for c in t.get("computations") or []:
            if c.get("agree") is False:
                out.append(
                    f"{t['metric']} computed two ways disagrees: {num(c['lead_value'])} ({MISMATCH_SOURCES[t['source']]}) "
                    f"against {num(c['other_value'])} ({MISMATCH_SOURCES[c['source']]}) at step {c['at_step']} "
                    f"(largest of {c['steps']} steps compared): one of them is not computing what it says."
                )
        neutral, floor = MISMATCH_SCALE.get(t["metric"], (0.0, 0.0))
        source = mismatch_label(t)
        change = abs(t["slope_per_step"] or 0.0) * (t["steps"] - 1)
        reach = max(abs(t["max"] - neutral), abs(t["min"] - neutral))
        if t["steps"] > 1 and change > 0 and change >= max(floor, MATERIAL_CHANGE * reach):
            if num(t["first"]) == num(t["last"]):
                moved = f"varied between {num(t['min'])} and {num(t['max'])}, ending at {num(t['last'])},"
            else:
                moved = f"went from {num(t['first'])} to {num(t['last'])} (max {num(t['max'])} at step {t['max_step']})"
            out.append(f"{t['metric']}{source} {moved} over {t['steps']} steps (robust trend "
                       f"{t['slope_per_step']:+.3g} per step).")
        elif t["metric"] == "train_rollout_logprob_abs_diff" and t["max"] >= ALIGNMENT_GATE:
            out.append(
                f"{t['metric']}{source} held at a mean of {num(t['mean'])} (max {num(t['max'])}) over {t['steps']} steps, "
                f"above the {ALIGNMENT_GATE:g} gate for exact alignment of rollout and training."
            )
    return out


def _steps_text(m: dict) -> str:
    first, last = m["first_step"], m["last_step"]
    return f"step {first}" if first == last else f"{m['steps']} steps, {first}–{last}"


def _idle_devices(r: dict) -> list[str]:
    out = []
    for d in (r.get("idle_devices") or [])[:5]:
        steps = f" over {d['steps']} step(s)" if d.get("steps") else ""
        out.append(
            f"GPU {d['device']} was {d['util_mean_pct']:.0f} % busy during `{d['phase']}` on {_who(d['role'], d['rank'])} "
            f"(mean of {d['samples']} samples{steps})."
        )
    return out


QUEUE_SHARE = 0.25  # requests queued this share of their engine time: the engines were saturated
SPEC_ACCEPT = 0.5  # speculative decoding that keeps less than this share of its drafts costs more than it saves


def _engine(r: dict) -> list[str]:
    """The engine's own numbers, when generation is the bottleneck and one of them explains it."""
    rows = r.get("engine") or []
    if not rows or (r.get("bottleneck") or {}).get("stage") not in (None, "rollout"):
        return []

    def median(key):
        values = sorted(x[key] for x in rows if x.get(key) is not None)
        return values[len(values) // 2] if values else None

    out = []
    queue = median("queue_share")
    if queue is not None and queue >= QUEUE_SHARE:
        out.append(f"Engine requests spent a median {queue:.0%} of their time queued (queue_time / e2e_latency): "
                   "the engines were saturated; more engines or fewer concurrent requests would shorten the rollout.")
    spec = median("spec_accept_rate")
    if spec is not None and 0 < spec < SPEC_ACCEPT:
        out.append(f"Speculative decoding accepted a median {spec:.0%} of drafted tokens: drafts mostly wasted, "
                   "try fewer draft tokens or decoding without a draft model.")
    hit = median("prefix_cache_hit_rate")
    if hit is not None and hit < 0.05 and queue is not None:
        out.append(f"Prefix-cache hit rate was {hit:.0%}: each prompt was prefilled again; group samples of one "
                   "prompt on one engine (or enable the prefix cache) to skip that prefill.")
    return out
