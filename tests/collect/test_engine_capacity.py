"""Known answers for the report's `serving` section, sent the way engines send them: each engine a
separate process tracing its requests with the engine's **own** code (vLLM 0.34.0's
`OutputProcessor.do_tracing`, SGLang 0.5.23's `TraceReqContext` and `convert_to_span_attrs`, loaded
from ../shared/engine_src by tests/engine_code.py; tests/collect/engine_own_sender.py) through the
real OpenTelemetry SDK into `rltrace collect`, next to the trainer's own rollout and weight_sync spans.
The one hand-written sender (tests/collect/engine_sender.py) is used where labelled: spans carrying
both cached tokens and a prefill compute time, which neither engine's own spans do."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from rltrace import analysis, store
from rltrace.cli import main
from rltrace.collect import Limits, Receiver
from rltrace.testing import T0_NS, RunBuilder

from .. import engine_code
from ..conftest import PYTHON, python_env, unavailable

HERE = Path(__file__).parent
MS = 1_000_000
GQA = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
       "head_dim": 128, "hidden_size": 3584, "torch_dtype": "bfloat16"}  # 2 · 28 · 4 · 128 · 2 B = 57,344 B/token


def request(rid: str, start_ms: float, end_ms: float, *, prompt=1000, completion=1, cached=0, prefill_s=0.02,
            queue_s=0.001, role="unified") -> dict:
    start, end = T0_NS + round(start_ms * MS), T0_NS + round(end_ms * MS)  # vLLM keeps arrival as float seconds
    # (int(arrival_time * 1e9): times within a microsecond, rates to 1e-5)
    return {"id": rid, "start_ns": start, "end_ns": end, "prompt_tokens": prompt, "completion_tokens": completion,
            "cached_tokens": cached, "queue_s": queue_s, "ttft_s": queue_s + prefill_s, "prefill_s": prefill_s,
            "decode_s": (end - start) / 1e9 - prefill_s - queue_s, "role": role}


def send(tmp_path: Path, receiver: Receiver, engines: dict[str, tuple[str, list[dict]]], engine: str | None = "vllm",
         *, service: str | None = None, old_sdk: bool = False) -> None:
    """One sender process per engine, at once: {name: (OTEL_RESOURCE_ATTRIBUTES, requests)}, traced by
    `engine`'s own code (None: the hand-written sender)."""
    if engine is not None and engine_code.missing(engine):
        unavailable(engine_code.missing(engine))
    procs = []
    for name, (attrs, requests) in engines.items():
        spec = tmp_path / f"engine-{name}.json"
        spec.write_text(json.dumps(requests))
        env = python_env(OTEL_SERVICE_NAME=service or engine or "vllm",
                         OTEL_RESOURCE_ATTRIBUTES=",".join(a for a in ("host.name=gpu-node", attrs) if a))
        argv = ([str(HERE / "engine_own_sender.py"), engine] if engine else [str(HERE / "engine_sender.py")])
        procs.append(subprocess.Popen([PYTHON, *argv, receiver.url, str(spec), *(["--old-sdk"] if old_sdk else [])],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    receiver.close()


def report(capsys, run_dir: Path, *flags: str) -> dict:
    assert main(["report", str(run_dir), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory) -> tuple[Path, Path]:
    """2 vLLM prefill engines at 40 req/s while busy (40 back-to-back requests of 25 ms each) and 2
    decode engines at 10 req/s (4 at a time, 400 ms each, 10 waves): 1,000-token prompts, inside step
    1's rollout. Instances numbered per role as the docs show (prefill 0 and 1, decode 0 and 1)."""
    tmp = tmp_path_factory.mktemp("pd")
    b = RunBuilder(tmp / "run")
    b.process("trainer").span("rollout", 0.0, 5.0, step=1)
    b.write()
    prefill = {f"p{i}": (f"service.instance.id={i},rl.engine.role=prefill",
                         [request(f"p{i}-{k}", 100 + 25 * k, 125 + 25 * k) for k in range(40)]) for i in (0, 1)}
    decode = {f"d{i}": (f"service.instance.id={i},rl.engine.role=decode",
                        [request(f"d{i}-{w}-{k}", 150 + 400 * w, 550 + 400 * w, completion=300)
                         for w in range(10) for k in range(4)]) for i in (0, 1)}
    receiver = Receiver(tmp / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp, receiver, prefill | decode)
    config = tmp / "model"
    config.mkdir()
    (config / "config.json").write_text(json.dumps(GQA))
    return tmp / "run", config


def test_decode_limits_two_prefill_and_two_decode_engines(pd_run, capsys):
    run_dir, model = pd_run
    r = report(capsys, run_dir, "--model", str(model))
    s = r["serving"]
    assert s["requests"] == 160 and s["kv_bytes_per_token"] == 57_344 and s["state_bytes_per_slot"] is None
    assert {(e["engine"], e["role"], e["requests"]) for e in s["engines"]} == {
        ("vllm-prefill-0", "prefill", 40), ("vllm-prefill-1", "prefill", 40), ("vllm-decode-0", "decode", 40),
        ("vllm-decode-1", "decode", 40)}
    p = s["pd"]
    assert (p["prefill_engines"], p["decode_engines"]) == (2, 2)
    assert p["mu_prefill"] == pytest.approx(40.0, rel=1e-5) and p["mu_decode"] == pytest.approx(10.0, rel=1e-5)
    assert p["lambda_max"] == pytest.approx(20.0, rel=1e-5) and p["limit"] == "decode"
    assert p["prefill_share_balanced"] == pytest.approx(0.2, rel=1e-5)
    assert p["split"] == {"engines": 4, "prefill": 1, "decode": 3, "lambda": pytest.approx(30.0, rel=1e-5), "limit": "decode"}
    assert [b["engines"] for b in p["splits"]] == list(range(2, 17)) and p["splits"][2] == p["split"]
    assert (p["splits"][6]["prefill"], p["splits"][6]["decode"]) == (2, 6)  # 8 engines: min(80, 60) → 60 req/s
    assert p["kv_transfer_rps"] is None and "pd.kv_transfer_rps" in s["missing"]  # no KV-transfer record, no flag
    assert s["kv_bytes_per_request_mean"] == pytest.approx(57_344_000)
    assert ("decode limits the rollout at 20 req/s (prefill could serve 80 req/s): move engines to decode; "
            "with 4 engines: 1 prefill + 3 decode → 30 req/s.") in " ".join(r["findings"])
    con = store.open(run_dir)
    requests = analysis.engine_requests(con)
    assert set(requests["step"]) == {1} and set(requests["step_from"]) == {"rollout window"}
    assert set(requests["request_id"].str[:1]) == {"p", "d"} and set(requests["engine_kind"]) == {"vllm"}
    pids = con.execute("SELECT pid FROM processes WHERE service_name = 'vllm'").fetchall()
    assert len(pids) == 4 and all(p > 0 for (p,) in pids)  # vLLM's vllm.process_id: rltrace info shows its pid
    # vLLM's own meaning: time_in_model_prefill is scheduled → first token (its queue is apart)
    assert requests["prefill_s"].to_numpy() == pytest.approx(0.02) and requests["queue_s"].to_numpy() == pytest.approx(0.001)
    # vLLM never sets gen_ai.usage.cached_tokens: the report says where its prefix-cache figures are
    assert requests["cached_tokens"].isna().all()
    assert s["prefix_cache"] is None and "vllm:prefix_cache_hits" in s["missing"]["prefix_cache"]


def test_sglang_prefill_and_decode_servers_keep_their_role_from_their_own_span_names(tmp_path, capsys):
    """SGLang in PD mode names each request's root span `prefill Req …` / `decode Req …` (its own
    TraceReqContext, no rl.engine.role set): prefill 0 and decode 0 (the same instance id, one host)
    stay two engines with their roles, and the split is the same known answer as vLLM's above."""
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("rollout", 0.0, 5.0, step=1)
    b.write()
    prefill = {f"p{i}": (f"service.instance.id={i}", [request(f"p{i}-{k}", 100 + 25 * k, 125 + 25 * k, role="prefill")
                                                       for k in range(40)]) for i in (0, 1)}
    decode = {f"d{i}": (f"service.instance.id={i}", [request(f"d{i}-{w}-{k}", 150 + 400 * w, 550 + 400 * w,
                                                             completion=300, role="decode")
                                                     for w in range(10) for k in range(4)]) for i in (0, 1)}
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, prefill | decode, "sglang")
    r = report(capsys, tmp_path / "run")
    s = r["serving"]
    assert {(e["engine"], e["role"], e["requests"]) for e in s["engines"]} == {
        ("sglang-prefill-0", "prefill", 40), ("sglang-prefill-1", "prefill", 40), ("sglang-decode-0", "decode", 40),
        ("sglang-decode-1", "decode", 40)}
    p = s["pd"]
    assert (p["prefill_engines"], p["decode_engines"]) == (2, 2) and p["limit"] == "decode"
    assert p["lambda_max"] == pytest.approx(20.0, rel=1e-4)
    assert p["split"] == {"engines": 4, "prefill": 1, "decode": 3, "lambda": pytest.approx(30.0, rel=1e-4), "limit": "decode"}
    assert "with 4 engines: 1 prefill + 3 decode → 30 req/s." in " ".join(r["findings"])
    names = set(analysis.engine_requests(store.open(tmp_path / "run"))["name"].str.split().str[0])
    assert names == {"prefill", "decode"}  # the role came from SGLang's span names


def test_a_slow_kv_link_limits_instead(pd_run, capsys):
    run_dir, model = pd_run
    s = report(capsys, run_dir, "--model", str(model), "--kv-bandwidth", "1e9")["serving"]
    p = s["pd"]
    assert p["kv_transfer_rps"] == pytest.approx(1e9 / 57_344_000)  # 17.44 req/s
    assert round(p["lambda_max"], 1) == 17.4 and p["limit"] == "kv_transfer"
    assert (p["kv_bandwidth"], p["kv_bandwidth_from"]) == (1e9, "given")
    fp8 = report(capsys, run_dir, "--model", str(model), "--kv-bandwidth", "1e9", "--kv-dtype", "fp8_e4m3")["serving"]
    assert fp8["kv_bytes_per_token"] == 28_672 and fp8["pd"]["limit"] == "decode"  # half the KV: 34.9 req/s over the link


def test_without_a_model_the_kv_link_is_named_as_unchecked(pd_run, capsys):
    run_dir, _ = pd_run
    r = report(capsys, run_dir, "--kv-bandwidth", "1e9")
    s = r["serving"]
    assert s["kv_bytes_per_token"] is None and s["pd"]["limit"] == "decode"
    assert s["missing"]["kv_bytes_per_token"].startswith("no model config")
    assert "KV transfer not checked: no model config" in " ".join(r["findings"])


def _two_versions(run_dir: Path, flushed: bool | None = None) -> None:
    """The trainer's spans: weight versions 1 then 2, step 1's rollout then step 2's; the second sync
    records whether the engines' prefix cache was flushed when `flushed` is given."""
    b = RunBuilder(run_dir)
    trainer = b.process("trainer")
    trainer.span("weight_sync", 0.0, 0.1, step=0, weight_version=1)
    trainer.span("rollout", 0.2, 1.0, step=1)
    trainer.span("weight_sync", 1.0, 1.1, step=1, weight_version=2,
                 **({} if flushed is None else {"cache_flushed": flushed}))
    trainer.span("rollout", 1.2, 2.0, step=2)
    b.write()


def _requests(cached: list[int], prefill_s=None) -> list[dict]:
    """1,000-token prompts at 200, 400, 600 ms (version 1), then 1,200 ms on (version 2)."""
    starts = [200, 400, 600, 1200, 1400, 1600, 1800][:len(cached)]
    return [request(f"req-{k + 1}", t, t + 100, cached=c, prefill_s=(1000 - c) * 1e-4 if prefill_s is None else prefill_s)
            for k, (t, c) in enumerate(zip(starts, cached))]


def test_sglang_every_hit_after_an_unflushed_update_is_stale(tmp_path, capsys):
    """Two SGLang servers (its own tracing code), no flush recorded. sglang-0's first version-2 request
    already hits (500 tokens): its cache was kept, so its later hit (800) is stale too: 1,300.
    sglang-1's first version-2 request misses: its 800-token hit may be stale, counted apart."""
    _two_versions(tmp_path / "run")
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {"0": ("service.instance.id=0", _requests([0, 600, 0, 500, 0, 800], prefill_s=0.05)),
                              "1": ("service.instance.id=1", _requests([0, 600, 0, 0, 0, 800], prefill_s=0.05))},
         "sglang")
    r = report(capsys, tmp_path / "run")
    s = r["serving"]
    assert {e["engine"] for e in s["engines"]} == {"sglang-0", "sglang-1"}
    c = s["prefix_cache"]
    assert [(h["engine"], h["request"], h["cached_tokens"]) for h in c["stale_hits"]] == [
        ("sglang-0", "req-4", 500), ("sglang-0", "req-6", 800)]
    assert (c["stale_cached_tokens"], c["may_be_stale_cached_tokens"], c["may_be_stale_hit_count"]) == (1300, 800, 1)
    assert [(u["engine"], u["cache"], u["hits"]) for u in c["updates"]] == [
        ("sglang-0", "not flushed", 2), ("sglang-1", "not recorded", 1)]
    assert c["hit_rate"] == pytest.approx(3300 / 12000)
    assert c["hit_rate_within_version"] == pytest.approx(1200 / 12000)  # version 1's hits only are known valid
    text = " ".join(r["findings"])
    assert ("engine sglang-0 kept its prefix cache across the update to weight version 2 (its first request after the "
            "update already hit the cache): its 2 hits since (1,300 cached tokens) hold at most 1,300 stale tokens "
            "(every hit after an unflushed update; a group's later requests also hit what its first computed with the "
            "new weights), a mismatch source.") in text
    # no request is joined to its sample group: the count is an upper bound, and says so
    assert c["stale_kind"] == "at most" and [u["stale_kind"] for u in c["updates"]] == ["at most", None]
    assert [h["stale_tokens"] for h in c["stale_hits"]] == [500, 800]
    assert "1 hit (800 cached tokens) after weight updates may be stale" in text
    # SGLang's own meaning: time_in_model_prefill = dispatch → first token, its scheduler queue included
    requests = analysis.engine_requests(store.open(tmp_path / "run"))
    assert set(requests["engine_kind"]) == {"sglang"} and requests["prefill_s"].isna().all()
    assert requests["ttft_s"].to_numpy() == pytest.approx(0.0005 + 0.001 + 0.05, abs=1e-6)  # float seconds
    assert s["hicache"]["prefill_s_per_token"] is None
    assert "scheduler queueing included" in s["missing"]["hicache.prefill_s_per_token"]


def test_sglang_a_recorded_flush_decides(tmp_path, capsys):
    """The syncs record rl.cache_flushed: version 2's did not flush, version 3's did. Each version opens
    with a new prompt (no hit), then the old group hits 3,500 tokens: stale after the sync that kept
    the cache (the old rule, the first request per version, counted 0), valid after the one that flushed."""
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    for version, (t, flushed) in enumerate([(0.0, None), (1.0, False), (2.0, True)], start=1):
        trainer.span("weight_sync", t, t + 0.1, step=version - 1, weight_version=version,
                     **({} if flushed is None else {"cache_flushed": flushed}))
        trainer.span("rollout", t + 0.2, t + 1.0, step=version)
    b.write()
    cached = [0, 600, 0, 0, 3500, 0, 3500]
    starts = [200, 400, 600, 1200, 1400, 2200, 2400]
    requests = [request(f"req-{k + 1}", t, t + 100, cached=c, prefill_s=0.05) for k, (t, c) in enumerate(zip(starts, cached))]
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {"0": ("service.instance.id=0", requests)}, "sglang")
    c = report(capsys, tmp_path / "run")["serving"]["prefix_cache"]
    assert (c["stale_cached_tokens"], c["may_be_stale_cached_tokens"], c["stale_kind"]) == (3500, 0, "at most")
    assert [(u["weight_version"], u["cache"], u["cached_tokens"]) for u in c["updates"]] == [
        (2, "not flushed", 3500), (3, "flushed", 3500)]
    requests = analysis.engine_requests(store.open(tmp_path / "run"))
    assert requests.groupby("weight_version")["cache_flushed"].agg(lambda v: v.tolist()).to_dict() == {
        1: [pd.NA] * 3, 2: [False] * 2, 3: [True] * 2}


