"""Plotly figures of analysis results. Each takes frames from `data` and only draws: no figure
here computes a number that `rltrace.analysis` does not already return."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rltrace import _phases
from rltrace._phases import COST_COLUMN
from rltrace.analysis import _format as fmt
from rltrace.ui import style

STAGES = [(COST_COLUMN[s], s) for s in _phases.STAGES]  # (cost-model column, stage), in loop order


def label(text) -> str:
    """Stored text for a plotly label: plotly draws a subset of HTML (`<a href>`, `<b>`, `<br>`) in
    every name, tick and hover text, so `<` and `&` are escaped (and controls shown as escapes)."""
    return html.escape(fmt.shown(text), quote=False)


def _labels(values):
    """`values` (a string, or an array of strings and numbers) with every string through `label`."""
    if isinstance(values, str):
        return label(values)
    if isinstance(values, (list, tuple, np.ndarray, pd.Series, pd.Index)):
        array = np.asarray(values, dtype=object)
        if any(isinstance(v, str) for v in array.flat):
            return np.vectorize(lambda v: label(v) if isinstance(v, str) else v, otypes=[object])(array)
    return values


def inert(fig: go.Figure) -> go.Figure:
    """Every trace name, category, hover text and title of `fig` shown as text, never as markup."""
    for trace in fig.data:
        for key in ("name", "legendgroup", "x", "y", "text", "hovertext", "customdata"):
            value = getattr(trace, key, None)
            if value is not None:
                escaped = _labels(value)
                if escaped is not value:
                    setattr(trace, key, escaped)
    if fig.layout.title.text:
        fig.layout.title.text = label(fig.layout.title.text)
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        if axis.title.text:
            axis.title.text = label(axis.title.text)
        if axis.ticktext is not None:
            axis.ticktext = _labels(axis.ticktext)
    return fig


def base(fig: go.Figure, *, height: int = 320, title: str | None = None, y: str | None = None, x: str | None = None,
         legend_below: bool = False) -> go.Figure:
    """The dashboard's look: white, tight margins, legend on top (or below small charts)."""
    legend = ({"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0, "title": None}
              if legend_below else
              {"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0, "title": None})
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 10, "r": 10, "t": 48 if title else 16, "b": 10},
        title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}} if title else None,
        legend=legend,
        hovermode="closest",
        font={"size": 12},
    )
    fig.update_xaxes(exponentformat="e")  # 2.5e-07, not plotly's SI "250n"
    fig.update_yaxes(exponentformat="e")
    if y:
        fig.update_yaxes(title_text=y)
    if x:
        fig.update_xaxes(title_text=x)
    return inert(fig)


def stage_times(costs: pd.DataFrame, *, height: int = 340) -> go.Figure:
    """Per step: rollout, reward, train, weight sync stacked (t_R + t_T + t_W = t_sync), wall time on top."""
    fig = go.Figure()
    for col, stage in STAGES:
        fig.add_bar(x=costs["step"], y=costs[col], name=stage, marker_color=style.STAGE_COLORS[stage],
                    hovertemplate=f"step %{{x}}<br>{stage}: %{{y:.3g}} s<extra></extra>")
    fig.add_scatter(x=costs["step"], y=costs["wall_s"], name="wall time", mode="lines+markers",
                    line={"color": "#27272a", "width": 2}, marker={"size": 5},
                    hovertemplate="step %{x}<br>wall: %{y:.3g} s<extra></extra>")
    if "async_bound" in costs:
        fig.add_scatter(x=costs["step"], y=costs["async_bound"], name="async bound max(t_R,t_T)+t_W", mode="lines",
                        line={"color": "#71717a", "dash": "dot"},
                        hovertemplate="step %{x}<br>async bound: %{y:.3g} s<extra></extra>")
    fig.update_layout(barmode="stack", bargap=0.15)
    return base(fig, height=height, y="seconds", x="step", legend_below=True)


