"""The terminal report: sentences first, then the tables behind them (rich)."""

from __future__ import annotations

import datetime as dt

from rich.console import Console
from rich.table import Table

MAX_STEP_ROWS = 30


def _f(value, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _who(role, rank) -> str:
    return "?" if role is None else f"{role}{'' if rank is None else int(rank)}"


def _table(title: str, columns: list[str]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    return t


def render(r: dict, console: Console) -> None:
    run = r.get("run", {})
    steps = r["steps"]
    span = f"steps {steps[0]['step']}–{steps[-1]['step']} ({len(steps)})" if steps else "no steps"
    console.print(f"[bold]{run.get('name', '')}[/]  {run.get('run_dir', '')}  ·  {span}")
    for sentence in r["findings"]:
        console.print(f" • {sentence}")

    t = _table("Cost model (seconds, median per step)", ["t_R", "rollout", "reward", "t_T", "t_W", "t_sync",
                                                       "async bound", "speed-up bound", "measured period"])
    t.columns[0].justify = "right"
    t.add_row(*[_f(r[k]) for k in ("t_R", "t_rollout", "t_reward", "t_T", "t_W", "t_sync", "async_bound")],
              _f(r["async_speedup_bound"], ".2f") + "x", _f(r["async"]["period_s"]))
    console.print(t)

    t = _table("Phases (union time across processes)", ["phase", "stage", "total s", "mean s/step", "share", "spans"])
    for p in r["phases"]:
        t.add_row(p["phase"], p["stage"] or "", _f(p["total_s"]), _f(p["mean_s"]), _f(p["share"], ".0%"), str(p["spans"]))
    console.print(t)

    t = _table("Steps", ["step", "wall s", "t_R", "t_T", "t_W", "tail s", "spans"])
    for s in steps[-MAX_STEP_ROWS:]:
        t.add_row(str(s["step"]), _f(s["wall_s"]), _f(s["t_R"]), _f(s["t_T"]), _f(s["t_W"]), _f(s["tail_s"]), str(s["spans"]))
    if len(steps) > MAX_STEP_ROWS:
        t.caption = f"last {MAX_STEP_ROWS} of {len(steps)} steps (--json for all)"
    console.print(t)

    waits = sorted(r["waits"], key=lambda w: -w["seconds"])[:10]
    if waits:
        t = _table("Longest waits", ["step", "process", "in", "waited for", "on", "seconds", "share"])
        for w in waits:
            t.add_row(str(w["step"]), _who(w["role"], w["rank"]), w["in_phase"], w["waited_for"],
                      w.get("waited_for_name") or "", _f(w["seconds"]), _f(w["share"], ".0%"))
        console.print(t)

    if r["critical_path"]:
        t = _table("Critical paths", ["path", "steps", "median s"])
        for p in r["critical_path"][:5]:
            t.add_row(p["path"], str(p["steps"]), _f(p["seconds"]))
        console.print(t)

    if r["stragglers"]:
        t = _table("Stragglers", ["step", "sample", "response len", "x median len", "gen s", "x median time", "after median s"])
        for s in r["stragglers"][:10]:
            t.add_row(str(s["step"]), str(s["sample_id"]), _f(s["response_len"], ".0f"), _f(s["len_ratio"], ".1f"),
                      _f(s["gen_s"]), _f(s["time_ratio"], ".1f"), _f(s["after_median_s"]))
        console.print(t)

    if r["open_spans"]:
        t = _table("[red]Open spans[/] (started, never ended: hung or killed)", ["process", "phase", "step", "started", "open s"])
        for o in r["open_spans"]:
            started = dt.datetime.fromtimestamp(o["start_ns"] / 1e9).strftime("%Y-%m-%d %H:%M:%S")
            t.add_row(o["process_id"], o["phase"], "" if o["step"] is None else str(o["step"]), started, _f(o["stalled_s"]))
        console.print(t)


def render_compare(rows: list[dict], this_name: str, other_name: str, console: Console) -> None:
    t = _table(f"Compare: {this_name} vs {other_name}", ["what", "unit", this_name, other_name, "ratio"])
    for row in rows:
        t.add_row(row["what"], row["unit"], _f(row["this"]), _f(row["other"]), _f(row["ratio"], ".2f"))
    console.print(t)