def _traceparent(span) -> str:
    """The W3C header `rltrace.inject()` gives inside that span: the engine's request span becomes its child."""
    return f"00-{span.trace_id}-{span.span_id}-01"


def _group_run(run_dir: Path, groups: dict[str, list[tuple[float, float]]], via_parent: set[str] = frozenset()):
    """Weight versions 1 then 2 (the second sync recorded not flushing), and each sample's caller span
    in step 2's rollout: `rltrace.phase("generate", group_id=g)` around its engine call, or (groups in
    `via_parent`) a `group` span with the group id and an unnamed `generate` below it per sample.
    Returns {group: [caller spans, one per sample]}."""
    b = RunBuilder(run_dir)
    trainer = b.process("trainer")
    trainer.span("weight_sync", 0.0, 0.1, step=0, weight_version=1)
    trainer.span("rollout", 0.2, 1.0, step=1)
    trainer.span("weight_sync", 1.0, 1.1, step=1, weight_version=2, cache_flushed=False)
    trainer.span("rollout", 1.2, 3.0, step=2)
    callers = {}
    for g, spans in groups.items():
        if g in via_parent:
            top = trainer.span("group", spans[0][0], spans[-1][1], step=2, group_id=g)
            callers[g] = [trainer.span("generate", a, z, step=2, parent=top) for a, z in spans]
        else:
            callers[g] = [trainer.span("generate", a, z, step=2, group_id=g) for a, z in spans]
    b.write()
    return callers


