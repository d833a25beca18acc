"""How the dashboard writes numbers: units a person reads at a glance, never 0% or 1e+03 µs."""

import math

import pandas as pd

from rltrace.ui import style


def test_seconds_pick_the_unit_after_rounding():
    assert [style.seconds(v) for v in (3.5234, 0.0841, 0.0009996, 1.2e-4, 2.5e-7, 0, None, math.nan)] == [
        "3.52 s", "84.1 ms", "1 ms", "120 µs", "250 ns", "0 s", "–", "–"]


def test_small_shares_keep_two_digits():
    assert [style.share(v) for v in (0.42, 0.035, 0.0007, 0, None)] == ["42%", "3.5%", "0.07%", "0%", "–"]


def test_wait_sentences_name_who_waited_how_long_and_for_what():
    row = pd.Series({"role": "trainer", "rank": 0, "in_phase": "idle", "seconds": 0.0152, "share": 0.0264, "step": 3,
                     "waited_for": "rollout", "waited_for_process": "p-rollout"})
    names = {"p-rollout": "rollout0"}
    assert style.wait_text(row, names) == "**trainer0** idle **15.2 ms** (2.6% of step 3) for **rollout** on rollout0"
    untraced = row.copy()
    untraced["waited_for"], untraced["in_phase"] = "untraced", "wait"
    assert style.wait_text(untraced, names).endswith("in a wait span **15.2 ms** (2.6% of step 3) while no recorded phase ran anywhere")
