"""Every query the dashboard makes, cached per run version (see `runs.RunRef`).

Every figure a page shows comes from one place: `report()`, the dict `rltrace report --json`
prints, built once per run version and step range; `table()` turns one of its sections into a
frame. No page computes a figure again, so a page and `rltrace report` cannot disagree. The rest
are records and drill-downs (run info, the spans and critical path of the steps on screen, a
span's attributes, per-sample rows, frozen batches, profiles), read with parameters. Pages call
these functions and never write SQL.

Each function takes a `RunRef` (path + file fingerprint) first, so a new version of a live run
is a new cache key; `ttl` and `max_entries` bound what a long-running server keeps.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import duckdb
import numpy as np
import pandas as pd
import streamlit as st

from rltrace import analysis, profiling, replay, report as report_mod
from rltrace._config import resolve
from rltrace.analysis import serving as serving_mod
from rltrace._json import dumps as strict_dumps
from rltrace.analysis import health
from rltrace.analysis import whatif as whatif_model
from rltrace.analysis._steps import Steps
from rltrace.export import chrome
from rltrace.replay import browse, diff, rerun
from rltrace.store import read_manifest, skipping_damaged
from rltrace.ui.runs import RunRef, connection, forget, skip_corrupt

CACHE = {"ttl": 3600, "max_entries": 512, "show_spinner": False}
TIMELINE_MAX_STEPS = 20  # steps one timeline may cover
TOKEN_COLUMNS = ("response_tokens", "rollout_log_probs", "train_log_probs", "loss_mask")  # drawn per token
LIVE_HEARTBEAT_S = 120  # a process that wrote this recently and has not shut down makes the run live


def _with(run: RunRef, fn: Callable, *args, **kwargs):
    """`fn(con, ...)` on the run's connection; once more on a fresh snapshot if parts vanished.
    Parts whose data is damaged are named (`CorruptPartError`), or left out with --skip-corrupt."""

    def read():
        try:
            with connection(run) as con:
                return fn(con, *args, **kwargs)
        except duckdb.IOException:
            return fresh()  # a compaction removed parts this snapshot listed

    def fresh():
        forget(run)
        with connection(run) as con:
            return fn(con, *args, **kwargs)

    return skipping_damaged(run.path, skip_corrupt(), read, fresh)


def _views(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def _count(con, view: str) -> int:
    return int(con.execute(f"SELECT count(*) FROM {view}").fetchall()[0][0]) if view in _views(con) else 0


# --- the run itself ------------------------------------------------------------------------------
def _info(con, path: str) -> dict:
    first, last, steps, spans, still_open = con.execute(
        """SELECT min(step), max(step), count(DISTINCT step), count(*) FILTER (WHERE NOT is_open),
                  count(*) FILTER (WHERE is_open) FROM spans"""
    ).fetchall()[0]
    procs = health.process_states(con, analysis.processes(con))
    manifest = read_manifest(path)
    return {
        "path": path,
        "name": manifest.get("name") or path,
        "run_id": manifest.get("run_id"),
        "created": manifest.get("created"),
        "config": manifest.get("config") or {},
        "first_step": None if first is None else int(first),
        "last_step": None if last is None else int(last),
        "steps": int(steps),
        "spans": int(spans),
        "open_spans": int(still_open),
        "processes": procs,
        "samples": _count(con, "samples"),
        "batches": _count(con, "batches"),
        "profiles": _count(con, "profiles"),
    }


@st.cache_data(**CACHE)
def info(run: RunRef) -> dict:
    """Name, id, step range, span counts, processes (with heartbeats) and optional tables' sizes."""
    return _with(run, _info, run.path)


def _scalars(con) -> pd.DataFrame:
    return con.execute("""SELECT step, name, avg(value) AS value FROM metrics
                          WHERE value IS NOT NULL AND NOT isnan(value) GROUP BY step, name ORDER BY name, step""").df()


@st.cache_data(**CACHE)
def scalars(run: RunRef) -> pd.DataFrame:
    """Every `log_metrics` value of the run by the name it was logged under: step, name, value
    (the mean when several processes logged one name at one step)."""
    return _with(run, _scalars)


def process_states_now(info_: dict, now_ns: int) -> list[str]:
    """Each process's state (as `rltrace info` says it) as of `now_ns`: a cached record's running
    process may have been killed since."""
    p = info_["processes"]
    return [health.state_now(s, h, now_ns) for s, h in zip(p["state"], p["heartbeat_ns"])]


def is_live(info_: dict, now_ns: int) -> bool:
    """Some process has not shut down and wrote within LIVE_HEARTBEAT_S."""
    p = info_["processes"]
    if p.empty:
        return False
    running = p[p["ended_ns"].isna() & p["heartbeat_ns"].notna()]
    return bool(len(running) and (now_ns - running["heartbeat_ns"].max()) / 1e9 < LIVE_HEARTBEAT_S)


