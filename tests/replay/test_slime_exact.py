"""slime, exactly: dumps written by slime's own rollout code (tests/replay/slime_run.py), imported,
and every number checked against slime's own functions run on the same samples.

The run is synchronous with partial rollouts: rollout 0 over-samples three groups, keeps two and
aborts the third, which slime carries over (`metadata.start_rollout_id` = 0) and finishes in
rollout 1 under the next weight version."""

import json
import math

import numpy as np
import pytest
import torch

import rltrace
from rltrace import analysis
from rltrace.replay.slime import import_slime
from rltrace.report.build import build
from tests.replay import slime_run

pytestmark = pytest.mark.skipif(not slime_run.available(), reason=slime_run.MISSING)


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    root = tmp_path_factory.mktemp("slime")
    rollouts = slime_run.run(root / "dump", rollouts=2, partial=True)
    result = import_slime([root / "dump"], root / "run")
    return rollouts, result, rltrace.store.open(root / "run"), root


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("slime_plain")
    rollouts = slime_run.run(root / "dump", rollouts=1, partial=False, train=False, spec=True)
    import_slime([root / "dump"], root / "run")
    return rollouts, rltrace.store.open(root / "run")


def _carried(rollouts):
    return [s for s in rollouts[1].samples if s.metadata.get("start_rollout_id") == 0]


def _raw_spans(sample, name):
    """(start, end, end attrs) of a span name in a slime trace, in end order."""
    starts = {e["span_id"]: e["ts"] for e in sample.trace["events"] if e["type"] == "span_start" and e["name"] == name}
    ends = [(starts[e["span_id"]], e["ts"], e.get("attrs") or {}) for e in sample.trace["events"]
            if e["type"] == "span_end" and e["name"] == name and e["span_id"] in starts]
    return sorted(ends, key=lambda x: x[1])


def test_the_fixture_holds_a_carried_over_sample_with_two_versions(partial):
    rollouts, _, _, _ = partial
    carried = _carried(rollouts)
    assert len(carried) == 4 and all(s.index in range(8, 12) for s in carried)
    assert partial[1]["carried"] == 4  # the import says so
    assert any(len(set(s.weight_versions)) == 2 for s in carried)


def test_every_span_lands_in_the_rollout_during_which_it_ran(partial):
    rollouts, _, con, _ = partial
    spans = con.execute("SELECT step, name, start_ns, end_ns FROM spans").fetchall()
    assert {s[0] for s in spans} == {0, 1}
    for step, name, start, end in spans:
        r = rollouts[step]  # the wall-clock window of slime's generate_rollout call for that rollout id
        assert r.started - 1e-6 <= start / 1e9 and end / 1e9 <= r.ended + 1e-6, (step, name)


def test_a_carried_over_sample_keeps_one_row_per_step(partial):
    rollouts, _, con, _ = partial
    for sample in _carried(rollouts):
        rows = con.execute(
            "SELECT step, in_batch, weight_versions, staleness, gen_start, gen_end, reward FROM samples WHERE sample_id = ? ORDER BY step",
            [sample.index],
        ).fetchall()
        assert [(r[0], r[1]) for r in rows] == [(0, False), (1, True)]
        own = _raw_spans(sample, "generate_and_rm")  # one per rollout it ran in
        assert len(own) == 2
        for row, (start, end, _) in zip(rows, own):
            assert row[4] == pytest.approx(start, abs=1e-6) and row[5] == pytest.approx(end, abs=1e-6)
        assert rows[1][2] == [int(v) for v in sample.weight_versions] and rows[1][6] == sample.reward
        assert rows[1][3] == 1  # trained at version 2, oldest request at version 1
        assert rows[0][6] is None and rows[0][3] is None


def test_a_sample_is_timed_by_its_own_span_not_its_group(partial):
    rollouts, _, con, _ = partial
    for sample in rollouts[0].samples:
        (start, end, _), = _raw_spans(sample, "generate_and_rm")
        gen = con.execute("SELECT gen_start, gen_end FROM samples WHERE sample_id = ? AND step = 0", [sample.index]).fetchone()
        assert gen[0] == pytest.approx(start, abs=1e-6) and gen[1] == pytest.approx(end, abs=1e-6)
        (gstart, gend, _), = _raw_spans(sample, "generate_and_rm_group")
        assert gend - gstart > end - start  # the group's span is longer: it is not the sample's time


