"""slime's own rollout code feeds the engine-requests table, live (the hook) and from its dumps
(`rltrace import slime`), with the same rows: every request with SGLang's `meta_info` as slime
traced it (tokens, cached tokens, queue and end-to-end time, the PD prefill/decode durations
slime writes as child spans, the KV transfer summary it writes as an event) and the weight version
of SGLang's answer. The engine is the stand-in of tests/replay/slime_run.py (SGLang needs a GPU);
it keeps its prefix cache across the weight update, so the first request after it is a stale hit."""

from __future__ import annotations

import pytest

import rltrace
from rltrace import store
from rltrace.analysis import engine_requests, serving_section
from rltrace.replay.slime import import_slime
from tests.replay import slime_run

pytestmark = pytest.mark.skipif(not slime_run.available(), reason=slime_run.MISSING)

SPEED_GB_S = 2.0  # the stand-in's KV transfer speed (SGLang's pd_transfer_speed_gb_s: GiB/s)
SAME = ["request_id", "engine", "role", "step", "weight_version", "start_ns", "end_ns", "prompt_tokens",
        "completion_tokens", "cached_tokens", "queue_s", "e2e_s", "decode_throughput", "prefill_s", "decode_s",
        "kv_bytes", "kv_transfer_s"]


@pytest.fixture(scope="module")
def slime(tmp_path_factory):
    """One slime run (2 rollouts, partial rollout, a weight update between) with the hook on; its
    dumps imported into a second run; and every `meta_info` the engine answered, by request id."""
    from rltrace.integrations import slime as hook

    root = tmp_path_factory.mktemp("slime_serving")
    metas, original = {}, slime_run.Engine.generate

    async def recording(self, payload):
        out = await original(self, payload)
        metas[out["meta_info"]["id"]] = out["meta_info"]
        return out

    slime_run.Engine.generate = recording
    assert hook.instrument()
    try:
        slime_run.Slime()
        rltrace.init(root / "live", role="rollout")
        slime_run.run(root / "dump", rollouts=2, partial=True, kv_speed_gb_s=SPEED_GB_S)
        rltrace.shutdown()
    finally:
        hook.uninstrument()
        slime_run.Engine.generate = original
    import_slime([root / "dump"], root / "import")
    return metas, store.open(root / "live"), store.open(root / "import")


def test_the_hook_and_the_dumps_give_the_same_requests(slime):
    _, live, imported = slime
    got, want = engine_requests(live), engine_requests(imported)
    assert len(want) > 10
    same = got[got["request_id"].isin(want["request_id"])].sort_values("request_id", ignore_index=True)
    want = want.sort_values("request_id", ignore_index=True)
    assert same[SAME].to_json(orient="records") == want[SAME].to_json(orient="records")


def test_each_request_holds_sglangs_meta_info(slime):
    metas, live, _ = slime
    req = engine_requests(live).set_index("request_id")
    answered = [i for i in req.index if i in metas]
    assert len(answered) == len(req) > 10  # every traced request is one the engine answered
    for rid in answered:
        m, r = metas[rid], req.loc[rid]
        assert (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]) == (
            m["prompt_tokens"], m["completion_tokens"], m["cached_tokens"])
        assert (r["queue_s"], r["e2e_s"], r["decode_throughput"]) == (m["queue_time"], m["e2e_latency"], m["decode_throughput"])
        assert (r["prefill_s"], r["decode_s"]) == (m["pd_prefill_forward_duration"], m["pd_decode_forward_duration"])
        assert r["kv_bytes"] == pytest.approx(m["pd_transfer_total_mb"] * 2**20)
        assert r["kv_transfer_s"] == pytest.approx(m["pd_decode_transfer_duration"])
        assert r["weight_version"] == int(m["weight_version"]) and r["version_from"] == "own"
        assert (r["engine"], r["role"], r["step_from"]) == ("sglang router", "disaggregated", "own")


def test_slimes_requests_in_the_serving_section(slime):
    metas, live, imported = slime
    for con in (live, imported):
        s = serving_section(con)
        assert s["missing"]["pd"].startswith("the requests went through a prefill/decode router")
        assert s["kv_bandwidth"] == pytest.approx(SPEED_GB_S * 2**30) and s["kv_bandwidth_from"] == "measured"
        c = s["prefix_cache"]
        answered = [m for m in metas.values() if m["id"] in set(engine_requests(con)["request_id"])]
        assert c["hit_rate"] == pytest.approx(sum(m["cached_tokens"] for m in answered) /
                                              sum(m["prompt_tokens"] for m in answered))
        # the stand-in keeps its cache across the update: the first request answered under version 2 hits, so
        # every version-2 hit is stale (a hit does not recompute the prefix the old weights computed)
        v2 = sorted((m for m in answered if m["weight_version"] == "2"), key=lambda m: _start(con, m["id"]))
        assert v2[0]["cached_tokens"] > 0
        stale = [m for m in v2 if m["cached_tokens"] > 0]
        assert [(h["engine"], h["weight_version"], h["request"], h["cached_tokens"]) for h in c["stale_hits"]] == [
            ("sglang router", 2, m["id"], m["cached_tokens"]) for m in stale]
        assert c["stale_cached_tokens"] == sum(m["cached_tokens"] for m in stale) and c["may_be_stale_cached_tokens"] == 0
        assert c["hit_rate_within_version"] == pytest.approx(c["hit_rate"] - c["stale_cached_tokens"] / c["prompt_tokens"])


def _start(con, request_id: str) -> int:
    req = engine_requests(con)
    return int(req.loc[req["request_id"] == request_id, "start_ns"].iloc[0])