def test_sglang_a_groups_later_requests_are_stale_only_in_what_its_first_found(tmp_path, capsys):
    """GRPO: one group of 4 samples shares a 1,000-token prompt of which 200 tokens were cached before
    the update that did not flush. SGLang's own request spans continue each sample's trace (the caller
    passed `rltrace.inject()`): the first request hits 200 (old), the other three hit 1,000 each, of
    which the same 200 are old, the rest computed by the first with the new weights: 800 stale tokens,
    exact (every hit joined to its group), not 3,200."""
    callers = _group_run(tmp_path / "run", {"7": [(1.2 + 0.2 * k, 1.3 + 0.2 * k) for k in range(4)]})
    requests = [request(f"req-{k + 1}", t, t + 100, cached=c, prefill_s=0.05)
                for k, (t, c) in enumerate(zip([200, 400, 600], [0, 600, 0]))]
    requests += [dict(request(f"g7-{k}", 1200 + 200 * k, 1300 + 200 * k, cached=c, prefill_s=0.05),
                      traceparent=_traceparent(callers["7"][k])) for k, c in enumerate([200, 1000, 1000, 1000])]
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {"0": ("service.instance.id=0", requests)}, "sglang")
    r = report(capsys, tmp_path / "run")
    c = r["serving"]["prefix_cache"]
    assert (c["stale_cached_tokens"], c["stale_kind"], c["stale_hit_count"]) == (800, "exact", 4)
    assert [(h["request"], h["cached_tokens"], h["stale_tokens"]) for h in c["stale_hits"]] == [
        ("g7-0", 200, 200), ("g7-1", 1000, 200), ("g7-2", 1000, 200), ("g7-3", 1000, 200)]
    assert [(u["engine"], u["cache"], u["hits"], u["cached_tokens"], u["stale_tokens"], u["stale_kind"])
            for u in c["updates"]] == [("sglang-0", "not flushed", 4, 3200, 800, "exact")]
    assert c["hit_rate_within_version"] == pytest.approx((600 + 3200 - 800) / 7000)
    assert ("engine sglang-0 kept its prefix cache across the update to weight version 2 (recorded by the weight sync "
            "(rl.cache_flushed)): its 4 hits since (3,200 cached tokens) hold exactly 800 stale tokens (each sample "
            "group's first request found only old prefix; its later requests, what the first found), a mismatch source."
            ) in " ".join(r["findings"])
    rows = analysis.engine_requests(store.open(tmp_path / "run"))
    joined = rows[rows["request_id"].str.startswith("g7")]
    assert joined["group_id"].isna().all()  # SGLang's span names no group: its caller's does, one level up
    assert set(joined["trace_id"]) == {s.trace_id for s in callers["7"]}