def test_group_spans_are_stored_once_and_children_point_to_them(partial):
    _, _, con, _ = partial
    groups = dict(con.execute("SELECT step, count(*) FROM spans WHERE name = 'generate_and_rm_group' GROUP BY step").fetchall())
    assert groups == {0: 3, 1: 2}  # rollout 0: groups 0, 1 and the aborted 2; rollout 1: 2 again and 3
    orphans = con.execute(
        """SELECT count(*) FROM spans c WHERE c.name = 'generate_and_rm'
           AND c.parent_span_id NOT IN (SELECT span_id FROM spans WHERE name = 'generate_and_rm_group')"""
    ).fetchone()[0]
    assert orphans == 0
    per_sample = con.execute("SELECT count(DISTINCT thread_id) FROM spans WHERE name = 'generate_and_rm' AND step = 0").fetchone()[0]
    assert per_sample == 12  # one lane per sample that ran in rollout 0


def test_each_request_carries_its_own_weight_version(partial):
    rollouts, _, con, _ = partial
    for r in rollouts:
        for sample in r.samples:
            got = con.execute(
                """SELECT weight_version FROM spans WHERE name = 'sglang_generate'
                   AND attr(attributes, 'slime.sample_id') = ? ORDER BY end_ns""",
                [str(sample.index)],
            ).fetchall()
            assert [g[0] for g in got] == [int(v) for v in sample.weight_versions]


def test_two_dumps_of_a_synchronous_run_do_not_overlap(partial):
    _, _, con, _ = partial
    report = build(con)
    assert report["async"]["overlapping"] is False
    assert not any(f.startswith("Stages overlap") for f in report["findings"])


def test_span_ends_without_a_start_are_kept_and_marked(partial, tmp_path):
    _, _, _, root = partial
    data = torch.load(root / "dump" / "rollout_data" / "0.pt", weights_only=True)
    events = data["samples"][0]["trace"]["events"]
    lost = next(e for e in events if e["type"] == "span_start" and e["name"] == "reward_model")
    events.remove(lost)
    torch.save(data, tmp_path / "0.pt")
    result = import_slime([tmp_path / "0.pt"], tmp_path / "run")
    assert result["unmatched_ends"] == 1
    con = rltrace.store.open(tmp_path / "run")
    (name, attrs, duration), = con.execute(
        "SELECT name, attributes, duration_s FROM spans WHERE attr(attributes, 'slime.unmatched_end') = 'true'"
    ).fetchall()
    assert name == "reward_model" and duration == 0 and json.loads(attrs)["slime.sample_id"] == 0


# --- the numbers slime logs ----------------------------------------------------------------------
def _rollout_table(con):
    return {row["step"]: row for row in analysis.rollout(con).to_dict("records")}


def test_sample_metrics_equal_slimes_compute_metrics_from_samples(partial):
    rollouts, _, con, _ = partial
    table = _rollout_table(con)
    for r in rollouts:
        got, want = table[r.rollout_id], r.metrics
        for stat in ("mean", "median", "max", "min"):
            assert got[f"response_len_{stat}"] == pytest.approx(want[f"response_len/{stat}"], abs=1e-9)
        for key in ("truncated_ratio", "repetition_frac", "prefix_cache_hit_rate", "avg_cached_tokens_per_sample"):
            assert got[key] == pytest.approx(want[key], abs=1e-9), key
        assert got["zero_std"] == {k.removeprefix("zero_std/"): v for k, v in want.items() if k.startswith("zero_std/")}
        assert got["zero_std_groups"] == sum(got["zero_std"].values())
        assert got["pass_at_k"].keys() == {"1", "2", "4"}
        for k, v in r.pass_rate.items():
            assert got["pass_at_k"][k.removeprefix("pass@")] == pytest.approx(v, abs=1e-9)
        for stat in ("mean", "median", "max", "min"):
            assert got[f"non_generation_time_{stat}"] == pytest.approx(r.perf[f"non_generation_time/{stat}"], abs=1e-9)
        # slime's rollout/raw_reward: sum(raw_reward) / count (train_metric_utils.py, log_rollout_data)
        rewards = [s.reward for s in r.samples]
        assert got["reward_mean"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-9)


