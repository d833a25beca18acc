"""Rich tables and panels for `rltrace replay` (data comes from rltrace.replay; nothing is computed here)."""

from __future__ import annotations

import datetime as dt

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rltrace.analysis._format import HIDDEN, seconds_text, shown, size_text, term

_SHORT = {"repetition": "REP", "invalid_text": "BAD", "truncated": "TRUNC", "template_leak": "TMPL", "prompt_template": "PROMPT", "empty": "EMPTY", "reward_outlier": "OUTL"}
FLAG_NAMES = tuple(_SHORT)  # what `replay show --sort` takes as a flag


def visible(text: str | None) -> Text:
    """Text with control, private-use and replacement characters shown as escapes (in red)."""
    out = Text()
    if text is None:
        return Text("(not stored; pass --tokenizer to decode tokens)", style="dim")
    pos = 0
    for m in HIDDEN.finditer(text):
        out.append(text[pos : m.start()])
        out.append(m.group().encode("unicode_escape", "backslashreplace").decode(), style="bold red")
        pos = m.end()
    out.append(text[pos:])
    return out


def _num(value, fmt: str = ".4g") -> str:
    if isinstance(value, str):  # ids may be text (verl's UUIDs)
        return value
    return "-" if value is None else format(value, fmt)


WIDE = 140  # columns from which `replay list` also shows the tokenizer and when each batch was frozen


def batches(console: Console, run_dir: str, rows: list[dict], skipped: list[str]) -> None:
    if not rows:
        console.print(term(f"no frozen batches in {run_dir} (freeze with rltrace.replay.freeze or a Freezer)"))
    t = Table(title=term(f"Frozen batches in {run_dir}"), title_justify="left")
    wide = console.width >= WIDE  # narrower (an 80-column terminal): each batch's reason on a line below the table
    for col in ("step", "batch", "samples", "v_t", "trigger", "size", "replays", *(("tokenizer", "frozen", "reason")
                                                                                  if wide else ())):
        t.add_column(col, justify="right" if col in ("step", "samples", "v_t", "size", "replays") else "left",
                     no_wrap=col != "reason")
    for r in rows:
        frozen = dt.datetime.fromtimestamp(r["frozen_ns"] / 1e9).strftime("%Y-%m-%d %H:%M:%S") if r.get("frozen_ns") else "-"
        t.add_row(
            str(r.get("step")), term(r.get("batch_id") or "-"), str(r.get("n_samples")),
            _num(r.get("train_version"), "d"), term(r.get("trigger") or "-"), size_text(r["bytes"]), str(r["replays"]),
            *((term(r.get("tokenizer_name") or "-"), frozen, term((r.get("reason") or "")[:60])) if wide else ()),
        )
    if rows:
        console.print(t)
    if rows and not wide:
        for r in rows:
            if r.get("reason"):
                console.print(f"  step {r.get('step')}: {term((r.get('reason') or '')[:200])}")
    for s in skipped:
        console.print(f"[yellow]unreadable part skipped:[/] {term(s)}")


def samples(console: Console, batch, views: list[dict]) -> None:
    counts: dict[str, int] = {}
    for v in views:
        for name in v["flags"]:
            counts[name] = counts.get(name, 0) + 1
    t = Table(title=term(f"step {batch.step} · batch {batch.batch_id} · {len(batch)} samples"), title_justify="left")
    for col in ("#", "id", "group", "v_s", "reward", "finish", "resp len", "flags", "response"):
        t.add_column(col, justify="right" if col in ("#", "id", "group", "v_s", "reward", "resp len") else "left", overflow="fold")
    for v in views:
        text = (v["response_text"] or "")[:60].replace("\n", "⏎")
        t.add_row(
            str(v["sample_index"]), _num(v["sample_id"], "d"), _num(v["group_id"], "d"), _num(v["weight_version"], "d"),
            _num(v["reward"]), term(v["finish_reason"] or "-"), _num(v["response_len"], "d"),
            Text(" ".join(_SHORT[f] for f in v["flags"]), style="bold red"), visible(text),
        )
    console.print(t)
    summary = ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"
    console.print(f"flags: {summary}   (rltrace replay show RUN_DIR --step {batch.step} --sample I for one in full)")


def samples_of_every_batch(console: Console, views: list[dict]) -> None:
    """`show --step all`: one table over every frozen batch, in the order given (`--sort`)."""
    t = Table(title=f"{len(views)} samples of every frozen batch", title_justify="left")
    for col in ("step", "#", "id", "reward", "finish", "resp len", "flags", "response"):
        t.add_column(col, justify="right" if col in ("step", "#", "id", "reward", "resp len") else "left", overflow="fold")
    for v in views:
        text = (v["response_text"] or "")[:60].replace("\n", "⏎")
        t.add_row(str(v["step"]), str(v["sample_index"]), _num(v["sample_id"], "d"), _num(v["reward"]),
                  term(v["finish_reason"] or "-"), _num(v["response_len"], "d"),
                  Text(" ".join(_SHORT[f] for f in v["flags"]), style="bold red"), visible(text))
    console.print(t)
    console.print("one in full: rltrace replay show RUN_DIR --step N --sample I")


