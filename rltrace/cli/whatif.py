"""`rltrace whatif RUN [--async K] [--rollout-workers N] [--partial] [--placement P] [--pd P:D] [--json]`:
the step period, staleness and pool use another schedule would have, replayed from the run's own work."""

from __future__ import annotations

import argparse
import itertools
import sys

from rich import box
from rich.table import Table

from rltrace import _json, store
from rltrace._config import RltraceError
from rltrace.analysis import configure_serving, parse_steps
from rltrace.analysis import whatif as model
from rltrace.analysis._format import seconds_text as sec
from rltrace.analysis._format import term
from rltrace.cli import _options
from rltrace.cli._console import Console
from rltrace.report.build import plain

#: Asked for nothing: the schedules teams ask about first.
DEFAULT_SCENARIOS = (model.Scenario(staleness=1), model.Scenario(staleness=2), model.Scenario(staleness=1, partial=model.PARTIAL_OVERSAMPLE))


def _counts(text: str) -> list[int]:
    """`1` or `1,2`: each value a scenario."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 0, got {text!r}")
    return values


def _splits(text: str) -> list[tuple[int, int]]:
    """`1:1` or `1:1,2:2`: prefill engines : decode engines, each a scenario."""
    try:
        values = [tuple(int(n) for n in v.split(":")) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(len(v) != 2 or min(v) < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected P:D (prefill engines : decode engines, each >= 1), several as "
                                         f"1:1,2:2; got {text!r}")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "whatif",
        help="predict the step time of another schedule (async, more rollout workers, ...) from a recorded run",
        description="Replays the run's own samples and stage times under another schedule (docs/analysis.md, "
                    "\"What if\"). With no option: async with staleness 1 and 2, and partial rollouts.",
    )
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--async", dest="staleness", metavar="K", type=_counts,
                   help="staleness bound: samples may be K weight versions old (0: synchronous; 1: one-step-off); "
                        "several as 1,2")
    p.add_argument("--rollout-workers", metavar="N", type=_counts,
                   help="rollout engines sharing each step's samples (several as 1,2,4)")
    p.add_argument("--partial", metavar="FACTOR", nargs="?", type=float, const=model.PARTIAL_OVERSAMPLE,
                   help="partial rollouts: over-sample by FACTOR (default %(const)s), end each batch when its "
                        "samples are in and resume the rest in the next")
    p.add_argument("--placement", choices=("colocated", "disaggregated"),
                   help="colocated: rollout and training take turns on the same devices")
    p.add_argument("--sync-s", metavar="SECONDS", type=float,
                   help="a weight sync's cost in the schedule asked (another placement's transfer, e.g. payload / "
                        "bandwidth); default: as recorded")
    p.add_argument("--pd", metavar="P:D", type=_splits,
                   help="split the rollout engines: P prefill and D decode engines, the KV of each prompt crossing "
                        "a link of --kv-bandwidth (needs the run's engine request spans and the model config, --model); "
                        "several as 1:1,2:2")
    p.add_argument("--steps", metavar="A:B", help="calibrate on steps A to B only")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    _options.skip_corrupt(p)
    _options.serving(p)
    p.set_defaults(func=main)


def scenarios(args: argparse.Namespace) -> list[model.Scenario]:
    """One scenario per combination of the values asked; the default set when nothing is asked."""
    if args.partial is not None and args.partial < 1:
        raise RltraceError("--partial FACTOR must be >= 1 (1.25: a quarter more samples in flight)")
    if args.sync_s is not None and args.sync_s < 0:
        raise RltraceError("--sync-s must be >= 0 seconds")
    pd = getattr(args, "pd", None)
    if (args.staleness is None and args.rollout_workers is None and args.partial is None and args.placement is None
            and args.sync_s is None and pd is None):
        return list(DEFAULT_SCENARIOS)
    if args.rollout_workers and 0 in args.rollout_workers:
        raise RltraceError("--rollout-workers must be >= 1")
    if pd and args.rollout_workers:
        raise RltraceError("--pd P:D names the engines already: leave out --rollout-workers")
    return [model.Scenario(staleness=k, rollout_workers=n, partial=args.partial, placement=args.placement,
                           sync_s=args.sync_s, pd=split)
            for k, n, split in itertools.product(args.staleness or [None], args.rollout_workers or [None], pd or [None])]


def collect(run_dir: str, asked: list[model.Scenario], *, steps=None, skip_corrupt: bool = False,
            serving: dict | None = None) -> dict:
    """{"run", "recorded", "predicted_step_s", "scenarios"}: the replay as recorded and each scenario asked;
    `serving`: the options of `analysis.configure_serving` (the model config a split's KV bytes need)."""

    def build():
        snap = store.scan(run_dir, skip_corrupt=skip_corrupt)
        con = store.connect(snap)
        try:
            if serving:
                configure_serving(con, **serving)
            # the default set leaves out what this run cannot predict (partial rollouts of a capped run)
            return model.whatif(con, asked, steps, skip_refused=asked == list(DEFAULT_SCENARIOS)), snap.manifest
        finally:
            con.close()

    table, manifest = store.skipping_damaged(run_dir, skip_corrupt, build)
    rows = plain(table)
    out = {"run": {"name": manifest.get("name"), "run_id": manifest["run_id"], "run_dir": str(run_dir)},
           "recorded": rows[0] if rows else None, "scenarios": rows[1:]}
    out["predicted_step_s"] = rows[1]["predicted_step_s"] if len(rows) > 1 else None
    return out


def main(args: argparse.Namespace) -> int:
    asked = scenarios(args)
    data = collect(args.run_dir, asked, steps=parse_steps(args.steps), skip_corrupt=args.skip_corrupt,
                   serving=_options.serving_values(args))
    if args.json:
        print(_json.dumps(data, indent=2 if sys.stdout.isatty() else None))
        return 0
    render(data, Console())
    return 0


def _range(lo: float, hi: float) -> str:
    """`119–135 ms`: both ends in the unit of the larger."""
    if hi < 1:
        return f"{lo * 1e3:.0f}–{hi * 1e3:.0f} ms"
    return f"{lo:.2f}–{hi:.2f} s"


def render(data: dict, console: Console) -> None:
    """The table (recorded replay first, then each scenario), then why each one steps as it does."""
    rec = data["recorded"]
    console.print(f"[bold]{term(data['run'].get('name') or '')}[/]  {term(data['run']['run_dir'])}")
    if rec is None:
        console.print("No finished step with rollout or train spans: nothing to replay.")
        return
    t = Table(title="What if: this run's samples and stage times replayed under another schedule",
              title_justify="left", title_style="bold", box=box.SIMPLE, pad_edge=False)
    for i, col in enumerate(("schedule", "step", "90 %", "speed-up", "analytic", "stale", "binds")):
        t.add_column(col, justify="left" if i in (0, 6) else "right", no_wrap=i != 0, min_width=12 if i == 0 else None)
    base = rec["recorded_step_s"] or rec["predicted_step_s"]
    for row in [rec] + data["scenarios"]:
        step = row["predicted_step_s"]
        t.add_row(term(row["scenario"]), sec(step), _range(*row["interval_s"]),
                  f"{base / step:.2f}x" if step else "-", sec(row["analytic_s"]),
                  f"{row['staleness_mean']:.2f}/{row['staleness_max']}", row["binding"])
    console.print(t)
    recorded = "" if rec.get("recorded_step_s") is None else f" stepped in {sec(rec['recorded_step_s'])} (median)"
    console.print(f"The run ({rec['schedule']}){recorded}. 90 %: the step "
                  "in 90 % of replays; stale: mean/max weight versions; analytic: "
                  "t_sync for a synchronous schedule, max(t_R, t_T) + t_W for an async one"
                  + ("; under a prefill/decode split t_R's rollout is max(M / (n_P μ_P), M · S_KV / B_KV, the longest "
                     "decode) for M requests a step" if any(r.get("pd") for r in data["scenarios"]) else "") + ".")
    for row in data["scenarios"]:
        console.print(f" • {term(row['scenario'])}: {term(row['why'])} (busy: rollout engines "
                      f"{row['rollout_util']:.0%}, trainer {row['trainer_util']:.0%} of the time).")
    for note in rec.get("notes") or []:
        console.print(f" • {term(note)}.")