def test_response_length_follows_the_loss_mask(partial):
    rollouts, _, con, _ = partial
    masked = [s for r in rollouts for s in r.samples if sum(s.loss_mask) != s.response_length]
    assert masked  # tool turns and off-policy prefixes are under mask 0
    table = _rollout_table(con)
    raw = con.execute("SELECT avg(response_len) FROM samples WHERE step = 0 AND in_batch").fetchone()[0]
    assert table[0]["response_len_mean"] != pytest.approx(raw)


def test_engine_means_equal_slimes_request_statistics(plain_run):
    (r,), con = plain_run
    got = analysis.engine(con).iloc[0]
    names = {"e2e_latency": "request/e2e_latency", "queue_time": "request/queue_time", "decode_throughput": "decode/throughput"}
    for ours, theirs in names.items():
        for stat in ("mean", "median", "max", "min"):
            assert got[f"{ours}_{stat}"] == pytest.approx(r.perf[f"{theirs}/{stat}"], abs=1e-9), (ours, stat)
    table = _rollout_table(con)[0]
    assert table["prefix_cache_hit_rate"] == pytest.approx(r.metrics["prefix_cache_hit_rate"], abs=1e-9)
    for key in ("spec_accept_rate", "spec_accept_length"):  # slime computes these with speculative decoding on
        assert 0 < table[key] == pytest.approx(r.metrics[key], abs=1e-9)


def test_partial_rollout_requests_count_once_in_the_step_they_ran(partial):
    rollouts, _, con, _ = partial
    engine = analysis.engine(con).set_index("step")
    ends = {(e["trace_id"], e["span_id"]) for r in rollouts for s in r.samples for e in s.trace["events"]
            if e["type"] == "span_end" and e["name"] == "sglang_generate"}
    assert engine["requests"].sum() == len(ends)


def _sum_of_sample_mean_f32(values, masks, denoms=None):
    """slime's get_sum_of_sample_mean with cp_size 1 (slime/backends/megatron_utils/cp_utils.py:67-81), in torch."""
    denoms = denoms if denoms is not None else [m.sum() for m in masks]
    return sum((x * m).sum() / torch.clamp_min(d, 1) for x, m, d in zip(values, masks, denoms))


def test_train_side_means_equal_slimes_log_rollout_data(partial):
    rollouts, _, con, root = partial
    means = analysis.train_means(con).set_index("step")
    for r in rollouts:
        data = torch.load(root / "dump" / "train_data" / f"{r.rollout_id}.pt", weights_only=True)
        samples = data["samples"]
        n = sum(sum(shard["global_batch_sizes"]) for shard in data["dp_shards"])  # num_rollouts_in_rollout
        masks = [s["loss_masks"] for s in samples]
        for key in ("log_probs", "rollout_log_probs", "ref_log_probs"):
            values = [s[key] for s in samples]
            exact = sum(float((x.double() * m.double()).sum()) / max(float(m.sum()), 1.0) for x, m in zip(values, masks)) / n
            assert means.loc[r.rollout_id, key] == pytest.approx(exact, abs=1e-9), key
            slime_f32 = _sum_of_sample_mean_f32(values, masks).item() / n  # slime sums in float32
            assert means.loc[r.rollout_id, key] == pytest.approx(slime_f32, rel=1e-6), key
        entropy = torch.cat([s["entropy"] for s in samples])  # not a per-rollout-mean key: the plain token mean
        assert means.loc[r.rollout_id, "entropy"] == pytest.approx(float(entropy.double().mean()), abs=1e-9)
        assert means.loc[r.rollout_id, "entropy"] == pytest.approx(entropy.mean().item(), rel=1e-6)


