"""`rltrace replay ...`: list, show, rerun, diff and compare frozen batches (docs/replay.md).

    rltrace replay list RUN_DIR
    rltrace replay show RUN_DIR --step N [--sample I] [--flagged] [--tokenizer module:name]
    rltrace replay run RUN_DIR --step N --entry module:function [--repeat 2] [--arg key=value]
    rltrace replay diff RUN_DIR --step N [--replay ID] [--against ID] [--pair replayed=recorded] [--recorded A B]
    rltrace replay compare RUN_DIR --step N --entry A --entry B [--repeat 2]   (or --replay ID --replay ID)
    rltrace replay decompose RUN_DIR --step N --entry module:function   (staleness vs engine gap)
    rltrace replay request RUN_DIR [--reason TEXT]   (a running Freezer freezes its next step)
"""

from __future__ import annotations

import argparse
import json

from rich.progress import Progress

from rltrace.cli._console import Console
from rltrace import _json
from rltrace._config import RltraceError
from rltrace.cli import _options
from rltrace.cli import replay_render as render
from rltrace.analysis._format import term


def _kv(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _pair(text: str) -> tuple[str, str]:
    replayed, sep, recorded = text.partition("=")
    if not sep or not replayed or not recorded:
        raise argparse.ArgumentTypeError(f"expected REPLAYED=RECORDED column names, got {text!r}")
    return replayed, recorded


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="debug replay: list, show, rerun, diff and compare frozen batches")
    actions = p.add_subparsers(dest="replay_action", metavar="ACTION", required=True)

    def action(name: str, help: str, func) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help)
        a.add_argument("run_dir", metavar="RUN_DIR")
        a.set_defaults(func=_object_store_copy(name, func))
        return a

    def step_args(a: argparse.ArgumentParser, every: str = "") -> None:
        if every:
            a.add_argument("--step", type=_step_or_all, required=True, help=f"step of the frozen batch, or `all`: {every}")
        else:
            a.add_argument("--step", type=int, required=True, help="step of the frozen batch")
        a.add_argument("--batch", default=None, help="batch id, when several were frozen at that step (default: latest)")
        a.add_argument("--tokenizer", default=None, metavar="MODULE:NAME", help="tokenizer to decode tokens; its vocabulary hash must match the batch's")
        a.add_argument("--json", action="store_true", help="print machine-readable JSON")

    a = action("list", "frozen batches of a run: step, samples, trigger, reason, replays", _list)
    a.add_argument("--json", action="store_true", help="print machine-readable JSON")
    _options.skip_corrupt(a)
    a = action("show", "samples of a frozen batch with bad-text flags; one sample in full with --sample", _show)
    step_args(a, "the samples of every frozen batch in one table")
    a.add_argument("--sample", type=int, default=None, help="show this sample (0-based position in the batch) in full")
    a.add_argument("--flagged", action="store_true", help="list only flagged samples")
    a.add_argument("--sort", default=None, metavar="FLAG|COLUMN",
                   help="flagged with FLAG first (e.g. reward_outlier), or by COLUMN, largest first (e.g. reward, response_len)")
    a = action("run", "rerun a frozen batch through an entry point and diff against the record", _run)
    step_args(a, "every frozen batch, one after another")
    a.add_argument("--entry", required=True, metavar="MODULE:FUNCTION", help="function(batch, **args) -> dict of per-sample results")
    a.add_argument("--repeat", type=int, default=1, help="run it this many times and check the results are bitwise identical")
    a.add_argument("--arg", type=_kv, action="append", default=[], metavar="KEY=VALUE", help="keyword argument for the entry (JSON or text)")
    a.add_argument("--label", default=None, help="name for this replay (default: the entry)")
    a = action("diff", "compare a stored replay with the recorded batch, or with another replay", _diff)
    step_args(a)
    a.add_argument("--replay", default=None, help="replay id (default: the latest replay of the step)")
    a.add_argument("--against", default=None, help="another replay id: compare the two replays instead of the record")
    a.add_argument("--pair", type=_pair, action="append", default=[], metavar="REPLAYED=RECORDED", help="columns to compare")
    a.add_argument("--recorded", nargs=2, action="append", default=[], metavar=("A", "B"),
                   help="compare two recorded columns of the batch instead (b - a), e.g. rollout_log_probs train_log_probs")
    a = action("compare", "alignment of two entry points on one batch (plus repeatability of each)", _compare)
    step_args(a)
    a.add_argument("--entry", action="append", default=[], metavar="MODULE:FUNCTION", help="give twice: A and B")
    a.add_argument("--replay", action="append", default=[], help="or compare two stored replays (give twice)")
    a.add_argument("--repeat", type=int, default=2, help="repeats per entry, to test repeatability (default 2)")
    a.add_argument("--arg", type=_kv, action="append", default=[], metavar="KEY=VALUE", help="keyword argument for both entries")
    a = action("decompose", "split mismatch into parameter staleness and engine gap", _decompose)
    step_args(a)
    a.add_argument("--entry", required=True, metavar="MODULE:FUNCTION", help="function(batch, weight_version=v, **args) -> {'log_probs': ...}")
    a.add_argument("--arg", type=_kv, action="append", default=[], metavar="KEY=VALUE", help="extra keyword argument for the entry")
    a = action("request", "ask a running loop's Freezer to freeze its next step", _request)
    a.add_argument("--reason", default=None, help="why (stored as the batch's reason)")


