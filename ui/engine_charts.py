"""Plotly figures of the report's `serving` section (the Engine page). Each draws rows the report
already holds: no figure here computes a number of its own."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rltrace.analysis import _format as fmt
from rltrace.ui import charts, style

ROLE_ORDER = ("prefill", "decode", "unified", "disaggregated")
ROLE_COLORS = {"prefill": "#3b6fb6", "decode": "#e0861a", "unified": "#3f9e4d", "disaggregated": "#8e5bb5"}
STALE_COLOR = style.IDLE_COLOR
STATE_COLOR = "#8e5bb5"


def _roles(values) -> list[str]:
    present = [r for r in dict.fromkeys(values) if r is not None]
    return sorted(present, key=lambda r: (ROLE_ORDER.index(r) if r in ROLE_ORDER else len(ROLE_ORDER), r))


def requests_over_time(timeline: pd.DataFrame, *, height_per_lane: int = 170) -> go.Figure:
    """One lane per role (prefill, decode, ...), a line per engine: requests in flight over the run."""
    roles = _roles(timeline["role"])
    fig = make_subplots(rows=len(roles), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[charts.label(f"{r} engines") for r in roles])
    when = pd.to_datetime(timeline["start_ns"] + (timeline["bin_s"] * 5e8).round().astype("int64"), unit="ns")
    for lane, role in enumerate(roles, start=1):
        mine = timeline[timeline["role"] == role]
        for engine, g in mine.groupby("engine", sort=True):
            fig.add_trace(go.Scatter(x=when[g.index], y=g["in_flight"], name=str(engine), mode="lines", line={"width": 1.5},
                                     legendgroup=str(role), hovertemplate="%{y:.2f} in flight<extra>%{fullData.name}</extra>"),
                          row=lane, col=1)
        fig.update_yaxes(title_text="in flight", rangemode="tozero", row=lane, col=1)
    return charts.base(fig, height=max(220, height_per_lane * len(roles) + 60))


def engine_throughput(engines: pd.DataFrame, pd_: dict | None, *, height: int = 300) -> go.Figure:
    """Requests each engine completed per second while it had work, coloured by role; with the
    stage capacities (n_P μ_P, n_D μ_D, B_KV / S_KV) and λ_max when the deployment is disaggregated."""
    known = engines[engines["mu_rps"].notna()]
    cols = 2 if pd_ else 1
    fig = make_subplots(rows=1, cols=cols, column_widths=[0.6, 0.4] if pd_ else None,
                        subplot_titles=["per engine (μ, while busy)", "per stage, and λ_max"][:cols])
    for role in _roles(known["role"]):
        mine = known[known["role"] == role]
        fig.add_trace(go.Bar(x=mine["engine"].astype(str), y=mine["mu_rps"], name=str(role),
                             marker_color=ROLE_COLORS.get(role, style.OTHER_COLORS[0]),
                             hovertemplate="%{x}: %{y:.3g} req/s<extra></extra>"), row=1, col=1)
    if pd_:
        stages = [("prefill", pd_["prefill_capacity_rps"]), ("decode", pd_["decode_capacity_rps"])]
        if pd_.get("kv_transfer_rps") is not None:
            stages.append(("KV link", pd_["kv_transfer_rps"]))
        fig.add_trace(go.Bar(x=[s for s, _ in stages], y=[v for _, v in stages], showlegend=False,
                             marker_color=[ROLE_COLORS.get(s, STATE_COLOR) for s, _ in stages],
                             hovertemplate="%{x} could serve %{y:.3g} req/s<extra></extra>"), row=1, col=2)
        fig.add_hline(y=pd_["lambda_max"], line_dash="dash", line_color=STALE_COLOR, row=1, col=2,
                      annotation_text=f"λ_max {fmt.number_text(pd_['lambda_max'])} req/s", annotation_position="top left")
    fig.update_yaxes(title_text="req/s", rangemode="tozero")
    return charts.base(fig, height=height)


def version_label(version) -> str:
    return "before the first weight sync" if version is None else f"v{version}"


def hits_by_version(per_version: pd.DataFrame, *, height: int = 300) -> go.Figure:
    """Per weight version: the share of prompt tokens served from the prefix cache, valid hits and
    stale ones (cached before the update) stacked, the stale part marked."""
    x = [version_label(None if pd.isna(v) else int(v)) for v in per_version["weight_version"]]
    stale = per_version["hit_rate"] - per_version["hit_rate_within_version"]
    fig = go.Figure([
        go.Bar(x=x, y=per_version["hit_rate_within_version"], name="hits within the version", marker_color="#3b6fb6",
               hovertemplate="%{x}: %{y:.1%} of prompt tokens<extra>valid hits</extra>"),
        go.Bar(x=x, y=stale, name="stale hits (cached before the update)", marker_color=STALE_COLOR,
               text=[f"{n} stale" if n else "" for n in per_version["stale_hits"]], textposition="outside",
               hovertemplate="%{x}: %{y:.1%} of prompt tokens<extra>stale hits</extra>"),
    ])
    fig.update_layout(barmode="stack")
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    return charts.base(fig, height=height, y="cached / prompt tokens")


def budget_split(budget: dict, *, height: int = 220) -> go.Figure:
    """The cache the busiest engine held at its peak: attention KV (N · c_A) and recurrent state
    (K · c_R), as configured and with an FP8 KV cache."""
    rows = [(f"{budget['kv_dtype']} KV", budget["attention_bytes"], budget["state_bytes"])]
    if budget.get("fp8"):
        rows.append(("FP8 KV", budget["fp8"]["attention_bytes"], budget["state_bytes"]))
    names = [r[0] for r in rows]
    fig = go.Figure([
        go.Bar(y=names, x=[r[1] / 1e9 for r in rows], orientation="h", name="attention KV (N · c_A)",
               marker_color="#3b6fb6", hovertemplate="%{x:.3g} GB<extra>attention KV</extra>"),
        go.Bar(y=names, x=[r[2] / 1e9 for r in rows], orientation="h", name="recurrent state (K · c_R)",
               marker_color=STATE_COLOR, hovertemplate="%{x:.3g} GB<extra>recurrent state</extra>"),
    ])
    fig.update_layout(barmode="stack")
    return charts.base(fig, height=height, x="GB (10⁹ bytes)")