def test_the_report_has_a_rollout_section_per_step(partial):
    rollouts, _, con, _ = partial
    report = build(con)
    assert [row["step"] for row in report["rollout"]] == [0, 1]
    row = report["rollout"][1]
    assert row["pass_at_k"]["1"] == pytest.approx(rollouts[1].pass_rate["pass@1"], abs=1e-9)
    assert not any(isinstance(v, float) and math.isnan(v) for v in row.values())
    json.dumps(report)


def test_a_traced_run_gets_the_same_numbers_from_its_samples(tmp_path):
    from rltrace.testing import RunBuilder

    b = RunBuilder(tmp_path / "run")
    b.process("rollout")
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    b.samples(3, [{"sample_id": i, "group_id": i // 4, "response_len": 10 + i, "finish_reason": "length" if i == 2 else "stop",
                   "reward": rw} for i, rw in enumerate(rewards)])
    b.write()
    row = _rollout_table(rltrace.store.open(tmp_path / "run"))[3]
    assert row["reward_mean"] == pytest.approx(np.mean(rewards)) and row["truncated_ratio"] == pytest.approx(1 / 8)
    assert row["zero_std"] == {"count_0.0": 1} and row["response_len_median"] == pytest.approx(13.5)
    # group 0 has 3 of 4 correct, group 1 none: pass@1 = (0.75 + 0) / 2, pass@2 = (1 + 0) / 2
    assert row["pass_at_k"] == {"1": pytest.approx(0.375), "2": pytest.approx(0.5), "4": pytest.approx(0.5)}


# --- loss masks ------------------------------------------------------------------------------------
def test_tool_turns_under_loss_mask_0_are_not_template_leaks(partial):
    from rltrace import replay
    from rltrace.replay.browse import sample_views
    from rltrace.replay.flags import sample_flags

    _, _, _, root = partial
    views = sample_views(replay.load(root / "run", 0))
    tool = [v for v in views if slime_run.TOOL_TEXT in (v["response_text"] or "")]
    assert tool and all("template_leak" not in v["flags"] for v in tool)
    batch = replay.load(root / "run", 0)
    i = tool[0]["sample_index"]
    sample = {"response_tokens": batch["response_tokens"][i], "response_text": tool[0]["response_text"]}
    assert "template_leak" in sample_flags(sample)  # the same text without its mask is flagged
    mask = batch["loss_mask"][i]
    assert "template_leak" not in sample_flags({**sample, "loss_mask": mask})
    leaked = sample_flags({**sample, "loss_mask": mask, "trained_text": "ok <|im_end|> more"})
    assert "template_leak" in leaked  # a marker the model wrote itself still is one


def test_mismatch_is_slimes_masked_train_rollout_logprob_abs_diff(partial):
    rollouts, _, con, root = partial
    got = analysis.mismatch(con)
    got = got[(got["metric"] == "train_rollout_logprob_abs_diff") & (got["source"] == "batches")].set_index("step")["value"]
    for r in rollouts:
        samples = torch.load(root / "dump" / "train_data" / f"{r.rollout_id}.pt", weights_only=True)["samples"]
        masks = [s["loss_masks"] for s in samples]
        # megatron_utils/loss.py:1140: sum_of_sample_mean(|log p - log q|) over the step's samples; rltrace
        # reads the rollout's log-probs as the rollout dump holds them (float64), slime as float32 tensors
        diffs = [(t["log_probs"].double() - torch.tensor(s.rollout_log_probs, dtype=torch.float64)).abs()
                 for t, s in zip(samples, r.samples)]
        exact = sum(float((d * m.double()).sum()) / max(float(m.sum()), 1.0) for d, m in zip(diffs, masks)) / len(samples)
        assert got[r.rollout_id] == pytest.approx(exact, abs=1e-9)
        f32 = _sum_of_sample_mean_f32([(s["log_probs"] - s["rollout_log_probs"]).abs() for s in samples], masks).item()
        assert got[r.rollout_id] == pytest.approx(f32 / len(samples), rel=1e-5)  # slime itself sums in float32
        unmasked = sum(float(d.mean()) for d in diffs) / len(samples)
        assert got[r.rollout_id] != pytest.approx(unmasked, rel=1e-6)  # tool tokens would count otherwise