def test_sglang_requests_without_a_group_keep_the_bound(tmp_path, capsys):
    """The same engine and version: group 7 as above (its group id on the caller's span: 800 stale),
    group 8 named two levels up (its `group` span; 100 old cached, then 500: 100 + 100 stale) and one
    request whose caller passed no trace context (300 cached, counted whole): 1,300 stale tokens,
    "at most", since not every hit was joined to its group."""
    callers = _group_run(tmp_path / "run", {"7": [(1.2 + 0.1 * k, 1.25 + 0.1 * k) for k in range(4)],
                                            "8": [(1.7, 1.75), (1.8, 1.85)]}, via_parent={"8"})
    requests = [request("req-1", 200, 300, cached=0, prefill_s=0.05)]
    requests += [dict(request(f"g7-{k}", 1200 + 100 * k, 1250 + 100 * k, cached=c, prefill_s=0.05),
                      traceparent=_traceparent(callers["7"][k])) for k, c in enumerate([200, 1000, 1000, 1000])]
    requests += [dict(request(f"g8-{k}", 1700 + 100 * k, 1750 + 100 * k, cached=c, prefill_s=0.05),
                      traceparent=_traceparent(callers["8"][k])) for k, c in enumerate([100, 500])]
    requests += [request("lone", 1900, 1950, cached=300, prefill_s=0.05)]
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {"0": ("service.instance.id=0", requests)}, "sglang")
    r = report(capsys, tmp_path / "run")
    c = r["serving"]["prefix_cache"]
    assert [(h["request"], h["stale_tokens"]) for h in c["stale_hits"]] == [
        ("g7-0", 200), ("g7-1", 200), ("g7-2", 200), ("g7-3", 200), ("g8-0", 100), ("g8-1", 100), ("lone", 300)]
    assert (c["stale_cached_tokens"], c["stale_kind"]) == (1300, "at most")
    assert [(u["stale_tokens"], u["stale_kind"]) for u in c["updates"]] == [(1300, "at most")]
    assert "hold at most 1,300 stale tokens (every hit after an unflushed update;" in " ".join(r["findings"])


