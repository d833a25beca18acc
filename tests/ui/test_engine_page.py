"""The Engine page through Streamlit's AppTest, opened as the first page of a fresh dashboard: on a
run with a disaggregated engine fleet, stale prefix-cache hits and a hybrid model it draws every
figure with the report's numbers; on runs without engine requests (or without steps) it says
what is missing instead of drawing empty charts."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from rltrace import report, store
from rltrace.analysis import _format as fmt
from rltrace.testing import RunBuilder

from ..analysis.test_cache_geometry import QWEN3_NEXT
from .conftest import APP, RUN_TIMEOUT_S, no_exceptions
from .test_pages import charts, metrics, texts


def first_page(monkeypatch, run_dir) -> AppTest:
    """A fresh dashboard over `run_dir` whose first page is Engine (no other page ran before)."""
    monkeypatch.setenv("RLTRACE_UI_RUNS", json.dumps([str(run_dir)]))
    at = AppTest.from_file(str(APP), default_timeout=RUN_TIMEOUT_S)
    at.switch_page("views/engine.py").run()
    no_exceptions(at)
    assert [t.value for t in at.title] == ["Engine"]
    return at


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """2 prefill engines (40 req/s while busy) and 2 decode engines (10 req/s) over two weight
    versions; prefill engine 0 keeps its prefix cache across the update; Qwen3-Next stored as the model."""
    b = RunBuilder(tmp_path_factory.mktemp("engine") / "run")
    trainer = b.process("trainer")
    trainer.span(None, 0.0, 0.0, name="rltrace.model", **{"rl.model.config": json.dumps(QWEN3_NEXT),
                                                          "rl.model.source": "qwen3-next/config.json"})
    prefill = [b.process("vllm-prefill", e) for e in (0, 1)]
    decode = [b.process("vllm-decode", e) for e in (0, 1)]
    for step in (1, 2):
        t = 10.0 * (step - 1)
        trainer.span("weight_sync", t, t + 0.5, step=step, weight_version=step)
        trainer.span("rollout", t + 1, t + 9, step=step)
        for e, proc in enumerate(prefill):
            for k in range(40):  # the first request of each version cold, unless engine 0 kept its cache
                cached = 200 if k or (e == 0 and step == 2) else 0
                proc.span("generate", t + 1 + 0.025 * k, t + 1.025 + 0.025 * k, prompt_tokens=1000, cached_tokens=cached,
                          prefill_s=(1000 - cached) * 2e-5, e2e_latency=0.025, **{"rl.engine.role": "prefill"})
        for proc in decode:
            for w in range(10):
                for _ in range(4):
                    proc.span("generate", t + 1.1 + 0.4 * w, t + 1.5 + 0.4 * w, prompt_tokens=1000,
                              completion_tokens=200, e2e_latency=0.4, **{"rl.engine.role": "decode"})
    b.write()
    return b.run_dir


def test_the_engine_page_opens_first_and_shows_the_reports_figures(fleet, monkeypatch):
    at = first_page(monkeypatch, fleet)
    serving = report.plain(report.build(store.open(fleet)))["serving"]
    shown = metrics(at)
    assert shown["λ_max"] == f"{fmt.number_text(serving['pd']['lambda_max'])} req/s" == "20 req/s"
    assert shown["Limited by"] == "decode"
    assert shown["KV per token (c_A)"] == fmt.size_text(serving["kv_bytes_per_token"]) == "24.6 kB"
    assert shown["Prefix-cache hits"] == fmt.share_text(serving["prefix_cache"]["hit_rate"])
    assert len(charts(at)) == 4  # over time, throughput, hits per version, budget
    text = texts(at)
    assert fmt.md("engine rltrace-vllm-prefill-0 kept its prefix cache across the update to weight version 2 "
                  "(its first request after the update already hit the cache): its 40 hits since (8,000 cached tokens)"
                  ) in text
    assert "40 request(s) got cached tokens computed by the old weights (a mismatch source): 8,000 tokens" in text
    assert "39 more hit(s), 7,800 cached tokens, may be stale" in text  # engine 1: no flush recorded, first request cold
    lanes = json.loads(charts(at)[0].proto.spec)["layout"]["annotations"]
    assert [a["text"] for a in lanes] == ["prefill engines", "decode engines"]


@pytest.mark.parametrize("shape", ["no engine requests", "no steps"])
def test_the_engine_page_says_what_is_missing(tmp_path, monkeypatch, shape):
    b = RunBuilder(tmp_path / "run")
    if shape == "no engine requests":
        b.process("trainer").span("train", 0.0, 1.0, step=0)
    else:  # engine spans only (an OTLP receiver before the trainer started): no step anywhere
        proc = b.process("vllm", 0)
        for k in range(5):
            proc.span("generate", k, k + 0.5, e2e_latency=0.5, prompt_tokens=100, cached_tokens=0)
    b.write()
    at = first_page(monkeypatch, b.run_dir)
    text = texts(at)
    assert "No cache geometry: " + fmt.md("no model config: give `rltrace report RUN --model PATH`") in text
    if shape == "no engine requests":
        assert "No engine requests to show: " + fmt.md("no engine requests recorded") in text
        assert charts(at) == []
    else:
        assert "No prefill/decode balance: " + fmt.md("unified deployment: no engine reports") in text
        assert len(charts(at)) == 3  # over time, throughput, hits per version: no budget without a model