# --- the engine section ----------------------------------------------------------------------------
def test_engine_section_from_the_requests_slime_recorded(plain_run):
    (r,), con = plain_run
    attrs = [e["attrs"] for s in r.samples for e in s.trace["events"] if e["type"] == "span_end" and e["name"] == "sglang_generate"]
    row = build(con)["engine"][0]
    assert row["requests"] == len(attrs)
    assert row["queue_share"] == pytest.approx(sum(a["queue_time"] for a in attrs) / sum(a["e2e_latency"] for a in attrs), abs=1e-9)
    assert row["decode_throughput_p90"] == pytest.approx(np.percentile([a["decode_throughput"] for a in attrs], 90), abs=1e-9)
    assert row["prefix_cache_hit_rate"] == pytest.approx(r.metrics["prefix_cache_hit_rate"], abs=1e-9)
    assert row["spec_accept_rate"] == pytest.approx(r.metrics["spec_accept_rate"], abs=1e-9)


def test_a_saturated_engine_explains_a_slow_rollout():
    from rltrace.report import findings

    report = {"bottleneck": {"stage": "rollout"}, "engine": [{"step": 0, "queue_share": 0.6, "spec_accept_rate": 0.2,
                                                             "prefix_cache_hit_rate": 0.0}]}
    text = " ".join(findings._engine(report))
    assert "60% of their time queued" in text and "accepted a median 20%" in text and "hit rate was 0%" in text
    assert findings._engine({**report, "bottleneck": {"stage": "train"}}) == []
    calm = {"bottleneck": {"stage": "rollout"}, "engine": [{"step": 0, "queue_share": 0.05, "prefix_cache_hit_rate": 0.7}]}
    assert findings._engine(calm) == []


def test_staleness_per_request_follows_each_weight_version(partial):
    rollouts, _, con, _ = partial
    st = analysis.staleness(con).set_index("step")
    for r in rollouts:
        versions = [int(v) for s in r.samples for v in s.weight_versions]
        v_t = max(versions)  # the trainer's version: the newest any request of the rollout ran under
        assert st.loc[r.rollout_id, "request_mean"] == pytest.approx(np.mean([v_t - v for v in versions]), abs=1e-9)
        assert st.loc[r.rollout_id, "mean"] == pytest.approx(np.mean([v_t - min(map(int, s.weight_versions)) for s in r.samples]), abs=1e-9)
    assert st.loc[1, "request_mean"] < st.loc[1, "mean"]  # a carried-over sample is only partly old


def test_dumps_imported_one_at_a_time_land_in_the_same_steps(partial, tmp_path):
    rollouts, _, con, root = partial
    dump = root / "dump"
    import_slime([dump / "rollout_data" / "1.pt", dump / "train_data" / "1.pt"], tmp_path / "run")  # the later one first
    import_slime([dump / "rollout_data" / "0.pt"], tmp_path / "run")
    alone = rltrace.store.open(tmp_path / "run")
    query = "SELECT step, name, start_ns, end_ns FROM spans ORDER BY start_ns, name, end_ns"
    assert [r[:2] for r in alone.execute(query).fetchall()] == [r[:2] for r in con.execute(query).fetchall()]
    report = build(alone)
    assert report["async"]["overlapping"] is False
    by_step = {row["step"]: row for row in report["rollout"]}
    assert by_step[0].get("log_probs") is None and by_step[1]["log_probs"] == pytest.approx(
        analysis.train_means(con).set_index("step").loc[1, "log_probs"], abs=1e-12)


def test_aborted_parts_of_carried_over_samples_are_no_stragglers(partial):
    rollouts, _, con, _ = partial
    carried = {s.index for s in _carried(rollouts)}
    tail = analysis.long_tail(con).set_index("step")
    assert tail.loc[0, "samples"] == len(rollouts[0].samples)  # the batch of step 0, not the aborted group
    s = analysis.stragglers(con, factor=1.0)
    assert not ((s["step"] == 0) & s["sample_id"].astype(int).isin(carried)).any()


