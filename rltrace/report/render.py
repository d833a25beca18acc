"""The terminal report: sentences first, then the tables behind them (rich).

Times read as `231 µs` / `12.4 ms` / `1.23 s`; tables are narrow enough for an 80-column terminal.
"""

from __future__ import annotations

import datetime as dt
import re

from rich.console import Console
from rich.table import Table

from rltrace.analysis._format import number_text as num
from rltrace.analysis._format import process_name as _who
from rltrace.analysis._format import seconds_text as sec
from rltrace.analysis._format import share_text as _pct
from rltrace.analysis._format import mismatch_label, term

MAX_STEP_ROWS = 30
MAX_WAIT_ROWS = 10
SHORT_ROWS = 3  # rows of the waits and stragglers tables in the default (one-screen) report
_UNIT = re.compile(r"(\d) (ns|µs|ms|s|min|h|B/s|kB/s|MB/s|GB/s|TB/s)\b")


def _keep_units(sentence: str) -> str:
    """Non-breaking space between a number and its unit, so wrapping never splits `188 µs`."""
    return _UNIT.sub("\\1\u00a0\\2", sentence)


def _times(value) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _table(title: str, columns: list[str]) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    return t


def render(r: dict, console: Console, *, full: bool = False) -> None:
    """The report: by default what fits a screen (findings, cost model, quality, the top waits and
    stragglers, open spans); `full=True` adds every table (phases, steps, critical paths)."""
    run = r.get("run", {})
    steps = r["steps"]
    span = f"steps {steps[0]['step']}–{steps[-1]['step']} ({len(steps)})" if steps else "no finished step in range"
    console.print(f"[bold]{term(run.get('name', ''))}[/]  {term(run.get('run_dir', ''))}  ·  {span}")
    findings = Table.grid(padding=(0, 1))
    findings.add_column(no_wrap=True)
    findings.add_column(overflow="fold")  # a long path (a profile's file) folds instead of being cut
    for sentence in r["findings"]:
        findings.add_row(" •", _keep_units(term(sentence)))
    console.print(findings)
    if steps:  # without a finished step every term would read "not recorded"
        console.print(_cost_model(r))
    quality = _quality(r)
    if quality is not None:
        console.print(quality)
    rows = None if full else SHORT_ROWS
    tables = [_waits(r, rows), _stragglers(r, rows), _open_spans(r)]
    if full:
        tables = [_phases(r), _steps(steps), tables[0], _paths(r), *tables[1:]]
    for table in tables:
        if table is not None:
            console.print(table)
    if not full:
        console.print("[dim]--full: every table (phases, steps, critical paths); --json: every number[/]")


def _term(r: dict, key: str) -> str:
    return "not recorded" if r.get(key) is None else sec(r[key])


def _cost_model(r: dict) -> Table:
    """The cost model, each figure with its kind (`report.evidence`: measured, imported, derived, not recorded)."""
    figures = r.get("figures") or {}
    t = _table("Cost model (median per step)", ["", "time", "kind", "what"])
    every = r.get("amortised") or {}
    note = {k: f", runs every {v} steps (spread)" for k, v in every.items()}
    inside = {s["stage"]: f" (most in {term(s['culprit']['phase'])})" for s in r.get("stages") or [] if s.get("culprit")}

    def kind(key: str) -> str:
        return figures[key]["kind"] if key in figures else ""

    def source(key: str) -> str:
        f = figures.get(key) or {}
        return f" (from {term(f['basis'])})" if f.get("kind") == "imported" and f.get("basis") else ""

    rollout = ("" if r.get("t_R") is None else f"rollout {_term(r, 't_rollout')}{inside.get('rollout', '')} + "
               f"reward {_term(r, 't_reward')}{inside.get('reward', '')}")
    t.add_row("t_R", _term(r, "t_R"), kind("t_R"), rollout + note.get("t_R", "") + source("t_R"))
    t.add_row("t_T", _term(r, "t_T"), kind("t_T"), "train" + inside.get("train", "") + note.get("t_T", "") + source("t_T"))
    t.add_row("t_W", _term(r, "t_W"), kind("t_W"),
              "weight sync" + inside.get("weight_sync", "") + note.get("t_W", "") + source("t_W"))
    t.add_row("t_sync", sec(r["t_sync"]), kind("t_sync"), "t_R + t_T + t_W: one synchronous step")
    bound = r["async_speedup_bound"]
    t.add_row("async bound", sec(r["async_bound"]), kind("async_bound"),
              "max(t_R, t_T) + t_W" + ("" if bound is None else f": at best {bound:.2f}x"))
    overlap = figures.get("achieved_speedup") or {}
    if overlap.get("value"):
        t.add_row("achieved", f"{overlap['value']:.2f}x", overlap["kind"], "stage time / time with any stage running")
    elif overlap.get("kind") == "not recorded" and r["async"].get("stage_s"):
        t.add_row("achieved", "not recorded", overlap["kind"], term(overlap.get("basis") or ""))
    t.columns[2].justify = "left"
    t.columns[3].justify = "left"
    return t


def _quality(r: dict) -> Table | None:
    """Reward (first → last, best step), mismatch and staleness in one small table."""
    t = _table("Reward, mismatch, staleness", ["", "first", "last", "best / max", "at step"])
    w = r.get("reward") or {}
    if w.get("first") is not None:
        t.add_row("reward", num(w["first"]), num(w["last"]), num(w["best"]), str(w["best_step"]))
    for m in r["mismatch"]["trends"]:
        t.add_row(term(m["metric"] + mismatch_label(m)), num(m["first"]), num(m["last"]), num(m["max"]), str(m["max_step"]))
    s = r["staleness"]
    if s.get("max") is not None:
        t.add_row("staleness", "", f"mean {num(s['mean'])}", num(s["max"]), "")
    return t if t.row_count else None