_READ_ONLY = ("list", "show", "diff")


def _step_or_all(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a step is a whole number or `all`, got {text!r}") from None


def _every_batch(args) -> list[tuple[int, str]]:
    """(step, batch id) of every frozen batch of the run, oldest first (`--step all`)."""
    from rltrace.replay.browse import list_batches

    rows, _ = list_batches(args.run_dir)
    return [(int(r["step"]), r["batch_id"]) for r in rows if r.get("step") is not None]


def _sort_views(views: list[dict], key: str | None) -> list[dict]:
    """`--sort`: samples flagged `key` first, or by the column `key`, largest first (missing last)."""
    if not key or not views:
        return views
    if key == "reward_outlier":  # flagged first, the farthest from its batch's median reward first
        from rltrace.replay.browse import by_reward_outlier

        return by_reward_outlier(views)
    if key in render.FLAG_NAMES:
        return sorted(views, key=lambda v: key not in (v.get("flags") or {}))
    if key not in views[0]:
        columns = [k for k, v in views[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        raise RltraceError(f"--sort {key!r} is neither a flag ({', '.join(render.FLAG_NAMES)}) "
                         f"nor a column ({', '.join(columns)})")
    return sorted(views, key=lambda v: (not isinstance(v.get(key), (int, float)), -(v.get(key) or 0)
                                        if isinstance(v.get(key), (int, float)) else 0))


def _object_store_copy(name: str, func):
    """For an `s3://` run, read actions work on the local copy of its parts; the others store
    replays or requests into the run and need it on disk."""

    def wrapped(args) -> int:
        from rltrace.store import objstore

        if objstore.is_uri(args.run_dir):
            if name not in _READ_ONLY:
                raise RltraceError(f"rltrace replay {name} works on run directories on disk; for {args.run_dir} "
                                   f"use {', '.join(_READ_ONLY)}")
            args.run_dir = str(objstore.mirror(args.run_dir))
        return func(args)

    return wrapped


def _tokenizer(args):
    if not args.tokenizer:
        return None
    from rltrace.replay.rerun import load_tokenizer

    return load_tokenizer(args.tokenizer)


def _print_json(console: Console, data) -> None:
    console.print_json(_json.dumps(data, default=str))


def _list(args) -> int:
    from rltrace.replay.browse import list_batches

    rows, skipped = list_batches(args.run_dir, skip_corrupt=args.skip_corrupt)
    console = Console()
    if args.json:
        _print_json(console, {"batches": rows, "skipped": skipped})
    else:
        render.batches(console, args.run_dir, rows, skipped)
    return 0


def _show(args) -> int:
    from rltrace.replay import load
    from rltrace.replay.browse import pick_sample, sample_views

    tokenizer = _tokenizer(args)
    console = Console()
    if args.step == "all":
        return _show_all(args, tokenizer, console)
    batch = load(args.run_dir, args.step, batch_id=args.batch, tokenizer=tokenizer)
    views = _sort_views(sample_views(batch, tokenizer), args.sort)
    if args.sample is not None:
        view = pick_sample(views, args.sample, str(batch.path))
        if args.json:
            _print_json(console, {k: v for k, v in view.items() if k != "response_tokens"})
        else:
            render.sample(console, batch, view)
        return 0
    if args.flagged:
        views = [v for v in views if v["flags"]]
    if args.json:
        _print_json(console, {"step": batch.step, "batch_id": batch.batch_id, "samples": [
            {k: v for k, v in view.items() if k not in ("response_tokens", "prompt_text")} for view in views]})
    else:
        render.samples(console, batch, views)
    return 0


def _show_all(args, tokenizer, console) -> int:
    """`show --step all`: the samples of every frozen batch in one list, each with its step and batch."""
    from rltrace.replay import load
    from rltrace.replay.browse import sample_views

    if args.sample is not None:
        raise RltraceError("--sample needs one batch: give --step N, not all")
    views = []
    for step, batch_id in _every_batch(args):
        batch = load(args.run_dir, step, batch_id=batch_id, tokenizer=tokenizer)
        views += [{**v, "step": step, "batch_id": batch_id} for v in sample_views(batch, tokenizer)]
    if args.flagged:
        views = [v for v in views if v["flags"]]
    views = _sort_views(views, args.sort)
    if args.json:
        _print_json(console, {"samples": [{k: v for k, v in view.items() if k not in ("response_tokens", "prompt_text")}
                                          for view in views]})
    else:
        render.samples_of_every_batch(console, views)
    return 0


def _run(args) -> int:
    from rltrace.replay import load
    from rltrace.replay.diff import diff_against_record, repeatability
    from rltrace.replay.rerun import run_entry

    tokenizer = _tokenizer(args)
    console = Console()
    if args.step == "all":  # every frozen batch, one after another: each its own replay, diffed against its record
        every = _every_batch(args)
        if not every:
            console.print(f"No frozen batches in {args.run_dir}.")
            return 1
        out = []
        for step, batch_id in every:
            result = run_entry(args.run_dir, step, args.entry, repeat=args.repeat, kwargs=dict(args.arg),
                               batch_id=batch_id, label=args.label, tokenizer=tokenizer)
            diffs = diff_against_record(load(args.run_dir, step, batch_id=batch_id), result.repeats[0])
            repeatable = repeatability(result.repeats)
            if args.json:
                out.append({"step": step, "batch_id": batch_id, "replay_id": result.replay_id, "repeatable": repeatable,
                            "diffs": [d.to_dict() for d in diffs]})
            else:
                console.print(f"[bold]step {step} · batch {term(batch_id)}[/]")
                render.replay_run(console, result, repeatable, diffs)
        if args.json:
            _print_json(console, {"batches": out})
        return 0
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"running {args.entry}", total=args.repeat)
        result = run_entry(
            args.run_dir, args.step, args.entry, repeat=args.repeat, kwargs=dict(args.arg), batch_id=args.batch,
            label=args.label, tokenizer=tokenizer, on_repeat=lambda r: bar.update(task, completed=r + 1),
        )
    batch = load(args.run_dir, args.step, batch_id=args.batch)
    diffs = diff_against_record(batch, result.repeats[0])
    repeatable = repeatability(result.repeats)
    if args.json:
        _print_json(console, {"replay_id": result.replay_id, "repeatable": repeatable, "diffs": [d.to_dict() for d in diffs],
                              "durations_s": [r.duration_s for r in result.repeats]})
    else:
        render.replay_run(console, result, repeatable, diffs)
    return 0


def _diff(args) -> int:
    from rltrace.replay import load
    from rltrace.replay.diff import diff_against_record, diff_recorded, diff_replays
    from rltrace.replay.rerun import latest_replay, load_replays

    batch = load(args.run_dir, args.step, batch_id=args.batch, tokenizer=_tokenizer(args))
    console = Console()
    if args.recorded:
        if args.replay or args.against or args.pair:
            raise RltraceError("--recorded compares two recorded columns; it takes no --replay, --against or --pair")
        diffs = diff_recorded(batch, [tuple(p) for p in args.recorded])
        if args.json:
            _print_json(console, {"replay_id": None, "diffs": [d.to_dict() for d in diffs]})
        else:
            render.diffs(console, f"recorded columns of step {batch.step}", diffs)
        return 0
    replay = (load_replays(args.run_dir, step=args.step, replay_id=args.replay) if args.replay else latest_replay(args.run_dir, args.step))[0]
    if args.against:
        other = load_replays(args.run_dir, step=args.step, replay_id=args.against)[0]
        diffs, title = diff_replays(replay, other, batch), f"replay {replay.replay_id} ({replay.label}) vs {other.replay_id} ({other.label})"
    else:
        diffs = diff_against_record(batch, replay, pairs=dict(args.pair) or None)
        title = f"recorded vs replay {replay.replay_id} ({replay.label})"
    if args.json:
        _print_json(console, {"replay_id": replay.replay_id, "diffs": [d.to_dict() for d in diffs]})
    else:
        render.diffs(console, title, diffs)
    return 0


def _compare(args) -> int:
    from rltrace.replay import load
    from rltrace.replay.diff import diff_replays, repeatability
    from rltrace.replay.rerun import load_replays, run_entry

    batch = load(args.run_dir, args.step, batch_id=args.batch, tokenizer=_tokenizer(args))
    console = Console()
    if len(args.replay) == 2 and not args.entry:
        sides = [[r for r in load_replays(args.run_dir, step=args.step, replay_id=rid)] for rid in args.replay]
    elif len(args.entry) == 2 and not args.replay:
        sides = []
        with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
            for entry in args.entry:
                task = bar.add_task(f"running {entry}", total=args.repeat)
                run = run_entry(args.run_dir, args.step, entry, repeat=args.repeat, kwargs=dict(args.arg),
                                batch_id=batch.batch_id, on_repeat=lambda r, t=task: bar.update(t, completed=r + 1))
                sides.append(run.repeats)
    else:
        raise RltraceError("replay compare needs two entries (--entry A --entry B) or two replays (--replay ID --replay ID)")
    a, b = sides
    report = {
        "a": {"replay_id": a[0].replay_id, "label": a[0].label, "repeats": len(a), "repeatable": repeatability(a)},
        "b": {"replay_id": b[0].replay_id, "label": b[0].label, "repeats": len(b), "repeatable": repeatability(b)},
        "diffs": diff_replays(a[0], b[0], batch),
    }
    if args.json:
        _print_json(console, {**report, "diffs": [d.to_dict() for d in report["diffs"]]})
    else:
        render.comparison(console, report)
    return 0


def _decompose(args) -> int:
    from rltrace.replay import load
    from rltrace.replay.decompose import decompose, versions_of
    from rltrace.replay.errors import ReplayError
    from rltrace.replay.rerun import run_entry

    batch = load(args.run_dir, args.step, batch_id=args.batch, tokenizer=_tokenizer(args))
    v_t, v_s = versions_of(batch)
    versions = sorted({v_t, *v_s})
    console = Console()
    results = {}
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"log-probs at {len(versions)} weight version(s)", total=len(versions))
        for v in versions:
            run = run_entry(args.run_dir, args.step, args.entry, kwargs={**dict(args.arg), "weight_version": v},
                            batch_id=batch.batch_id, label=f"log p at v{v}")
            if "log_probs" not in run.repeats[0]:
                raise ReplayError(f"entry {args.entry} returned no 'log_probs' for weight_version={v}")
            results[v] = run.repeats[0]["log_probs"]
            bar.advance(task)
    result = decompose(batch, lambda v: results[v])
    if args.json:
        _print_json(console, {"train_version": v_t, "versions": versions, **result.__dict__})
    else:
        render.decomposition(console, batch, v_t, versions, result)
    return 0


def _request(args) -> int:
    from rltrace.replay.freezer import write_request
    from rltrace.store import read_manifest

    read_manifest(args.run_dir)
    path = write_request(args.run_dir, args.reason)
    Console().print(f"asked the run's Freezer to freeze its next step ({path})")
    return 0
