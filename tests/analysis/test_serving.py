"""The report's `serving` section from rltrace's own spans and SGLang-named spans: roles from span
attributes and SGLang's disaggregation mode, B_KV measured from KV-transfer spans, a hybrid model's
cache budget at the run's peak load, delta weight sync, and a run without any engine request.

Runs are hand-built with exact times (`rltrace.testing.RunBuilder`, the real store writer); its
keyword attributes are stored as `rltrace.phase(**attrs)` stores them (`rl.<key>`)."""

from __future__ import annotations

import json

import pytest

from rltrace import report, store
from rltrace.analysis import configure_serving, engine_requests
from rltrace.analysis._format import size_text
from rltrace.store import rows as store_rows
from rltrace.testing import RunBuilder

from .test_cache_geometry import C_A, C_R_FP32_SSM, QWEN3_NEXT

GQA = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
       "torch_dtype": "bfloat16"}


def _report(run_dir, **options) -> dict:
    con = store.open(run_dir)
    configure_serving(con, **options)
    return report.plain(report.build(con))


def test_rltrace_phases_are_engine_requests_with_their_role_and_a_measured_kv_link(tmp_path):
    """`generate` phases carrying request fields and the role as a span attribute (`rl.engine.role`),
    and `kv_transfer` phases with `rl.bytes`: 100 MB in 0.1 s each, 1 GB/s measured."""
    b = RunBuilder(tmp_path / "run")
    engines = {"prefill": (b.process("sglang", 0), 0.05), "decode": (b.process("sglang", 1), 0.2)}
    for role, (proc, length) in engines.items():
        for k in range(10):
            proc.span("generate", k * length, (k + 1) * length, step=3, prompt_tokens=500, cached_tokens=0,
                      e2e_latency=length, request_id=f"{role}-{k}", **{"rl.engine.role": role})
    for k in range(4):
        engines["prefill"][0].span("kv_transfer", 10 + k, 10.1 + k, step=3, bytes=100_000_000)
    b.write()
    req = engine_requests(store.open(b.run_dir))
    assert len(req) == 20 and set(req["step_from"]) == {"own"} and set(req["engine"]) == {"rltrace-sglang-prefill-0", "rltrace-sglang-decode-1"}
    assert req.groupby("role")["request_id"].apply(lambda r: sorted(r)[0]).to_dict() == {"decode": "decode-0", "prefill": "prefill-0"}
    r = _report(b.run_dir, model=GQA)
    p = r["serving"]["pd"]
    assert (p["mu_prefill"], p["mu_decode"]) == (pytest.approx(20.0), pytest.approx(5.0))
    assert p["kv_bandwidth"] == pytest.approx(1e9) and p["kv_bandwidth_from"] == "measured"
    assert p["kv_transfer_rps"] == pytest.approx(1e9 / (500 * 57_344))  # 34.9 req/s
    assert p["limit"] == "decode" and p["lambda_max"] == pytest.approx(5.0)
    assert "decode limits the rollout at 5 req/s (prefill could serve 20 req/s)" in " ".join(r["findings"])


def test_sglang_disaggregation_mode_in_the_span_name_gives_the_role(tmp_path):
    """SGLang names a request's root span `prefill Req <rid>` / `decode Req <rid>` in PD mode, `" Req <rid>"` unified."""
    b = RunBuilder(tmp_path / "run")
    proc = b.process("sglang", 0)
    for i, name in enumerate(("prefill Req 1a2b3c4d", "decode Req 1a2b3c4d", " Req 9f8e7d6c")):
        proc.spans.append(store_rows.span_row(  # SGLang's own attribute names, without rltrace's `rl.` prefix
            trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", parent_span_id=None, name=name, phase=None, step=1,
            weight_version=None, start_ns=b.t0_ns + i * 10**9, end_ns=b.t0_ns + i * 10**9 + 5 * 10**8, status="UNSET",
            thread_id=1, thread_name="MainThread", attributes={"gen_ai.latency.e2e": 0.5, "rid": f"r{i}"}))
    b.write()
    req = engine_requests(store.open(b.run_dir))
    assert req[["name", "role", "request_id"]].values.tolist() == [
        ["prefill Req 1a2b3c4d", "prefill", "r0"], ["decode Req 1a2b3c4d", "decode", "r1"], [" Req 9f8e7d6c", "unified", "r2"]]