def test_importing_slimes_own_dumps_again_adds_nothing(partial):
    """A retry of the same import (say, after a failure on a later dump) stores no sample twice."""
    rollouts, result, con, root = partial
    again = import_slime([root / "dump"], root / "run")
    assert again["batches"] == [] and again["samples"] == 0 and len(again["already"]) == len(list((root / "dump").rglob("*.pt")))
    now = rltrace.store.open(root / "run")
    for table in ("batches", "samples", "spans"):
        query = f"SELECT count(*) FROM {table}"
        assert now.execute(query).fetchone() == con.execute(query).fetchone(), table


# --- work that runs across rollout windows -----------------------------------------------------------
R_SPANS = ("generate_and_rm_group", "generate_and_rm", "sglang_generate", "reward_model", "group_reward_model")


@pytest.fixture(scope="module")
def fully_async(tmp_path_factory):
    """slime's fully-async rollout: the slow group 2, started with rollout 0's groups, runs through the
    training pause and is taken by rollout 1 (see slime_run.run)."""
    root = tmp_path_factory.mktemp("slime_async")
    rollouts = slime_run.run(root / "dump", rollouts=2, fully_async=True, train=False)
    import_slime([root / "dump"], root / "run")
    return rollouts, rltrace.store.open(root / "run")


def _ns_spans(samples, names=None):
    """(start, end) in ns, as rltrace reads slime's seconds, of the finished spans in these samples' traces."""
    out = []
    for s in samples:
        starts = {e["span_id"]: e["ts"] for e in s.trace["events"] if e["type"] == "span_start"}
        out += [(round(starts[e["span_id"]] * 1e9), round(e["ts"] * 1e9)) for e in s.trace["events"]
                if e["type"] == "span_end" and e["span_id"] in starts and (names is None or e["name"] in names)]
    return out


def _covered(intervals, lo, hi) -> float:
    """Seconds of [lo, hi] covered by the union of the intervals."""
    total, reach = 0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total / 1e9


def test_work_carried_into_the_next_rollout_counts_in_each_window_it_ran_in(fully_async):
    rollouts, con = fully_async
    end0 = max(b for _, b in _ns_spans(rollouts[0].samples))  # where rollout 0's work ended
    end1 = max(b for _, b in _ns_spans(rollouts[1].samples))
    carried = [s for s in rollouts[1].samples if min(a for a, _ in _ns_spans([s])) < end0]
    assert {s.group_index for s in carried} >= {2}  # the slow group began during rollout 0 ...
    assert max(b for _, b in _ns_spans(carried)) > end0  # ... and ended in rollout 1
    windows = dict(con.execute("SELECT step, min(start_ns) FROM spans GROUP BY step").fetchall())
    assert windows[1] == end0  # step 1 begins where step 0's work ended, not where the group began
    costs = analysis.cost_model(con).set_index("step")
    work = _ns_spans([s for r in rollouts for s in r.samples], R_SPANS)
    assert costs.loc[1, "t_R"] == pytest.approx(_covered(work, end0, end1), abs=1e-6)
    assert costs.loc[1, "t_R"] == pytest.approx((end1 - end0) / 1e9, abs=1e-6)  # rollout work filled its window
    assert costs.loc[0, "t_R"] == pytest.approx(_covered(work, 0, end0), abs=1e-6)
    assert costs["t_R"].sum() == pytest.approx(_covered(work, 0, end1), abs=1e-6)  # nothing lost or counted twice
    # a piece's parent is the parent's piece of the same step
    orphans = con.execute(
        """SELECT count(*) FROM spans c LEFT JOIN spans p ON c.parent_span_id = p.span_id
           WHERE c.parent_span_id IS NOT NULL AND (p.span_id IS NULL OR p.step <> c.step)""").fetchone()[0]
    assert orphans == 0
    split = con.execute("SELECT count(DISTINCT step) FROM spans WHERE attr(attributes, 'slime.window_split') = 'true' "
                        "AND name = 'generate_and_rm_group' AND attr(attributes, 'slime.group_id') = '2'").fetchone()[0]
    assert split == 2