def sample(console: Console, batch, v: dict) -> None:
    head = (
        f"step {batch.step} · sample {v['sample_index']} · id {_num(v['sample_id'], 'd')} · group {_num(v['group_id'], 'd')} · "
        f"v_s {_num(v['weight_version'], 'd')} · v_t {_num(batch.meta.get('train_version'), 'd')} · reward {_num(v['reward'])} · "
        f"finish {v['finish_reason'] or '-'} · prompt {_num(v['prompt_len'], 'd')} / response {_num(v['response_len'], 'd')} tokens"
    )
    console.print(term(head))
    for name, why in v["flags"].items():
        console.print(Text(f"  ! {shown(name)}: {shown(why)}", style="bold red"))
    if not v["flags"]:
        console.print(Text("  no flags", style="green"))
    console.print(Panel(visible(v["prompt_text"]), title="prompt", title_align="left"))
    decoded = v.get("text_from") == "tokens"
    title = "response (decoded from its tokens, special tokens shown)" if decoded else "response"
    console.print(Panel(visible(v["response_text"]), title=title, title_align="left"))
    if v.get("stored_response_text") is not None:
        console.print(Panel(visible(v["stored_response_text"]), title="response as stored (the framework's decode)",
                            title_align="left"))


def diffs(console: Console, title: str, items) -> None:
    if not items:
        console.print(f"{title}: no columns to compare (the entry's result names match no recorded column; use --pair)")
        return
    t = Table(title=term(title), title_justify="left")
    for col in ("a", "b", "samples", "values", "bitwise", "differ", "mean |b-a|", "max |b-a|", "k3", "aligned (<1e-6)"):
        t.add_column(col, justify="left" if col in ("a", "b", "bitwise", "aligned (<1e-6)") else "right")
    for d in items:
        t.add_row(
            term(d.a), term(d.b), str(d.samples), str(d.tokens), "yes" if d.bitwise_equal else "[red]no[/]",
            str(d.samples_different), f"{d.mean_abs:.3g}", f"{d.max_abs:.3g}", _num(d.k3, ".3g"),
            "yes" if d.aligned else "[red]no[/]",
        )
    console.print(t)
    for d in items:
        if d.length_mismatch:
            console.print(f"[red]{term(d.b)}: lengths differ from {term(d.a)} in {len(d.length_mismatch)} sample(s), e.g. {d.length_mismatch[:5]}[/]")
        if d.nan_mismatch:
            console.print(f"[red]{term(d.b)}: {d.nan_mismatch} value(s) NaN on one side only[/]")
        for s in d.top_samples:
            extra = f" a {s['a']:.6g} -> b {s['b']:.6g}" if "a" in s else f" mean {s['mean_abs']:.3g}"
            console.print(f"  {term(d.b)} sample {s['sample_index']}: max |diff| {s['max_abs']:.3g}{extra}")
        for tok in d.top_tokens:
            console.print(
                f"  {term(d.b)} sample {tok['sample_index']} token {tok['position']} (id {tok['token_id']}): "
                f"{tok['a']:.6g} vs {tok['b']:.6g} (|diff| {tok['abs_diff']:.3g})"
            )


def _repeatable(side: dict) -> str:
    rep = side["repeatable"]
    if rep is None:
        return f"{term(side['label'])}: repeatability not tested (1 run; use --repeat 2)"
    bad = [c for c, ok in rep.items() if not ok]
    verdict = "yes, bitwise" if not bad else f"[red]no[/] ({term(', '.join(bad))} differ between runs)"
    return f"{term(side['label'])}: repeatable over {side['repeats']} runs: {verdict}"


def replay_run(console: Console, result, repeatable: dict | None, items) -> None:
    console.print(f"replay {term(result.replay_id)} of {term(result.entry)} · {len(result.repeats)} run(s) · "
                  + ", ".join(seconds_text(r.duration_s) for r in result.repeats))
    console.print(_repeatable({"label": result.label, "repeats": len(result.repeats), "repeatable": repeatable}))
    diffs(console, "recorded (a) vs replayed (b)", items)


def comparison(console: Console, report: dict) -> None:
    a, b = report["a"], report["b"]
    console.print(_repeatable(a))
    console.print(_repeatable(b))
    items = report["diffs"]
    aligned = bool(items) and all(d.bitwise_equal for d in items)
    within = bool(items) and all(d.aligned for d in items)
    console.print(
        f"aligned ({term(a['label'])} vs {term(b['label'])}): "
        + ("yes, bitwise" if aligned else "within the 1e-6 gate, not bitwise" if within else "[red]no[/]")
    )
    console.print("[dim]repeatable is not aligned: each side repeating itself says nothing about the two agreeing[/]")
    diffs(console, f"{a['label']} (a) vs {b['label']} (b)", items)


def decomposition(console: Console, batch, v_t: int, versions: list[int], r) -> None:
    console.print(f"step {batch.step}: {r.samples} samples, {r.tokens} masked response tokens, v_t={v_t}, versions {versions}")
    t = Table(title=term("log p_vt - log q_vs = staleness [log p_vt - log p_vs] + engine gap [log p_vs - log q_vs]"), title_justify="left")
    for col in ("term", "mean |.|", "mean", "share"):
        t.add_column(col, justify="left" if col == "term" else "right")
    t.add_row("total (train_rollout_logprob_abs_diff)", f"{r.mean_abs_total:.4g}", f"{r.mean_staleness + r.mean_engine:.4g}", "")
    t.add_row("parameter staleness", f"{r.mean_abs_staleness:.4g}", f"{r.mean_staleness:.4g}", f"{r.share_staleness:.1%}")
    t.add_row("engine gap", f"{r.mean_abs_engine:.4g}", f"{r.mean_engine:.4g}", f"{r.share_engine:.1%}")
    console.print(t)
    ages = Table(title="by age d = v_t - v_s", title_justify="left")
    for col in ("d", "samples", "tokens", "mean |staleness|", "mean |engine|"):
        ages.add_column(col, justify="right")
    for a in r.by_age:
        ages.add_row(str(a["age"]), str(a["samples"]), str(a["tokens"]), f"{a['mean_abs_staleness']:.4g}", f"{a['mean_abs_engine']:.4g}")
    console.print(ages)
