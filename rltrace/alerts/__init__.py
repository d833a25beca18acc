"""No-progress alerts while a run is alive: rules on the live store, raised once, stored, sent.

    rltrace watch runs/exp1 --webhook http://127.0.0.1:9000/hook     # every few seconds
    rltrace watch runs/exp1 --once                                   # exit 1 when any alert holds

or from Python: `Watcher(run_dir, Settings(...)).check()`. Rules: `rltrace.alerts.rules`.
"""

from rltrace.alerts.deliver import Delivery
from rltrace.alerts.rules import RULES, Alert, AlertRuleError, Settings, Threshold, evaluate
from rltrace.alerts.watch import Watcher

__all__ = ["Alert", "AlertRuleError", "Delivery", "RULES", "Settings", "Threshold", "Watcher", "evaluate"]
