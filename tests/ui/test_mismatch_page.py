"""Reward & mismatch page on an imported slime run: mismatch computed from its batches, source named."""

from __future__ import annotations

import json

from tests.analysis.test_batch_mismatch import slime_run  # noqa: F401  (fixture)

from .conftest import no_exceptions
from .test_pages import charts, page


def test_reward_page_shows_mismatch_from_batches(slime_run, app):  # noqa: F811
    run_dir, expected = slime_run
    at = page(app(run_dir), "reward")
    no_exceptions(at)
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    titles = [s["layout"].get("title", {}).get("text") for s in specs]
    abs_diff = specs[titles.index("train_rollout_logprob_abs_diff")]
    (line,) = [t for t in abs_diff["data"] if t.get("name")]
    assert line["name"].endswith("(frozen batches)")  # the source is named
    assert at.selectbox(key="batch_mismatch_metric").value == "train_rollout_logprob_abs_diff"