SERVING_OPTIONS = ("model", "kv_dtype", "ssm_dtype", "kv_bandwidth", "engine")  # `rltrace report`'s serving options


def serving_given() -> dict:
    """The serving options `rltrace ui` was given (`--model`, `--kv-bandwidth`, ...; none set: {})."""
    given = resolve("ui_serving") or {}
    return {k: given.get(k) for k in SERVING_OPTIONS if given.get(k) is not None}


def report(run: RunRef, steps: Steps, serving: str | None = None) -> dict:
    """`rltrace report --json` for these steps (findings, cost model, waits, health, ...).
    `serving`: the serving options as JSON text, None for those `rltrace ui` was given. A bad
    option raises `RltraceConfigError` / `DtypeError` naming it."""
    return _report_of(run, steps, json.dumps(serving_given(), sort_keys=True) if serving is None else serving)


@st.cache_data(**CACHE)
def _report_of(run: RunRef, steps: Steps, serving: str) -> dict:  # the options are part of the cache key
    return report_mod.plain(_with(run, _report, steps, json.loads(serving)))


def _report(con, steps: Steps, options: dict) -> dict:
    return _serving_set(con, options, lambda c: report_mod.build(c, steps=steps))


def _serving_set(con, options: dict, fn: Callable, *args):
    """`fn(con, *args)` with the serving options set on the run's connection (`serving.configure`), cleared
    after: the connection is shared, so the next reader starts without them."""
    serving_mod.configure(con, **{k: options.get(k) for k in SERVING_OPTIONS})
    try:
        return fn(con, *args)
    finally:
        serving_mod.configure(con)


def kind_text(record: dict) -> str:
    """What a figure rests on, in the report's words (`report.evidence.text`): `measured`,
    `imported (perf/rollout_time)`, `derived: t_R + t_T + t_W`, `not recorded (no reward span)`."""
    from rltrace.report import evidence

    return evidence.text(record)


def open_text(span: dict) -> str:
    """How long an open span was open, in the words of the report and `rltrace info` (`health.open_text`)."""
    return health.open_text(span)


def open_spans_now(report_: dict, now_ns: int) -> list[dict]:
    """The report's open spans with `in_progress` as of `now_ns`: a cached report's process may have
    been killed since, and a killed process writes nothing that would make the report again."""
    return [{**o, "in_progress": health.in_progress_now(o, now_ns)} for o in report_["open_spans"]]


def compare(this: dict, other: dict) -> pd.DataFrame:
    """Rows of `rltrace report --compare`: what, unit, this, other, ratio."""
    return pd.DataFrame(report_mod.compare(this, other), columns=["what", "unit", "this", "other", "ratio"])


def table(report_: dict, key: str, columns: list[str] | None = None) -> pd.DataFrame:
    """A list section of a report (`report["steps"]`, `report["waits"]`, ...) as a frame; with
    `columns`, an empty section still has them."""
    frame = pd.DataFrame(report_.get(key) or [])
    if columns is not None:
        for column in columns:
            if column not in frame:
                frame[column] = pd.Series(dtype=object)
    return frame


PARTIAL_OVERSAMPLE = whatif_model.PARTIAL_OVERSAMPLE  # the page's default for --partial


@st.cache_data(**CACHE)
def whatif_calibration(run: RunRef, steps: Steps, serving: str = "{}") -> whatif_model.Calibration:
    """What `rltrace whatif` replays for these steps, read once per run version, step range and
    serving options (JSON text: `rltrace ui --model`, `--kv-bandwidth`, ..., what a split needs)."""
    return _with(run, _calibrate, steps, json.loads(serving))


def _calibrate(con, steps: Steps, options: dict) -> whatif_model.Calibration:
    return _serving_set(con, options, whatif_model.calibrate, steps)


@st.cache_data(**CACHE)
def whatif(run: RunRef, steps: Steps, scenarios: tuple[tuple, ...]) -> list[dict]:
    """`rltrace whatif --json`'s rows for these steps: the run replayed as recorded, then one row per
    scenario, each `(staleness, rollout_workers, partial, placement, sync_s[, pd, kv_bandwidth])`
    (None: as recorded; pd: (prefill engines, decode engines)). Raises `whatif.Refused` with the
    reason when the run cannot predict a scenario (a split without request spans, model config or
    KV bandwidth), as `rltrace whatif` does."""
    asked = [analysis.WhatIf(*s) for s in scenarios]
    cal = whatif_calibration(run, steps, json.dumps(serving_given(), sort_keys=True))
    return report_mod.plain(whatif_model.table(cal, asked))