def waits_by_step(waits: pd.DataFrame, *, height: int = 340) -> go.Figure:
    """Per step: seconds each process spent waiting, stacked by who waited for what."""
    w = waits.assign(who=[fmt.process_name(r, k) for r, k in zip(waits["role"], waits["rank"])])
    w["series"] = w["who"] + " → " + w["waited_for_group"].astype(str)
    grouped = w.groupby(["step", "series"], as_index=False)["seconds"].sum()
    fig = go.Figure()
    order = grouped.groupby("series")["seconds"].sum().sort_values(ascending=False).index
    for i, series in enumerate(order):
        g = grouped[grouped["series"] == series]
        target = series.rsplit(" → ", 1)[-1]
        color = style.STAGE_COLORS.get(target, style.OTHER_COLORS[i % len(style.OTHER_COLORS)])
        fig.add_bar(x=g["step"], y=g["seconds"], name=series, marker_color=color,
                    marker_pattern_shape=["", "/", "x", "."][i // 4 % 4] if i >= 4 else "",
                    hovertemplate=f"step %{{x}}<br>{label(series)}: %{{y:.3g}} s<extra></extra>")
    fig.update_layout(barmode="stack", bargap=0.15, showlegend=True)
    return base(fig, height=height, y="seconds waiting", x="step")


def tail(long_tail: pd.DataFrame, *, height: int = 300) -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=long_tail["step"], y=long_tail["tail_s"], name="tail (last − median finish)",
                marker_color=style.IDLE_COLOR, hovertemplate="step %{x}<br>tail: %{y:.3g} s<extra></extra>")
    fig.add_scatter(x=long_tail["step"], y=long_tail["tail_share"], name="share of step", yaxis="y2",
                    mode="lines+markers", line={"color": "#27272a"},
                    hovertemplate="step %{x}<br>%{y:.0%} of the step<extra></extra>")
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "tickformat": ".0%", "rangemode": "tozero",
                              "showgrid": False, "title": "share of step"})
    return base(fig, height=height, y="seconds", x="step")


def sync_fit(points: pd.DataFrame, fit: dict, *, height: int = 320) -> go.Figure:
    """Weight-sync time against payload, with the fitted t_W = S_W / B_W + t_0."""
    top = float(points["bytes"].max())
    unit, scale = next(((u, f) for u, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if top >= f), ("bytes", 1.0))
    fig = go.Figure()
    for i, (method, g) in enumerate(points.groupby(points["method"].fillna("?"))):
        fig.add_scatter(x=g["bytes"] / scale, y=g["seconds"], mode="markers", name=f"{method} syncs",
                        marker={"size": 8, "color": style.RUN_COLORS[(i + 3) % len(style.RUN_COLORS)], "opacity": 0.8},
                        customdata=g["step"], hovertemplate=f"step %{{customdata}}<br>%{{x:.3g}} {unit} in %{{y:.3g}} s<extra></extra>")
    if fit.get("B_W"):
        xs = np.linspace(0, top * 1.05, 50)
        fig.add_scatter(x=xs / scale, y=xs / fit["B_W"] + (fit["t_0"] or 0.0), mode="lines",
                        name="fit S_W / B_W" + (" + t_0" if fit["t_0"] is not None else ""),
                        line={"color": "#27272a", "dash": "dash"}, hoverinfo="skip")
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return base(fig, height=height, y="seconds", x=f"payload S_W ({unit})")


