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
                  "(its first request after the update already hit the cache): its 40 hits since (8,000 cached tokens) "
                  "hold at most 8,000 stale tokens") in text
    assert serving["prefix_cache"]["stale_kind"] == "at most"
    assert ("40 request(s) hit the prefix cache after weight updates that kept it (a mismatch source): "
            + fmt.md("at most 8,000 stale tokens (every hit after an unflushed update; a group's later requests also "
                     "hit what its first computed with the new weights)") + ".") in text
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
    if shape == "no engine requests":  # one line saying what would fill the page, not a page of blanks
        assert sum(e.value.startswith("No engine requests") for e in at.info) == 1
        assert "No engine requests to show: " + fmt.md("no engine requests recorded") in text
        assert charts(at) == [] and not at.metric and "No cache geometry" not in text
    else:
        assert "No cache geometry: " + fmt.md("no model config: give `rltrace report RUN --model PATH`") in text
        assert "No prefill/decode balance: " + fmt.md("unified deployment: no engine reports") in text
        assert len(charts(at)) == 3  # over time, throughput, hits per version: no budget without a model


def test_the_engine_page_takes_the_model_and_kv_link_of_rltrace_ui_and_its_own_inputs(fleet, monkeypatch, tmp_path):
    """`rltrace ui RUN --model M --kv-bandwidth B` reaches the page (RLTRACE_UI_SERVING); a refused model
    is shown with its reason; the page's own inputs give another model, link and engine count."""
    mistral = tmp_path / "mistral-v0.1.json"  # sliding_window on every layer: refused
    mistral.write_text(json.dumps({"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
                                   "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096,
                                   "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}))
    monkeypatch.setenv("RLTRACE_UI_SERVING", json.dumps({"model": str(mistral), "kv_bandwidth": 1e9}))
    at = first_page(monkeypatch, fleet)
    text = texts(at)
    assert "Cache geometry not computed for this model: " + fmt.md("sliding-window attention (sliding_window 4096") in text
    assert "KV link not checked: " + fmt.md("sliding-window attention (sliding_window 4096 on every layer") in text
    assert metrics(at)["λ_max"] == "20 req/s"
    assert fmt.md("with 4 engines: 1 prefill + 3 decode → 30 req/s") in text

    at.text_input(key="engine_model").set_value("").run()  # the config stored with the run: Qwen3-Next
    no_exceptions(at)
    s_kv = 1000 * 24_576 + 36 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2  # prompt KV + bf16 state
    assert metrics(at)["Limited by"] == "kv transfer"
    assert "KV cache bf16 (" + fmt.md("the config's torch_dtype") + ")" in texts(at)  # which default was used
    assert metrics(at)["λ_max"] == f"{fmt.number_text(1e9 / s_kv)} req/s"
    assert fmt.md(f"with 4 engines: 1 prefill + 3 decode → {fmt.number_text(1e9 / s_kv)} req/s, the KV link limiting") \
        in texts(at)

    at.number_input(key="engine_kv_gbps").set_value(0.0).run()  # no link given: none measured in this run
    at.number_input(key="engine_count").set_value(8).run()
    assert fmt.md("with 8 engines: 2 prefill + 6 decode → 60 req/s") in texts(at)

    at.text_input(key="engine_model").set_value(str(tmp_path / "nowhere")).run()
    assert "does not exist" in " ".join(e.value for e in at.error)
    assert metrics(at)["λ_max"] == "20 req/s"  # shown without the bad option


def test_rltrace_ui_takes_the_serving_options_of_rltrace_report(fleet, tmp_path, monkeypatch):
    from rltrace._config import RltraceConfigError
    from rltrace.cli import build_parser, main
    from rltrace.cli import ui as ui_cli

    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_NEXT))
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["ui", str(fleet), "--model", "config.json", "--kv-bandwidth", "2e9",
                                      "--kv-dtype", "fp8_e4m3", "--engine", "sglang"])
    _, env = ui_cli.command(args)
    assert json.loads(env["RLTRACE_UI_SERVING"]) == {"model": str(config.resolve()), "kv_dtype": "fp8_e4m3",
                                                     "ssm_dtype": None, "kv_bandwidth": 2e9, "engine": "sglang"}
    with pytest.raises(RltraceConfigError, match="does not exist"):
        ui_cli.command(build_parser().parse_args(["ui", str(fleet), "--model", "nowhere.json"]))
    assert main(["ui", str(fleet), "--kv-bandwidth", "-1"]) == 2  # one line, as `rltrace report` says it


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engine_page_shows_scraped_engine_metrics(engine, tmp_path, monkeypatch):
    """A run whose only engine evidence is its /metrics, written by the engine's own metrics code
    (tests/collect/engine_own_metrics.py): the prefix-cache figure from the counters (vLLM's hits /
    queries, SGLang's cached / prompt tokens) split by weight version, the KV usage gauge (a 0-1
    fraction) as a percentage, SGLang's KV transfers; nothing raised."""
    import rltrace
    from rltrace.collect.scrape import Scraper
    from rltrace.store import layout

    from ..collect.test_scrape import GIB, OwnEngine

    run = tmp_path / "run"
    rltrace.init(run, role="trainer")
    run_id = layout.read_manifest(run)["run_id"]
    with OwnEngine(engine) as own:
        scraper = Scraper(run, run_id, [own.url], every=60, timeout=1)
        scraper.scrape_once()
        with rltrace.phase("weight_sync", step=1, weight_version=1):
            pass
        with rltrace.phase("rollout", step=1):
            own.record({"requests": [[4000, 1000]], "kv_usage": 0.6} if engine == "vllm" else
                       {"finished": [[4000, 1000, None]], "token_usage": 0.6, "kv_transfers": [[GIB, 0.5]]})
            scraper.scrape_once()
    rltrace.shutdown()
    at = first_page(monkeypatch, run)
    assert "Engine metrics (/metrics)" in [h.value for h in at.subheader]
    assert metrics(at)["Prefix-cache hits"] == fmt.share_text(0.25)
    usage = "vllm:kv_cache_usage_perc" if engine == "vllm" else "sglang:token_usage"
    (table,) = [d.value for d in at.dataframe if "endpoint" in d.value.columns]
    assert table.loc[table["name"] == usage, "value"].tolist() == ["60.0%"]
    (versions,) = [d.value for d in at.dataframe if "cached_tokens" in d.value.columns]
    assert versions[["prompt_tokens", "cached_tokens"]].values.tolist() == [[4000, 1000]]
    (steps,) = [d.value for d in at.dataframe if "step" in d.value.columns and usage in d.value.columns]
    assert steps["step"].tolist() == [1]
    assert steps[usage].tolist() == ["60.0%"]  # step 1's peak
    kv = [m.value for m in at.markdown if m.value.startswith("KV transfers")]
    assert kv == ([] if engine == "vllm" else
                  [f"KV transfers (sglang:kv_transfer_*): 1 moved {fmt.size_text(GIB)} at {fmt.rate_text(2 * GIB)}, "
                   "500.0 ms each on average."])
