"""Staleness: how many weight versions old the samples used at each step were (`d = v_t - v_s`)."""

from __future__ import annotations

import pandas as pd

from rltrace.analysis.metrics import step_metrics
from rltrace.analysis._steps import Steps, step_filter


def staleness(con, steps: Steps = None) -> pd.DataFrame:
    """Per step: mean and max staleness, from samples (`train_version - weight_version`) or,
    for steps without such samples, from the `staleness_mean` / `staleness_max` metrics.

    Returns: step, samples (0 when from metrics), mean, max, source (`samples` / `metrics`),
    request_mean (the age of each engine request, `train_version` minus each entry of
    `weight_versions`, averaged over requests: a sample that spans versions counts each part at its own age).
    """
    where, params = step_filter(steps)
    from_samples = con.execute(  # request ages per step aggregated once and joined (not a subquery per step)
        f"""WITH req AS (SELECT step, avg(train_version - v) AS request_mean
                         FROM (SELECT step, train_version, unnest(weight_versions) AS v FROM samples
                               WHERE train_version IS NOT NULL AND {where}) GROUP BY step)
            SELECT s.step, count(*) AS samples, avg(s.staleness) AS mean, max(s.staleness) AS max,
                   any_value(r.request_mean) AS request_mean
            FROM samples s LEFT JOIN req r USING (step) WHERE s.staleness IS NOT NULL AND {where}
            GROUP BY s.step ORDER BY s.step""",
        params + params,
    ).df().assign(source="samples")
    m = step_metrics(con, ("staleness_mean", "staleness_max"), steps)
    m = m[~m["step"].isin(from_samples["step"])]
    if not m.empty:
        wide = m.pivot_table(index="step", columns="name", values="value").reset_index()
        from_metrics = pd.DataFrame(
            {"step": wide["step"], "samples": 0, "mean": wide.get("staleness_mean"), "max": wide.get("staleness_max")}
        ).assign(source="metrics")
        from_samples = pd.concat([from_samples, from_metrics], ignore_index=True)
    return from_samples.sort_values("step", ignore_index=True)[["step", "samples", "mean", "max", "source", "request_mean"]]


def histogram(con, steps: Steps = None) -> pd.DataFrame:
    """Per step and age: how many samples were that many versions stale.

    Returns: step, age (versions), samples.
    """
    where, params = step_filter(steps)
    return con.execute(
        f"""SELECT step, staleness AS age, count(*) AS samples FROM samples
            WHERE staleness IS NOT NULL AND {where} GROUP BY ALL ORDER BY step, age""",
        params,
    ).df()