def whatif_periods(rows: list[dict], recorded_s: float | None, *, height: int = 320) -> go.Figure:
    """Predicted step period per staleness bound K, with the 90 % range of replays, the analytic
    bound beside it and the recorded period as a line."""
    frame = pd.DataFrame(rows)
    lo = frame["predicted_step_s"] - frame["interval_s"].str[0]
    hi = frame["interval_s"].str[1] - frame["predicted_step_s"]
    fig = go.Figure()
    fig.add_scatter(x=frame["staleness"], y=frame["predicted_step_s"], mode="lines+markers", name="replayed",
                    error_y={"type": "data", "array": hi, "arrayminus": lo, "visible": True},
                    line={"color": style.RUN_COLORS[0]},
                    hovertemplate="K = %{x}: %{y:.3g} s a step<extra></extra>")
    fig.add_scatter(x=frame["staleness"], y=frame["analytic_s"], mode="lines+markers", name="analytic bound",
                    line={"color": "#71717a", "dash": "dot"}, hovertemplate="K = %{x}: %{y:.3g} s<extra></extra>")
    if recorded_s:
        fig.add_hline(y=recorded_s, line={"color": "#27272a", "dash": "dash"}, annotation_text="recorded")
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(rangemode="tozero")
    return base(fig, height=height, y="step period (s)", x="staleness bound K (0: synchronous)")


def metric_lines(frames: dict[str, pd.DataFrame], *, title: str, y: str, height: int = 320,
                 band: dict[str, pd.DataFrame] | None = None, log: bool = False) -> go.Figure:
    """One line per run over steps (`frames`: run label -> step, value); optional ± band per run."""
    fig = go.Figure()
    for i, (run, f) in enumerate(frames.items()):
        color = style.RUN_COLORS[i % len(style.RUN_COLORS)]
        if band and run in band and len(band[run]):
            b = f.merge(band[run], on="step", suffixes=("", "_band"))
            fig.add_scatter(x=pd.concat([b["step"], b["step"][::-1]]),
                            y=pd.concat([b["value"] + b["value_band"], (b["value"] - b["value_band"])[::-1]]),
                            fill="toself", fillcolor=color, opacity=0.15, line={"width": 0}, hoverinfo="skip",
                            showlegend=False)
        fig.add_scatter(x=f["step"], y=f["value"], name=run, mode="lines+markers", line={"color": color, "width": 2},
                        marker={"size": 4}, hovertemplate=f"{label(run)}<br>step %{{x}}: %{{y:.4g}}<extra></extra>")
    if log and all((f["value"] > 0).all() for f in frames.values() if len(f)):  # a log axis drops zeros
        fig.update_yaxes(type="log")
    return base(fig, height=height, title=title, y=y, x="step", legend_below=True)