def test_sglang_servers_of_one_host_without_an_instance_id_stay_apart(tmp_path, capsys):
    """An OTel SDK before 1.40 sets no service.instance.id: two SGLang servers of one host send equal
    resources. Their thread spans' pid keeps them two engines."""
    _two_versions(tmp_path / "run")
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {"a": ("", _requests([0, 600, 0])), "b": ("", _requests([0, 0]))}, "sglang", old_sdk=True)
    engines = report(capsys, tmp_path / "run")["serving"]["engines"]
    assert sorted(e["requests"] for e in engines) == [2, 3]
    assert all(e["engine"].startswith("sglang-") and e["engine"][7:].isdigit() for e in engines)  # sglang-<pid>


def test_hand_written_sender_hicache_with_cached_tokens_and_prefill_compute(tmp_path, capsys):
    """HAND-WRITTEN SENDER (tests/collect/engine_sender.py): vLLM-shaped spans that also carry
    gen_ai.usage.cached_tokens, which vLLM's own do_tracing never sets (and SGLang's prefill time
    includes queueing): the one way to give the prefill avoided by hits a known answer."""
    _two_versions(tmp_path / "run")
    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {0: ("service.instance.id=0", _requests([0, 600, 0, 500, 0, 800])),
                              1: ("service.instance.id=1", _requests([0, 600, 0, 0, 0, 800]))}, None)
    r = report(capsys, tmp_path / "run")
    s = r["serving"]
    assert s["pd"] is None and s["missing"]["pd"].startswith("unified deployment")
    c = s["prefix_cache"]
    assert (c["stale_cached_tokens"], c["may_be_stale_cached_tokens"]) == (1300, 800)
    h = s["hicache"]
    assert h["prefill_s_per_token"] == pytest.approx(1e-4)
    assert h["avoided_prefill_s"] == pytest.approx(1200 * 1e-4)  # known-valid hits only (version 1)
    assert h["cache_io_s"] is None and h["net_gain_s"] is None and s["missing"]["hicache.cache_io_s"] == "not recorded"
    requests = analysis.engine_requests(store.open(tmp_path / "run"))
    assert requests.groupby("weight_version")["request_id"].count().to_dict() == {1: 6, 2: 6}
    assert set(requests["version_from"]) == {"weight_sync"}