# --- drill-downs: one step's detail, per-sample rows ---------------------------------------------
@st.cache_data(**CACHE)
def critical_path(run: RunRef, steps: Steps) -> pd.DataFrame:
    """The spans on each step's critical path (to draw on the timeline)."""
    return _with(run, analysis.critical_path, steps)


@st.cache_data(**CACHE)
def batch_mismatch(run: RunRef, steps: Steps) -> pd.DataFrame:
    """Per-sample mismatch of frozen batches holding both engines' log-probs."""
    return _with(run, analysis.batch_mismatch, steps)


def _samples(con, first: int, last: int, limit: int) -> pd.DataFrame:
    return con.execute(
        "SELECT * FROM samples WHERE step BETWEEN ? AND ? ORDER BY step DESC, sample_id LIMIT ?",
        [first, last, limit],
    ).df()


@st.cache_data(**CACHE)
def samples(run: RunRef, first: int, last: int, limit: int) -> pd.DataFrame:
    """Per-sample rows of steps first..last (latest steps first, at most `limit`)."""
    return _with(run, _samples, first, last, limit)


# --- timeline ------------------------------------------------------------------------------------
def _timeline(con, first: int, last: int) -> pd.DataFrame:
    frames = [analysis.step_timeline(con, s).assign(step=s) for s in range(first, last + 1)]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else analysis.step_timeline(con, first).assign(step=first)


@st.cache_data(**CACHE)
def timeline(run: RunRef, first: int, last: int) -> pd.DataFrame:
    """Every span (finished and open) of steps first..last (at most TIMELINE_MAX_STEPS steps)."""
    last = min(last, first + TIMELINE_MAX_STEPS - 1)
    return _with(run, _timeline, first, last)


@st.cache_data(**CACHE)
def sample_timeline(run: RunRef, first: int, last: int) -> pd.DataFrame:
    """Spans of steps first..last that belong to a sample, with its lane facts (`analysis.sample_timeline`)."""
    last = min(last, first + TIMELINE_MAX_STEPS - 1)
    return _with(run, analysis.sample_timeline, first, last)


def _span(con, span_id: str) -> dict | None:
    found = con.execute(
        """SELECT trace_hex(trace_id) AS trace_id, span_hex(span_id) AS span_id, span_hex(parent_span_id) AS parent_span_id,
                  name, coalesce(phase, name) AS phase, step, weight_version,
                  start_ns, end_ns, duration_s, is_open, status, status_message, kind, thread_id, thread_name,
                  process_id, role, rank, host, pid, attributes, events, links
           FROM _spans WHERE span_id = span_int(?) LIMIT 1""",  # stored ids: the filter reads one int column
        [span_id],
    ).df()
    if found.empty:
        return None
    row = found.iloc[0].to_dict()
    for key in ("attributes", "events", "links"):
        row[key] = _json(row[key])
    row["profiles"] = analysis.attached(con, [span_id])
    return row


def _json(text: Any) -> Any:
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


@st.cache_data(**CACHE)
def span(run: RunRef, span_id: str) -> dict | None:
    """One span with its attributes, events and links parsed, and the profiles attached to it."""
    return _with(run, _span, span_id)


def chrome_trace(run: RunRef, steps: Steps) -> bytes:
    """The Chrome Trace Event JSON of these steps (open it in ui.perfetto.dev); built on demand."""
    trace = _with(run, chrome.chrome_trace, steps=steps)
    return strict_dumps(trace, separators=(",", ":")).encode()


# --- profiles ------------------------------------------------------------------------------------
@st.cache_data(**CACHE)
def profiles(run: RunRef) -> pd.DataFrame:
    """Every profile with the span it explains and its hottest frame (`rltrace profile list`)."""
    return _with(run, profiling.profiles_for_spans)


@st.cache_data(**CACHE)
def profile_frames(run: RunRef, profile_id: str) -> pd.DataFrame:
    """The stored top frames of one profile, by rank (0 = most self time)."""
    return pd.DataFrame(_with(run, profiling.top_frames, profile_id),
                        columns=["profile_id", "rank", "frame", "file", "line", "self_share", "total_share", "samples", "thread"])


@st.cache_data(**CACHE)
def profile_stacks(run: RunRef, profile_id: str) -> list[tuple[list[str], int]]:
    """The clipped stacks stored with one py-spy recording (its flame graph), most sampled first."""
    return _with(run, profiling.profile_stacks, profile_id)


def artefact(run: RunRef, stored: str | None):
    """The profile file `stored` names, only if it resolves to a file inside the run dir.

    Returns the path, or None when there is no file; raises `profiling.UnsafePathError` when the
    stored path leaves the run dir (`..`, an absolute path, a symlink out).
    """
    path = profiling.artefact_path(run.path, stored)
    return path if path is not None and path.is_file() else None


