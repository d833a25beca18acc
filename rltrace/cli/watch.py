"""`rltrace watch RUN_DIR [--webhook URL] [--exec CMD] [--once] [--interval S]`: alerts while a run is alive."""

from __future__ import annotations

import argparse
import datetime
import time

from rltrace._config import RltraceError
from rltrace.alerts import RULES, Delivery, Settings, Threshold, Watcher
from rltrace.alerts.rules import AlertRuleError
from rltrace.analysis._format import seconds_text
from rltrace.cli import _options
from rltrace.store import CorruptPartError


def register(sub: argparse._SubParsersAction) -> None:
    d = Settings()
    p = sub.add_parser(
        "watch",
        help="alert when a live run stops making progress (stall, silent process, starved stage, hang, threshold)",
        description="Evaluate no-progress rules on a live run every few seconds; alerts are stored in the run's "
        "`alerts` table, printed, and optionally POSTed to a webhook or passed to a command (docs/analysis.md).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--webhook", metavar="URL", help="POST each new alert as JSON to this http(s) URL")
    p.add_argument("--exec", dest="command", metavar="CMD",
                   help="run CMD (no shell) for each new alert, with the alert as JSON on stdin")
    p.add_argument("--once", action="store_true", help="evaluate once, print every alert that holds, exit 1 if any")
    p.add_argument("--interval", type=float, default=5.0, metavar="S", help="seconds between checks (default 5)")
    p.add_argument("--stall-factor", type=float, default=d.stall_factor, metavar="N",
                   help=f"no_progress: no step finished for N x the median step time (default {d.stall_factor:g})")
    p.add_argument("--stall-min", type=float, default=d.stall_min_s, metavar="S",
                   help=f"no_progress: ... and at least S seconds (default {d.stall_min_s:g})")
    p.add_argument("--heartbeat", type=float, default=d.heartbeat_s, metavar="S",
                   help=f"heartbeat: a process silent for S seconds (default {d.heartbeat_s:g})")
    p.add_argument("--starved", type=float, default=d.starved_s, metavar="S",
                   help=f"starved: a wait of S seconds while nothing upstream runs (default {d.starved_s:g})")
    p.add_argument("--hang-after", type=float, default=None, metavar="S",
                   help=f"hang: any phase open S seconds (default: {d.hang_factor:g}x its median, at least "
                   f"{d.hang_min_s:g} s)")
    p.add_argument("--threshold", action="append", default=[], metavar="METRIC<V",
                   help="threshold: a step metric crossing a limit, e.g. 'reward_mean<0.2' (repeatable)")
    p.add_argument("--stacks-wait", type=float, default=5.0, metavar="S",
                   help="on a new hang, ask every live process for its Python stacks and wait up to S seconds, so the "
                   "alert names what blocks it (default 5; 0: do not ask)")
    p.add_argument("--rules", metavar="LIST", help=f"only these rules, comma-separated ({', '.join(RULES)})")
    _options.skip_corrupt(p)
    p.set_defaults(func=main)


def _settings(args) -> Settings:
    rules = tuple(r.strip() for r in args.rules.split(",") if r.strip()) if args.rules else RULES
    if not args.interval > 0:
        raise AlertRuleError(f"--interval must be > 0 seconds, got {args.interval:g}")
    return Settings(stall_factor=args.stall_factor, stall_min_s=args.stall_min, heartbeat_s=args.heartbeat,
                    starved_s=args.starved, hang_s=args.hang_after, thresholds=tuple(Threshold.parse(t) for t in args.threshold),
                    rules=rules)


def _plain(text) -> str:
    """Stored text (phase and process names come from the run) without terminal control characters."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _line(alert) -> str:
    when = datetime.datetime.now().strftime("%H:%M:%S")
    profile = f" Profile: {alert.profile_id} at {alert.profile_path}." if alert.profile_id else ""
    return _plain(f"{when} ALERT {alert.rule}: {alert.message}{profile}")


def main(args: argparse.Namespace) -> int:
    settings = _settings(args)
    delivery = Delivery(args.webhook, args.command)
    watcher = Watcher(args.run_dir, settings, delivery, skip_corrupt=args.skip_corrupt, stacks_wait=args.stacks_wait)
    if args.once:
        firing, _ = watcher.check()
        for alert in firing:
            print(_line(alert), flush=True)
        if delivery.enabled and firing and not delivery.wait(timeout=delivery.timeout + 5):
            print("rltrace watch: some alerts were still being delivered at exit", flush=True)
        _report_failures(delivery, watcher, 0)
        return 1 if firing else 0
    print(_plain(f"watching {args.run_dir} every {seconds_text(args.interval)} (Ctrl-C stops)"), flush=True)
    raised = failures = 0
    first = True
    while True:
        try:
            _, new = watcher.check()
        except Exception as exc:  # a bad run dir fails at once; a passing read error (a part replaced while
            if first and isinstance(exc, RltraceError):  # it was read, compaction) is retried next tick
                raise
            hint = _options.SKIP_CORRUPT_HINT if isinstance(exc, CorruptPartError) else ""
            print(_plain(f"rltrace watch: could not read the run this time ({exc}){hint}; retrying"), flush=True)
            time.sleep(args.interval)
            continue
        first = False
        by_key = {a.key: a for a in watcher.last_firing}
        for row in new:
            print(_line(by_key[row["key"]]), flush=True)
        raised += len(new)
        failures = _report_failures(delivery, watcher, failures)
        if watcher.run_ended:
            print(f"the run has ended; {raised} alert(s) raised", flush=True)
            delivery.wait(timeout=delivery.timeout + 5)
            return 1 if raised else 0
        time.sleep(args.interval)


def _report_failures(delivery: Delivery, watcher: Watcher, seen: int) -> int:
    failed = delivery.failures + watcher.store_failures
    if failed > seen:
        print(f"rltrace watch: {delivery.failures} delivery failure(s), {watcher.store_failures} alert(s) not stored "
              "so far", flush=True)
    return failed
