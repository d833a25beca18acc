"""The timeline chart: spans of one or a few steps as bars, one block of rows per process.

Within a process, each span takes the first row free at its start (spans sorted by start, longer
first), so a parent sits above its children and concurrent spans (rollout threads, async
requests) stack instead of hiding each other. Colour is the phase; `wait` spans are hatched,
open spans (started, never ended) run to the window's end in red cross-hatch, and critical-path
spans get a thick outline.
"""

from __future__ import annotations

import heapq

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rltrace.analysis import _format as fmt
from rltrace.ui import charts, style

MAX_BARS = 4000  # the browser stays responsive; the longest spans are kept
ROLE_ORDER = {"trainer": 0, "actor": 1, "rollout": 2, "reward": 3}
ROW_PX = 16


def rows(start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Row of each span (inputs sorted by start, longer first) so no two on a row overlap."""
    busy: list[tuple[int, int]] = []  # (end, row) of rows in use
    free: list[int] = []
    out = np.empty(len(start_ns), np.int64)
    used = 0
    for i, (s, e) in enumerate(zip(start_ns.tolist(), end_ns.tolist())):
        while busy and busy[0][0] <= s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            row = heapq.heappop(free)
        else:
            row, used = used, used + 1
        out[i] = row
        heapq.heappush(busy, (e, row))
    return out


def layout(spans: pd.DataFrame, *, max_bars: int = MAX_BARS, keep: set[str] = frozenset(),
           open_until: dict[str, int] | None = None) -> tuple[pd.DataFrame, int]:
    """Spans with plot positions (x0_s, x1_s, y, process label) and how many were left out.

    Open spans end where `open_until` (span_id -> Unix ns: the run's last write) says, else at
    the window's end. Beyond `max_bars`, the shortest spans are left out (open spans and those
    in `keep` always stay).
    """
    s = spans.copy()
    if s.empty:
        return s.assign(x0_s=[], x1_s=[], y=[], label=[]), 0
    t0 = int(s["start_ns"].min())
    finished_end = s.loc[~s["is_open"], "end_ns"]
    window_end = int(max(finished_end.max() if len(finished_end) else t0, s["start_ns"].max()))
    # open: never ended, or ended only by rltrace when its process exited (listed in open_until)
    s["open"] = s["is_open"].astype(bool) | s["end_ns"].isna() | s["span_id"].isin(list(open_until or {}))
    until = s["span_id"].map(open_until or {}).fillna(window_end)
    s["end_plot"] = s["end_ns"].fillna(until).astype("int64").clip(lower=s["start_ns"])
    left_out = 0
    if len(s) > max_bars:
        must = s["open"] | s["span_id"].isin(keep)
        length = s["end_plot"] - s["start_ns"]
        ranked = length.where(~must, np.iinfo(np.int64).max).sort_values(ascending=False)
        chosen = ranked.index[:max_bars]
        left_out = len(s) - len(chosen)
        s = s.loc[chosen]
    s["who"] = [fmt.process_name(r, k) for r, k in zip(s["role"], s["rank"])]
    s["label"] = s["who"] + " · " + s["host"].fillna("?").astype(str)
    s["role_order"] = s["role"].map(ROLE_ORDER).fillna(len(ROLE_ORDER))
    s["block"] = "process " + s["process_id"].astype(str)
    if "lane" not in s.columns:  # `lane` / `lane_order`: rows of their own (one per sample), before the processes
        s["lane"], s["lane_order"] = None, np.nan
    laned = s["lane"].notna()
    s.loc[laned, "label"] = s.loc[laned, "lane"]
    s.loc[laned, "block"] = "lane " + s.loc[laned, "lane"].astype(str)
    s = s.sort_values(["lane_order", "role_order", "role", "rank", "process_id", "start_ns", "end_plot"],
                      ascending=[True, True, True, True, True, True, False], na_position="last")
    offset = 0
    ys = []
    for _, g in s.groupby("block", sort=False):
        r = rows(g["start_ns"].to_numpy(), g["end_plot"].to_numpy())
        ys.append(pd.Series(offset + r, index=g.index))
        offset += int(r.max()) + (1 if g["lane"].notna().all() else 2)  # a blank row between processes
    s["y"] = pd.concat(ys)
    s["x0_s"] = (s["start_ns"] - t0) / 1e9
    s["x1_s"] = (s["end_plot"] - t0) / 1e9
    return s, left_out


def _bars(fig: go.Figure, g: pd.DataFrame, name: str, color: str, pattern: str = "") -> None:
    """One trace of bars with scalar styling (per-bar style arrays make plotly validate every element)."""
    fig.add_bar(
        y=g["y"], x=g["x1_s"] - g["x0_s"], base=g["x0_s"], orientation="h", name=name, legendgroup=name, width=0.82,
        marker={"color": color, "line": {"color": "rgba(0,0,0,0.25)", "width": 0.5},
                                   "pattern": {"shape": pattern, "fgcolor": "#52525b" if pattern == "/" else "#ffffff", "size": 6}},
        text=g["request"] if "request" in g else None, textposition="inside", insidetextanchor="start",
        textfont={"size": 9}, cliponaxis=True,
        customdata=np.column_stack([g["span_id"], g["name"], g["who"], g["x1_s"] - g["x0_s"], g["step"],
                                    g["thread_name"].fillna("") if "request" not in g else
                                    (g["thread_name"].fillna("") + " " + g["request"].fillna("")).str.strip()]),
        hovertemplate="<b>%{customdata[1]}</b> (step %{customdata[4]}) on %{customdata[2]} · %{customdata[5]}<br>"
                      "%{base:.4f} s → +%{customdata[3]:.4g} s",  # the side box: the trace's (escaped) name
    )


def figure(laid: pd.DataFrame, *, critical: set[str] = frozenset(), selected: str | None = None,
           step_starts: dict[int, float] | None = None, x_range: tuple[float, float] | None = None) -> go.Figure:
    """The Gantt of `layout()` output; `step_starts` (step -> seconds) draws step boundaries."""
    fig = go.Figure()
    if laid.empty:
        return fig
    finished = laid[~laid["open"]]
    for phase, g in finished.groupby("phase", sort=False):
        _bars(fig, g, phase, style.phase_color(phase), "/" if phase == "wait" else "")
    still_open = laid[laid["open"]]
    if len(still_open):
        _bars(fig, still_open, "open (never ended)", style.IDLE_COLOR, "x")
    on_path = laid[laid["span_id"].isin(critical)]
    if len(on_path):
        fig.add_bar(y=on_path["y"], x=on_path["x1_s"] - on_path["x0_s"], base=on_path["x0_s"], orientation="h", width=0.82,
                    name="critical path", marker={"color": "rgba(0,0,0,0)", "line": {"color": "#18181b", "width": 2.5}},
                    hoverinfo="skip")
    if selected is not None and selected in set(laid["span_id"]):
        sel = laid[laid["span_id"] == selected].iloc[0]
        fig.add_shape(type="rect", x0=sel["x0_s"], x1=sel["x1_s"], y0=sel["y"] - 0.5, y1=sel["y"] + 0.5,
                      line={"color": "#facc15", "width": 3}, fillcolor="rgba(0,0,0,0)")
    blocks = laid.groupby("label", sort=False)["y"].agg(["min", "max"])
    for i, (_, b) in enumerate(blocks.iterrows()):
        if i % 2 == 0:
            fig.add_hrect(y0=b["min"] - 0.6, y1=b["max"] + 0.6, fillcolor="#f4f4f5", line_width=0, layer="below")
    for step, x in (step_starts or {}).items():
        fig.add_vline(x=x, line={"color": "#a1a1aa", "dash": "dot", "width": 1})
        fig.add_annotation(x=x, y=1.0, yref="paper", text=f"step {step}", showarrow=False, xanchor="left",
                           yanchor="bottom", font={"size": 10, "color": "#52525b"})
    fig.update_yaxes(tickvals=blocks["min"].tolist(), ticktext=blocks.index.tolist(), autorange="reversed",
                     showgrid=False, zeroline=False)
    fig.update_xaxes(title_text="seconds from the first span shown", showgrid=True, gridcolor="#e4e4e7", zeroline=False,
                     range=list(x_range) if x_range else None)
    height = int(np.clip((laid["y"].max() + 2) * ROW_PX + 120, 260, 1600))
    charts.inert(fig)
    fig.update_layout(template="plotly_white", barmode="overlay", height=height, bargap=0,
                      margin={"l": 10, "r": 10, "t": 30, "b": 70}, clickmode="event+select", dragmode="zoom",
                      legend={"orientation": "h", "yanchor": "top", "y": -60 / max(height - 100, 100), "xanchor": "left", "x": 0,
                              "title": None})
    return fig


SAMPLE_ORDERS = ("group", "duration", "reward")


def sample_lanes(spans: pd.DataFrame, per_sample: pd.DataFrame, order: str = "group") -> pd.DataFrame:
    """`spans` with `lane` / `lane_order` / `request` columns: one lane per sample (from
    `analysis.sample_timeline`), each group's lane first and its samples under it. `order`: by
    group and sample id, by duration (longest group, then longest sample, first) or by reward
    (highest first); spans of no sample keep their process rows."""
    if order not in SAMPLE_ORDERS:
        raise ValueError(f"order={order!r}: expected one of {SAMPLE_ORDERS}")
    facts = per_sample[["span_id", "sample_id", "group_id", "reward", "sample_s", "request"]].drop_duplicates("span_id")
    s = spans.drop(columns=[c for c in ("request",) if c in spans.columns]).merge(facts, on="span_id", how="left")
    mine = s["sample_id"].notna() | s["group_id"].notna()
    gnum = pd.to_numeric(s["group_id"], errors="coerce")
    snum = pd.to_numeric(s["sample_id"], errors="coerce")
    per_group = s[mine].groupby("group_id", dropna=False)
    if order == "group":
        gkey, skey = gnum, snum
    elif order == "duration":
        gkey, skey = -s["group_id"].map(per_group["sample_s"].max()), -s["sample_s"]
    else:
        gkey, skey = -s["group_id"].map(per_group["reward"].mean()), -s["reward"]
    is_group = s["sample_id"].isna()
    s["lane"] = np.where(~mine, None, np.where(is_group, "group " + s["group_id"].astype(str),
                                                "group " + s["group_id"].astype(str) + " · sample " + s["sample_id"].astype(str)))
    key = pd.DataFrame({"g": gkey.fillna(np.inf), "gid": s["group_id"].astype(str), "first": (~is_group).astype(int),
                        "s": skey.fillna(np.inf), "sid": s["sample_id"].astype(str)})
    ranked = key[mine].drop_duplicates().sort_values(["g", "gid", "first", "s", "sid"])
    rank = {tuple(r): i for i, r in enumerate(ranked.itertuples(index=False))}
    s["lane_order"] = [rank[tuple(r)] if m else np.nan for r, m in zip(key.itertuples(index=False), mine)]
    return s