# --- frozen batches and replays (rltrace.replay) -------------------------------------------------
@st.cache_data(**CACHE)
def batches(run: RunRef) -> pd.DataFrame:
    """Every frozen batch (`rltrace replay list`): step, batch_id, n_samples, trigger, reason, ...; and
    where its worst sample stands in the run (`replay show --step all --sort reward_outlier`):
    `worst_rank` (0: it holds the run's worst sample; None: no reward in the run) and `worst_sample`."""
    rows, _ = browse.list_batches(run.path, rewards=True)
    worst: dict[tuple, tuple[int, int]] = {}
    ranked = browse.reward_ranking(rows)
    if any(v["reward"] is not None for v in ranked):
        for rank, v in enumerate(ranked):
            worst.setdefault((v["step"], v["batch_id"]), (rank, v["sample_index"]))
    table = pd.DataFrame(rows, columns=["step", "batch_id", "n_samples", "frozen_ns", "trigger", "reason", "train_version",
                                        "tokenizer_name", "checkpoint", "path", "bytes", "replays"])
    found = [worst.get((r.get("step"), r.get("batch_id"))) for r in rows]
    return table.assign(worst_rank=pd.array([f and f[0] for f in found], dtype="Int64"),
                        worst_sample=pd.array([f and f[1] for f in found], dtype="Int64"))


def _tokens(value) -> list | None:
    return None if value is None else np.asarray(value).reshape(-1).tolist()


@st.cache_data(**CACHE)
def batch(run: RunRef, step: int, batch_id: str) -> dict:
    """One frozen batch as plain data (`rltrace replay show --sort reward_outlier`): meta, one row per
    sample with its flags (reward outliers first, the farthest first), and per-token arrays (response_tokens, rollout/train log-probs, loss_mask) by sample."""
    frozen = replay.load(run.path, step, batch_id=batch_id)
    views = browse.by_reward_outlier(browse.sample_views(frozen))  # the worst reward outlier first
    per_token = {name: [_tokens(v) for v in diff.rows_of(frozen[name], len(frozen))]
                 for name in TOKEN_COLUMNS if name in frozen}
    rows = pd.DataFrame([{k: v for k, v in view.items() if k != "response_tokens"} for view in views])
    rows["flag_names"] = [", ".join(v["flags"]) for v in views]
    meta = {k: v for k, v in frozen.meta.items() if k not in ("config",)}
    return {"meta": meta, "samples": rows, "tokens": per_token, "columns": frozen.columns}


@st.cache_data(**CACHE)
def replays(run: RunRef, step: int, batch_id: str) -> list[dict]:
    """Each replay of the batch (`rltrace replay diff`): label, entry, repeats, durations, repeatability,
    the recorded-vs-replayed diffs of its first repeat, and its per-token log-probs by sample."""
    found = [r for r in rerun.load_replays(run.path, step=step) if r.batch_id == batch_id]
    if not found:
        return []
    frozen = replay.load(run.path, step, batch_id=batch_id)  # checks every batch part's footer: only when needed
    out = []
    for replay_id in dict.fromkeys(r.replay_id for r in found):
        repeats = [r for r in found if r.replay_id == replay_id]
        first = repeats[0]
        out.append({
            "replay_id": replay_id, "label": first.label, "entry": first.entry, "repeats": len(repeats),
            "durations_s": [r.duration_s for r in repeats], "repeatable": diff.repeatability(repeats),
            "diffs": [d.to_dict() for d in diff.diff_against_record(frozen, first)],
            "log_probs": [_tokens(v) for v in diff.rows_of(first["log_probs"], len(first))] if "log_probs" in first else None,
        })
    return out


@st.cache_data(**CACHE)
def resource_samples(run: RunRef, start_ns: int, end_ns: int) -> pd.DataFrame:
    """CPU and GPU utilisation samples (`init(resources=True)`) over a time window, for the Timeline's lanes."""
    return _with(run, analysis.resource_samples, start_ns, end_ns)


def _alerts(con) -> pd.DataFrame:
    from rltrace.alerts import evaluate

    cols = ["when", "rule", "role", "rank", "phase", "step", "seconds", "message", "profile_id"]
    now = pd.DataFrame([{**a.__dict__, "when": "now"} for a in evaluate(con)], columns=[*cols, "key"])
    stored = con.execute(
        """SELECT 'raised by rltrace watch' AS "when", rule, role, rank, phase, step, seconds, message, profile_id, key
           FROM alerts ORDER BY time_ns DESC"""
    ).df()
    both = pd.concat([now, stored[~stored["key"].isin(set(now["key"]))]], ignore_index=True)
    return both[cols]


@st.cache_data(**CACHE)
def alerts(run: RunRef) -> pd.DataFrame:
    """`rltrace watch`'s rules evaluated now (default limits; nothing is written) and the alerts it stored."""
    return _with(run, _alerts)