def _phases(r: dict) -> Table:
    t = _table("Phases (union time across processes)", ["phase", "total", "per step", "per run", "share", "runs"])
    for p in r["phases"]:
        t.add_row(term(p["phase"]), sec(p["total_s"]), sec(p["per_step_s"]), sec(p["per_run_s"]), _pct(p["share"]),
                  str(p["steps"]))
    t.caption = "per step: over every step (amortised); per run: over the steps that ran it"
    return t


def _steps(steps: list[dict]) -> Table:
    t = _table("Steps (amortised share in brackets)", ["step", "wall", "t_R", "t_T", "t_W", "tail", "spans"])
    for s in steps[-MAX_STEP_ROWS:]:
        t.add_row(str(s["step"]), sec(s["wall_s"]), _both(s, "t_R"), _both(s, "t_T"), _both(s, "t_W"), sec(s["tail_s"]),
                  str(s["spans"]))
    if len(steps) > MAX_STEP_ROWS:
        t.caption = f"last {MAX_STEP_ROWS} of {len(steps)} steps (--json for all)"
    return t


def _both(s: dict, col: str) -> str:
    """A step's recorded time, and its amortised share when the stage runs every few steps."""
    raw, spread = s.get(col), s.get(col + "_amortised")
    if raw is not None and spread is not None and abs(raw - spread) > 1e-12:
        return f"{sec(raw)} ({sec(spread)})"
    if raw is None and spread is not None:
        return f"({sec(spread)})"
    return sec(raw)


def _waits(r: dict, rows: int | None = None) -> Table | None:
    limit = rows or MAX_WAIT_ROWS
    waits = sorted(r["waits"], key=lambda w: -w["seconds"])[:limit]
    if not waits:
        return None
    t = _table("Longest waits", ["step", "process", "in", "waited for", "on", "time", "share"])
    for w in waits:
        other = "(thread)" if w.get("waited_for_process") == w["process_id"] else term(w.get("waited_for_name") or "")
        t.add_row(str(w["step"]), term(_who(w["role"], w["rank"])), term(w["in_phase"]), term(w["waited_for"]), other,
                  sec(w["seconds"]), _pct(w["share"]))
    for col in t.columns[1:5]:
        col.justify = "left"
    if len(r["waits"]) > limit:
        t.caption = f"{limit} longest of {len(r['waits'])} (--full or --json for more)"
    return t


def _paths(r: dict) -> Table | None:
    if not r["critical_path"]:
        return None
    t = _table("Critical paths", ["path", "steps", "median"])
    for p in r["critical_path"][:5]:
        t.add_row(term(p["path"]), str(p["steps"]), sec(p["seconds"]))
    return t


def _stragglers(r: dict, rows: int | None = None) -> Table | None:
    if not r["stragglers"]:
        return None
    limit = rows or 10
    t = _table("Stragglers", ["step", "sample", "length", "x median", "gen time", "x median", "after median"])
    if len(r["stragglers"]) > limit:
        t.caption = f"{limit} of {len(r['stragglers'])} (--full or --json for more)"
    for s in sorted(r["stragglers"], key=lambda x: -(x.get("after_median_s") or 0))[:limit]:
        t.add_row(str(s["step"]), str(s["sample_id"]), num(s["response_len"]), _times(s["len_ratio"]),
                  sec(s["gen_s"]), _times(s["time_ratio"]), sec(s["after_median_s"]))
    return t


def _open_spans(r: dict) -> Table | None:
    if not r["open_spans"]:
        return None
    t = _table("[red]Open spans[/] (started, never ended)",
               ["process", "thread", "phase", "step", "started", "open for", "its process"])
    state = {"killed": "killed (open at least this)", "running": "alive: hung or still running", "exited": "exited",
             "crashed": "crashed: the crash ended it"}
    for o in r["open_spans"]:
        started = dt.datetime.fromtimestamp(o["start_ns"] / 1e9).strftime("%Y-%m-%d %H:%M:%S")
        t.add_row(term(_who(o["role"], o["rank"])), term(o.get("thread_name") or ""), term(o["phase"]),
                  "" if o["step"] is None else str(o["step"]), started, sec(o["open_s"]),
                  "alive: in progress" if o.get("in_progress") else state.get(o.get("state"), "hung or killed"))
    for col in t.columns[1:3]:
        col.justify = "left"
    return t


#: How the compare table shows each unit of `compare()` rows (times in seconds read as `12.4 ms`).
_COMPARE_UNITS = {"s/step (median)": "median/step", "s/step (mean)": "mean/step", "s (median)": "median",
                  "mean over steps": "mean", "last step": "last step", "mean": "mean"}


def render_compare(rows: list[dict], this_name: str, other_name: str, console: Console) -> None:
    this_name, other_name = term(this_name), term(other_name)
    t = _table(f"Compare: {this_name} vs {other_name}", ["what", "", this_name, other_name, "ratio"])
    t.columns[0].overflow = "fold"
    t.columns[1].justify = "left"
    for row in rows:
        show = sec if row["unit"].startswith("s") else num
        t.add_row(term(row["what"]), _COMPARE_UNITS.get(row["unit"], row["unit"]), show(row["this"]), show(row["other"]),
                  "-" if row["ratio"] is None else f"{row['ratio']:.{2 if row['ratio'] < 10 else 0}f}x")
    console.print(t)
