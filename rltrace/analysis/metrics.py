"""Step scalars by their canonical names, whatever name the framework logged them under.

The aliases (TRL's `reward`, verl's `critic/rewards/mean`, slime's `rollout/raw_reward`, a
`train/` or `rollout/` prefix, ...) live in one table, `rltrace._names.METRIC_ALIASES`.
"""

from __future__ import annotations

import pandas as pd

from rltrace._names import metric_names
from rltrace.analysis._steps import Steps, step_filter


def step_metrics(con, names, steps: Steps = None) -> pd.DataFrame:
    """Values of the named step scalars, one per (step, name).

    Per step, the most preferred name present wins (the canonical name, then its prefixed
    forms, then the framework aliases, in `metric_names` order); when several processes log
    that name for one step, the mean is taken.

    Returns: step, name (canonical), value, processes (how many values were averaged), logged_as
    (the name it was logged under).
    """
    names = list(names)
    if not names:
        return pd.DataFrame(columns=["step", "name", "value", "processes", "logged_as"])
    table = [(alias, name, rank) for name in names for rank, alias in enumerate(metric_names(name))]
    aliases = pd.DataFrame(table, columns=["alias", "canonical", "preference"])
    where, params = step_filter(steps, "m.step")
    con.register("_rltrace_aliases", aliases)
    try:
        return con.execute(
            f"""WITH hits AS (
                    SELECT m.step, a.canonical, a.preference, m.name, m.value
                    FROM metrics m JOIN _rltrace_aliases a ON m.name = a.alias
                    WHERE {where} AND m.value IS NOT NULL AND NOT isnan(m.value)),
                best AS (SELECT step, canonical, min(preference) AS preference FROM hits GROUP BY ALL)
                SELECT h.step, h.canonical AS name, avg(h.value) AS value, count(*) AS processes,
                       any_value(h.name) AS logged_as
                FROM hits h JOIN best USING (step, canonical, preference)
                GROUP BY ALL ORDER BY h.step, name""",
            params,
        ).df()
    finally:
        con.unregister("_rltrace_aliases")