def merge_phases(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The report's phases of A and B on one row per phase: their time per step (`per_step_s`, as
    mean_s_a and mean_s_b) and diff (B − A), for drawing."""
    a, b = (f[["phase", "per_step_s"]].rename(columns={"per_step_s": "mean_s"}) for f in (a, b))
    merged = a.merge(b, on="phase", how="outer", suffixes=("_a", "_b"))
    merged = merged.fillna({"mean_s_a": 0.0, "mean_s_b": 0.0})
    merged["diff"] = merged["mean_s_b"] - merged["mean_s_a"]
    return merged.sort_values(["mean_s_a", "mean_s_b"], ascending=True, ignore_index=True)


def phase_bars(merged: pd.DataFrame, label_a: str, label_b: str, *, height: int = 360) -> go.Figure:
    """Mean seconds per step of each phase, A next to B."""
    fig = go.Figure()
    fig.add_bar(y=merged["phase"], x=merged["mean_s_a"], name=label_a, orientation="h", marker_color="#3b6fb6",
                hovertemplate=f"{label(label_a)}<br>%{{y}}: %{{x:.3g}} s<extra></extra>")
    fig.add_bar(y=merged["phase"], x=merged["mean_s_b"], name=label_b, orientation="h", marker_color="#e0861a",
                hovertemplate=f"{label(label_b)}<br>%{{y}}: %{{x:.3g}} s<extra></extra>")
    fig.update_layout(barmode="group", bargap=0.25)
    return base(fig, height=height, x="seconds per step (mean)")


def diff_bars(merged: pd.DataFrame, label_a: str, label_b: str, *, height: int = 360) -> go.Figure:
    """B − A per phase: red where B is slower, green where it is faster."""
    colors = [style.IDLE_COLOR if d > 0 else "#3f9e4d" for d in merged["diff"]]
    fig = go.Figure(go.Bar(y=merged["phase"], x=merged["diff"], orientation="h", marker_color=colors,
                           hovertemplate="%{y}: %{x:+.3g} s<extra></extra>", showlegend=False))
    fig.add_vline(x=0, line_color="#27272a", line_width=1)
    return base(fig, height=height, x=f"{label_b} − {label_a} (s per step; red = slower)")


MAX_LANES = 8  # utilisation lanes drawn under the Timeline (busiest processes' devices first)


def lane_label(role, rank, kind: str, device) -> str:
    who = fmt.process_name(role, rank)
    return f"{who} CPU" if kind == "cpu" else f"{who} GPU {int(device)}"


def utilisation_lanes(samples: pd.DataFrame, t0_ns: int, x_range: tuple[float, float] | None = None) -> go.Figure:
    """One lane per process CPU and per GPU: utilisation (%) over the same seconds axis as the spans above.

    CPU is the process's CPU time over wall time (100 % = one core); GPU is NVML's busy share.
    """
    from plotly.subplots import make_subplots

    keys = samples.groupby(["process_id", "kind", "device"], dropna=False, sort=False)
    lanes = sorted(keys, key=lambda kv: (kv[0][1] != "gpu", kv[0][0], -1 if pd.isna(kv[0][2]) else kv[0][2]))[:MAX_LANES]
    fig = make_subplots(rows=max(1, len(lanes)), cols=1, shared_xaxes=True, vertical_spacing=0.04)
    for i, ((_, kind, device), g) in enumerate(lanes, start=1):
        label = lane_label(g["role"].iloc[0], g["rank"].iloc[0], kind, device)
        color = "#3f9e4d" if kind == "gpu" else "#3b6fb6"
        x = (g["time_ns"] - g["interval_s"].fillna(0) * 5e8 - t0_ns) / 1e9  # the middle of each sampled interval
        fig.add_scatter(x=x, y=g["util_pct"], mode="lines", fill="tozeroy", name=label, line={"color": color, "width": 1},
                        row=i, col=1, hovertemplate=f"{label}<br>%{{x:.2f}} s: %{{y:.0f}} %<extra></extra>")
        fig.update_yaxes(title_text=label, title_font={"size": 10}, range=[0, max(100.0, float(g["util_pct"].max()))],
                         ticksuffix=" %", row=i, col=1)
    fig.update_xaxes(range=list(x_range) if x_range else None)
    fig.update_xaxes(title_text="seconds from the first span shown", row=max(1, len(lanes)), col=1)
    fig = base(fig, height=70 + 80 * max(1, len(lanes)))
    fig.update_layout(showlegend=False)
    return fig


def icicle(stacks: list[tuple[list[str], int]], *, height: int = 420) -> go.Figure:
    """A profile's icicle (a flame graph, root on top) from its folded stacks: a frame's width is
    the samples with it on the stack at that depth, under its caller."""
    values: dict[tuple[str, ...], int] = {}
    for frames, n in stacks:
        for depth in range(1, len(frames) + 1):
            values[tuple(frames[:depth])] = values.get(tuple(frames[:depth]), 0) + n
    total = sum(n for _, n in stacks)
    ids = ["all", *(";".join(path) for path in values)]
    parents = ["", *(";".join(path[:-1]) or "all" for path in values)]
    labels = [f"all ({total} samples)", *(label(path[-1]) for path in values)]
    fig = go.Figure(go.Icicle(ids=ids, parents=parents, labels=labels, values=[total, *values.values()],
                              branchvalues="total", tiling={"orientation": "v"}, sort=False, maxdepth=-1,
                              hovertemplate="%{label}<br>%{value} samples, %{percentRoot:.0%} of the phase<extra></extra>"))
    fig.update_layout(margin={"l": 0, "r": 0, "t": 10, "b": 0}, height=height)
    return fig