def test_a_hybrid_model_at_64_slots_is_dominated_by_its_recurrent_state(tmp_path):
    """64 requests at once on one engine, 1,000 prompt + 1,000 completion tokens each: N = 128,000
    tokens of attention KV, K = 64 state slots of 77.3 MB (the config asks for an fp32 SSM state)."""
    b = RunBuilder(tmp_path / "run")
    proc = b.process("vllm", 0)
    for k in range(64):
        proc.span("generate", 0.01 * k, 5.0, step=1, prompt_tokens=1000, completion_tokens=1000, e2e_latency=5.0)
    proc.span("generate", 6.0, 7.0, step=1, prompt_tokens=1000, completion_tokens=1000, e2e_latency=1.0)
    b.write()
    model = {**QWEN3_NEXT, "mamba_ssm_dtype": "float32"}
    r = _report(b.run_dir, model=model)
    budget = r["serving"]["budget"]
    attention, state = 128_000 * C_A, 64 * C_R_FP32_SSM
    assert (budget["slots"], budget["tokens"]) == (64, 128_000)
    assert (budget["attention_bytes"], budget["state_bytes"]) == (attention, state)
    assert budget["pool_ratio"] == pytest.approx(state / attention)
    assert budget["fp8"]["c_A"] == C_A // 2 and budget["fp8"]["attention_bytes"] == attention / 2
    sentence = (f"an FP8 KV cache halves c_A (24.6 kB → 12.3 kB per token) and leaves c_R (77.3 MB per state slot): "
                f"with 64 slots the recurrent state dominates the budget ({state / (attention + state):.0%} of the "
                f"{size_text(attention + state)} rltrace-vllm-0 held at its peak).")
    assert sentence in r["findings"]
    fp8 = _report(b.run_dir, model=model, kv_dtype="fp8_e4m3")
    assert fp8["serving"]["budget"]["fp8"] is None and fp8["serving"]["budget"]["attention_bytes"] == attention / 2
    assert any(f.startswith("c_A is 12.3 kB per token (fp8_e4m3 KV cache) and c_R 77.3 MB per state slot") for f in fp8["findings"])


@pytest.mark.parametrize(("diff_s", "worth"), [(0.3, True), (1.0, False)])
def test_delta_sync_compares_the_transfer_it_saves_with_what_it_adds(tmp_path, diff_s, worth):
    """16 GB of weights, 2 GB changed and sent in 0.2 s (10 GB/s): 1.4 s saved per sync, against
    snapshot 0.1 + diff + encode 0.2 + rebuild 0.4 s (the rebuild on two workers at once: the slowest counts)."""
    b = RunBuilder(tmp_path / "run")
    trainer, w1, w2 = b.process("trainer"), b.process("rollout", 0), b.process("rollout", 1)
    for step in range(3):
        t = 10.0 * step
        sync = trainer.span("weight_sync", t, t + 2.0, step=step, bytes=16e9, method="delta")
        trainer.span("snapshot", t, t + 0.1, step=step, parent=sync)
        trainer.span("diff", t + 0.1, t + 0.1 + diff_s, step=step, parent=sync)
        trainer.span("encode", t + 0.5, t + 0.7, step=step, parent=sync)
        trainer.span("transfer", t + 0.7, t + 0.9, step=step, parent=sync, bytes_delta=2e9)
        w1.span("rebuild", t + 0.9, t + 1.3, step=step, parent=sync)
        w2.span("rebuild", t + 0.9, t + 1.2, step=step, parent=sync)
    b.write()
    r = _report(b.run_dir)
    d = r["serving"]["delta_sync"]
    cost = 0.1 + diff_s + 0.2 + 0.4
    assert (d["syncs"], d["bytes_mean"], d["bytes_delta_mean"]) == (3, 16e9, 2e9)
    assert d["bandwidth"] == pytest.approx(1e10) and d["bandwidth_from"] == "delta transfer"
    assert d["saved_s_mean"] == pytest.approx(1.4) and d["cost_s_mean"] == pytest.approx(cost)
    assert d["costs"] == pytest.approx({"snapshot": 0.1, "diff": diff_s, "encode": 0.2, "rebuild": 0.4})
    assert d["net_s_mean"] == pytest.approx(1.4 - cost) and d["worth_it"] is worth
    text = " ".join(r["findings"])
    if worth:
        assert "Delta weight sync pays: it saves 1.40 s of transfer per sync (16.0 GB → 2.00 GB at 10.0 GB/s" in text
    else:
        assert ("Delta weight sync does not pay: it saves 1.40 s of transfer per sync (16.0 GB → 2.00 GB at 10.0 GB/s "
                "(delta transfer)) but snapshot, diff, encode, rebuild cost 1.70 s (largest: diff, 1.00 s)") in text


