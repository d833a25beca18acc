"""Step scalars by their canonical names, accepting slime-style prefixed aliases."""

from __future__ import annotations

import pandas as pd

from rltrace.analysis._steps import Steps, step_filter

ALIAS_PREFIXES = ("train/", "rollout/", "perf/")


def step_metrics(con, names, steps: Steps = None) -> pd.DataFrame:
    """Values of the named step scalars, one per (step, name).

    A metric logged as `train/loss`, `rollout/loss` or `perf/loss` counts as `loss`. When
    several processes (or aliases) log a name for one step, the mean is taken.

    Returns: step, name (canonical), value, processes (how many values were averaged).
    """
    names = list(names)
    if not names:
        return pd.DataFrame(columns=["step", "name", "value", "processes"])
    wanted = names + [p + n for p in ALIAS_PREFIXES for n in names]
    marks = ", ".join("?" for _ in wanted)
    where, params = step_filter(steps)
    return con.execute(
        f"""SELECT step, regexp_replace(name, '^(train|rollout|perf)/', '') AS name, avg(value) AS value,
                   count(*) AS processes
            FROM metrics WHERE name IN ({marks}) AND {where} AND value IS NOT NULL
            GROUP BY ALL ORDER BY step, name""",
        wanted + params,
    ).df()
