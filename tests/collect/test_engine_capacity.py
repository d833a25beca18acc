"""Known answers for the report's `serving` section, sent the way engines send them: each engine a
separate process exporting vLLM-shaped `llm_request` spans through the real OpenTelemetry SDK
(tests/collect/engine_sender.py; a stand-in for vLLM, which needs a GPU) into `rltrace collect`,
next to the trainer's own rollout and weight_sync spans."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rltrace import analysis, store
from rltrace.cli import main
from rltrace.collect import Limits, Receiver
from rltrace.testing import T0_NS, RunBuilder

from ..conftest import PYTHON, python_env

HERE = Path(__file__).parent
MS = 1_000_000
GQA = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
       "head_dim": 128, "hidden_size": 3584, "torch_dtype": "bfloat16"}  # 2 · 28 · 4 · 128 · 2 B = 57,344 B/token


def request(rid: str, start_ms: float, end_ms: float, *, prompt=1000, completion=1, cached=0, prefill_s=0.02) -> dict:
    start, end = T0_NS + round(start_ms * MS), T0_NS + round(end_ms * MS)
    return {"id": rid, "start_ns": start, "end_ns": end, "prompt_tokens": prompt, "completion_tokens": completion,
            "cached_tokens": cached, "queue_s": 0.001, "ttft_s": prefill_s + 0.001, "prefill_s": prefill_s,
            "decode_s": (end - start) / 1e9 - prefill_s - 0.001}


def send(tmp_path: Path, receiver: Receiver, engines: dict[str, tuple[str, list[dict]]]) -> None:
    """One sender process per engine, at once: {instance: (OTEL_RESOURCE_ATTRIBUTES extra, requests)}."""
    procs = []
    for instance, (extra, requests) in engines.items():
        spec = tmp_path / f"engine-{instance}.json"
        spec.write_text(json.dumps(requests))
        attrs = ",".join(a for a in (f"service.instance.id={instance}", "host.name=gpu-node", extra) if a)
        env = python_env(OTEL_SERVICE_NAME="vllm", OTEL_RESOURCE_ATTRIBUTES=attrs)
        procs.append(subprocess.Popen([PYTHON, str(HERE / "engine_sender.py"), receiver.url, str(spec)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    receiver.close()


def report(capsys, run_dir: Path, *flags: str) -> dict:
    assert main(["report", str(run_dir), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory) -> tuple[Path, Path]:
    """2 prefill engines at 40 req/s while busy (40 back-to-back requests of 25 ms each) and 2 decode
    engines at 10 req/s (4 at a time, 400 ms each, 10 waves): 1,000-token prompts, inside step 1's rollout."""
    tmp = tmp_path_factory.mktemp("pd")
    b = RunBuilder(tmp / "run")
    b.process("trainer").span("rollout", 0.0, 5.0, step=1)
    b.write()
    prefill = {i: ("rl.engine.role=prefill", [request(f"p{i}-{k}", 100 + 25 * k, 125 + 25 * k) for k in range(40)])
               for i in (0, 1)}
    decode = {i: ("rl.engine.role=decode", [request(f"d{i}-{w}-{k}", 150 + 400 * w, 550 + 400 * w, completion=300)
                                            for w in range(10) for k in range(4)]) for i in (2, 3)}
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
        ("vllm-0", "prefill", 40), ("vllm-1", "prefill", 40), ("vllm-2", "decode", 40), ("vllm-3", "decode", 40)}
    p = s["pd"]
    assert (p["prefill_engines"], p["decode_engines"]) == (2, 2)
    assert p["mu_prefill"] == pytest.approx(40.0) and p["mu_decode"] == pytest.approx(10.0)
    assert p["lambda_max"] == pytest.approx(20.0) and p["limit"] == "decode"
    assert p["prefill_share_balanced"] == pytest.approx(0.2)
    assert p["kv_transfer_rps"] is None and "pd.kv_transfer_rps" in s["missing"]  # no KV-transfer record, no flag
    assert s["kv_bytes_per_request_mean"] == pytest.approx(57_344_000)
    assert ("decode limits the rollout at 20 req/s (prefill could serve 80 req/s): move engines to decode, "
            "about 1 prefill : 4 decode balances them.") in " ".join(r["findings"])
    requests = analysis.engine_requests(store.open(run_dir))
    assert set(requests["step"]) == {1} and set(requests["step_from"]) == {"rollout window"}
    assert set(requests["request_id"].str[:1]) == {"p", "d"}


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


def test_a_stale_hit_after_a_weight_update_and_hits_within_a_version(tmp_path, capsys):
    """Two engines, weight versions 1 then 2 (the trainer's weight_sync spans). vllm-0 keeps its prefix
    cache across the update (500 cached tokens on its first version-2 request); vllm-1 flushes it."""
    b = RunBuilder(tmp_path / "run")
    trainer = b.process("trainer")
    trainer.span("weight_sync", 0.0, 0.1, step=0, weight_version=1)
    trainer.span("rollout", 0.2, 1.0, step=1)
    trainer.span("weight_sync", 1.0, 1.1, step=1, weight_version=2)
    trainer.span("rollout", 1.2, 2.0, step=2)
    b.write()

    def engine(stale: int) -> list[dict]:  # prompts of 1,000 tokens; prefill costs 0.1 ms per uncached token
        cached = [0, 600, 0, stale, 0, 800]
        starts = [200, 400, 600, 1200, 1400, 1600]
        return [request(f"req-{k + 1}", t, t + 100, cached=c, prefill_s=(1000 - c) * 1e-4)
                for k, (t, c) in enumerate(zip(starts, cached))]

    receiver = Receiver(tmp_path / "run", "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    send(tmp_path, receiver, {0: ("", engine(stale=500)), 1: ("", engine(stale=0))})
    r = report(capsys, tmp_path / "run")
    s = r["serving"]
    assert s["pd"] is None and s["missing"]["pd"].startswith("unified deployment")
    c = s["prefix_cache"]
    assert c["stale_hits"] == [{"engine": "vllm-0", "weight_version": 2, "request": "req-4", "cached_tokens": 500,
                                "start_ns": T0_NS + 1200 * MS, "step": 2}]
    assert c["hit_rate"] == pytest.approx(3300 / 12000)
    assert c["hit_rate_within_version"] == pytest.approx(2800 / 12000)
    by_version = {v["weight_version"]: v for v in c["per_version"]}
    assert by_version[1]["hit_rate"] == pytest.approx(1200 / 6000)
    assert (by_version[2]["hit_rate"], by_version[2]["hit_rate_within_version"]) == (
        pytest.approx(2100 / 6000), pytest.approx(1600 / 6000))
    h = s["hicache"]
    assert h["prefill_s_per_token"] == pytest.approx(1e-4)
    assert h["avoided_prefill_s"] == pytest.approx(2800 * 1e-4)  # valid hits only: the stale 500 tokens are not a gain
    assert h["cache_io_s"] is None and h["net_gain_s"] is None and s["missing"]["hicache.cache_io_s"] == "not recorded"
    text = " ".join(r["findings"])
    assert ("engine vllm-0 served 500 cached tokens to the first request after the update to weight version 2: "
            "its prefix cache was not flushed") in text
    assert "vllm-1 served" not in text
    requests = analysis.engine_requests(store.open(tmp_path / "run"))
    assert requests.groupby("weight_version")["request_id"].count().to_dict() == {1: 6, 2: 6}
    assert set(requests["version_from"]) == {"weight_sync"}