def test_a_run_without_engine_requests_says_what_is_missing(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("train", 0.0, 1.0, step=0)
    b.write()
    s = _report(b.run_dir)["serving"]
    assert s["requests"] == 0 and s["engines"] == [] and s["timeline"] == [] and s["delta_sync"] is None
    assert all(s[k] is None for k in ("kv_bytes_per_token", "kv_bytes_per_request_mean", "pd", "prefix_cache", "hicache"))
    assert set(s["missing"]) >= {"requests", "kv_bytes_per_token", "pd", "prefix_cache", "hicache", "budget"}
    json.dumps(s)  # every value plain JSON


def test_the_timeline_accounts_for_every_request(tmp_path):
    """Requests in flight per bin integrate to each engine's request time; completions add up."""
    b = RunBuilder(tmp_path / "run")
    proc = b.process("vllm", 0)
    for k in range(30):
        proc.span("generate", 0.1 * k, 0.1 * k + 0.25 + 0.01 * (k % 3), step=1, e2e_latency=0.25, prompt_tokens=10)
    b.write()
    s = _report(b.run_dir)["serving"]
    rows = s["timeline"]
    assert len(rows) == 100 and {r["engine"] for r in rows} == {"rltrace-vllm-0"}
    seconds = sum(r["in_flight"] * r["bin_s"] for r in rows)
    assert seconds == pytest.approx(sum(0.25 + 0.01 * (k % 3) for k in range(30)), rel=1e-6)
    assert sum(r["completed_rps"] * r["bin_s"] for r in rows) == pytest.approx(30)


def test_only_span_parts_that_may_hold_engine_requests_are_scanned_for_them(tmp_path, monkeypatch):
    """Each large span part's writer records whether any of its spans could be an engine request
    (`META_ENGINE_ROWS`): the requests sidecar skips parts marked 0 (a trainer's) and scans the
    others, marked 1, or unmarked (small, or written before the mark existed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rltrace import _names
    from rltrace.store import parts as store_parts
    from rltrace.store.parts import may_hold_engine_rows, write_part

    small = _one_span_part(tmp_path)
    assert _names.META_ENGINE_ROWS not in pq.read_metadata(small).metadata  # small parts: cheap to scan, not marked
    monkeypatch.setattr(store_parts, "MARK_ROWS", 0)  # mark these small parts as if they were large
    b = RunBuilder(tmp_path / "run")
    trainer, engine = b.process("trainer"), b.process("sglang", 0)
    trainer.span("train", 0, 1, step=0)
    for k in range(3):
        engine.span("generate", k, k + 0.5, step=0, e2e_latency=0.5, request_id=f"r{k}")
    b.write()
    parts = {pq.read_table(p, columns=["process_id"])["process_id"][0].as_py(): p
             for p in (b.run_dir / "spans").glob("*.parquet")}
    mark = {pid: pq.read_metadata(p).metadata[_names.META_ENGINE_ROWS] for pid, p in parts.items()}
    assert mark == {trainer.process_id: b"0", engine.process_id: b"1"}

    def requests(cache: str) -> int:
        monkeypatch.setenv("RLTRACE_SUMMARY_CACHE_DIR", str(tmp_path / cache))
        return len(engine_requests(store.open(b.run_dir)))

    assert requests("c1") == 3
    path = parts[engine.process_id]
    table = pq.read_table(path)
    write_part(path.parent, path.name, table, _names.SPANS, {_names.META_ENGINE_ROWS: b"0"})  # as if marked 0
    assert requests("c2") == 0  # not scanned: the mark is trusted
    meta = {k: v for k, v in pq.read_metadata(path).metadata.items() if k != _names.META_ENGINE_ROWS}
    pq.write_table(table.replace_schema_metadata(meta), path)  # a part from before the mark: scanned
    assert requests("c3") == 3

    def spans(**columns) -> pa.Table:
        return pa.table({c: pa.array(v, pa.string()) for c, v in columns.items()})

    assert may_hold_engine_rows(spans(name=["sglang_pd_prefill"], phase=[None], attributes=["{}"]))
    assert may_hold_engine_rows(spans(name=["x"], phase=["kv_transfer"], attributes=[None]))
    assert may_hold_engine_rows(spans(name=["x"], phase=[None], attributes=['{"gen_ai.latency.time_in_queue": 0.1}']))
    dictionary = pa.table({"name": pa.array(["a", "kv_transfer"]).dictionary_encode(), "attributes": pa.array(["{}", "{}"])})
    assert may_hold_engine_rows(dictionary)
    assert not may_hold_engine_rows(spans(name=["forward"], phase=["train"], attributes=['{"rl.micro_batches": 2}']))


def _one_span_part(tmp_path):
    b = RunBuilder(tmp_path / "one")
    b.process("trainer").span("train", 0, 1, step=0)
    b.write()
    return next((b.run_dir / "spans").glob("*.parquet"))


def test_a_group_id_on_the_request_span_itself_refines_stale_hits(tmp_path):
    """rltrace's own `generate` spans carrying the request's tokens and `group_id` (as
    `rltrace.phase("generate", group_id=g, prompt_tokens=..., cached_tokens=...)` records them): after
    a sync recorded as not flushing, group 3's four requests hit 200, 1,000, 1,000, 1,000 of a
    1,000-token prompt: 800 stale tokens, exact. On a second engine the same hits without a group
    count whole (3,200, at most), and the run's figure is "at most"."""
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    trainer.span("weight_sync", 0.0, 0.1, step=0, weight_version=1)
    trainer.span("rollout", 0.2, 1.0, step=1)
    trainer.span("weight_sync", 1.0, 1.1, step=1, weight_version=2, cache_flushed=False)
    trainer.span("rollout", 1.2, 3.0, step=2)
    for engine, group in ((0, {"group_id": 3}), (1, {})):
        proc = b.process("vllm", engine)
        proc.span("generate", 0.3, 0.4, prompt_tokens=1000, cached_tokens=0, e2e_latency=0.1)
        for k, cached in enumerate([200, 1000, 1000, 1000]):
            proc.span("generate", 1.2 + 0.1 * k, 1.25 + 0.1 * k, prompt_tokens=1000, cached_tokens=cached,
                      e2e_latency=0.05, **group)
    b.write()
    c = _report(b.run_dir)["serving"]["prefix_cache"]
    assert [(u["engine"], u["stale_tokens"], u["stale_kind"]) for u in c["updates"]] == [
        ("rltrace-vllm-0", 800, "exact"), ("rltrace-vllm-1", 3200, "at most")]
    assert (c["stale_cached_tokens"], c["stale_kind"]) == (4000, "at most")
    assert engine_requests(store.open(b.run_dir)).dropna(subset=["group_id"])["group_id"].tolist() == ["3"] * 4
