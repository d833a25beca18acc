"""The what-if event model on hand-built runs whose answers are known exactly."""

import numpy as np
import pytest

from rltrace import store
from rltrace.analysis import whatif
from rltrace.testing import RunBuilder


def _loop(tmp_path, *, gens, train, sync, reward=0.0, steps=8, workers=1, sample_times=True):
    """A synchronous loop: per step, a generate span per engine as long as its longest sample, then
    reward, train and weight_sync on the trainer, back to back."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    engines = [b.process("rollout", r) for r in range(workers)]
    t = 0.0
    for step in range(steps):
        top = max(gens)
        rows = []
        for i, g in enumerate(gens):
            rank = i % workers
            rows.append({"sample_id": f"{step}-{i}", "response_len": int(g * 1000), "gen_start": t, "gen_end": t + g,
                         "worker_rank": rank, "weight_version": step, "train_version": step})
        for rank, e in enumerate(engines):
            share = [g for i, g in enumerate(gens) if i % workers == rank]
            e.span("generate", t, t + max(share), step=step)
        if sample_times:
            b.samples(step, rows)
        t += top
        if reward:
            tr.span("reward", t, t + reward, step=step)
            t += reward
        tr.span("train", t, t + train, step=step)
        tr.span("weight_sync", t + train, t + train + sync, step=step)
        t += train + sync
    b.write()
    return store.open(b.run_dir)


def _predict(cal, **knobs):
    return whatif.predict(cal, whatif.Scenario(**knobs), replicates=20)


def test_a_static_batch_ends_with_its_longest_sample(tmp_path):
    """One long sample sets the batch: the sync replay is the recorded period, and twice the engines
    do not move it (a per-phase model that halves the rollout would say 0.55 + 0.6)."""
    cal = whatif.calibrate(_loop(tmp_path, gens=[0.1, 0.1, 0.2, 1.0], train=0.5, sync=0.1))
    assert cal.workers == 1 and cal.staleness == 0 and cal.per_sample
    assert cal.works.shape == (8, 4)
    assert _predict(cal, staleness=0)["predicted_step_s"] == pytest.approx(1.6, abs=1e-6)
    two = _predict(cal, staleness=0, rollout_workers=2)
    assert two["predicted_step_s"] == pytest.approx(1.6, abs=1e-6)
    assert two["binding"] == "t_sync" and "longest sample" in two["why"]
    async_ = _predict(cal, staleness=1)  # rollout 1.0 > train + sync 0.6: the rollout binds
    assert async_["predicted_step_s"] == pytest.approx(1.0, abs=1e-6)
    assert async_["binding"] == "t_R"
    assert async_["staleness_mean"] == pytest.approx(1.0, abs=0.05) and async_["staleness_max"] == 1


def test_async_is_bounded_by_train_plus_sync(tmp_path):
    cal = whatif.calibrate(_loop(tmp_path, gens=[0.3, 0.5], train=1.0, sync=0.2))
    for k in (1, 2):
        row = _predict(cal, staleness=k)
        assert row["predicted_step_s"] == pytest.approx(1.2, abs=1e-6)
        assert row["binding"] == "t_T + t_W"
        assert row["staleness_max"] <= k
    assert _predict(cal, staleness=1, placement="colocated")["predicted_step_s"] == pytest.approx(1.7, abs=1e-6)


def test_partial_rollouts_leave_the_long_tail_to_the_next_batch(tmp_path):
    """Over-sampled batches end when their share finished: the rollout no longer waits for the 1 s sample."""
    cal = whatif.calibrate(_loop(tmp_path, gens=[0.1] * 7 + [1.0], train=0.2, sync=0.05))
    full = _predict(cal, staleness=0)["predicted_step_s"]
    partial = _predict(cal, staleness=0, partial=1.25)
    assert full == pytest.approx(1.25, abs=1e-6)
    assert partial["predicted_step_s"] < 0.7 * full
    assert partial["staleness_max"] >= 1  # a carried sample was started under older weights


def test_a_rollout_without_sample_times_replays_whole(tmp_path):
    cal = whatif.calibrate(_loop(tmp_path, gens=[0.2, 0.4], train=0.3, sync=0.1, sample_times=False))
    assert not cal.per_sample and "per-sample" in cal.notes[0]
    assert _predict(cal, rollout_workers=4)["predicted_step_s"] == pytest.approx(0.8, abs=1e-6)
    assert _predict(cal, staleness=1)["predicted_step_s"] == pytest.approx(0.4, abs=1e-6)


def test_whatif_table_has_the_recorded_run_first_with_the_analytic_bound(tmp_path):
    con = _loop(tmp_path, gens=[0.3, 0.5], train=1.0, sync=0.2, reward=0.1)
    t = whatif.whatif(con, [whatif.Scenario(staleness=1)], replicates=10)
    assert list(t["scenario"]) == ["as recorded", "async K=1"]
    assert t["recorded_step_s"].iloc[0] == pytest.approx(1.8, abs=1e-6)
    assert t["predicted_step_s"].iloc[0] == pytest.approx(1.8, abs=1e-6)
    assert t["analytic_s"].tolist() == pytest.approx([1.8, max(0.6, 1.0) + 0.2], abs=1e-6)
    assert t["predicted_step_s"].iloc[1] == pytest.approx(1.3, abs=1e-6)  # reward rides on the trainer


def test_an_empty_run_has_no_rows(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("warmup", 0, 1)
    b.write()
    assert whatif.whatif(store.open(b.run_dir), [whatif.Scenario(staleness=1)]).empty


def test_a_sample_carried_over_counts_only_its_time_in_the_batch_that_finished_it(tmp_path):
    """Partial rollouts recorded: each batch has three fresh samples (0.1 s) and one carried from the
    batch before, finished 0.2 s into this one; train 0.3 s and sync 0.1 s follow. A step is 0.6 s;
    taken whole (from its first start) the carried sample would make it 1.2 s."""
    b = RunBuilder(tmp_path / "run")
    tr, engine = b.process("trainer"), b.process("rollout")
    for step in range(8):
        t = 0.6 * step
        engine.span("generate", t, t + 0.2, step=step)
        rows = [{"sample_id": f"{step}-{i}", "gen_start": t, "gen_end": t + 0.1, "worker_rank": 0,
                 "weight_version": step, "train_version": step} for i in range(3)]
        if step:
            rows.append({"sample_id": f"{step}-c", "gen_start": t - 0.6, "gen_end": t + 0.2, "worker_rank": 0,
                         "weight_version": step - 1, "train_version": step})
        b.samples(step, rows)
        tr.span("train", t + 0.2, t + 0.5, step=step)
        tr.span("weight_sync", t + 0.5, t + 0.6, step=step)
    b.write()
    cal = whatif.calibrate(store.open(b.run_dir))
    assert cal.staleness == 0  # a carried sample's age is no staleness bound
    assert np.nanmax(cal.works[1:], axis=1) == pytest.approx([0.2] * 7, abs=1e-6)
    assert any("7 samples were carried over" in n for n in cal.notes)
    assert _predict(cal)["predicted_step_s"] == pytest.approx(0.6, abs=1e-6)


def test_requests_started_one_by_one_across_steps_are_not_taken_for_carried(tmp_path):
    """Continuous batching, fully async: an engine starts step s+1's requests while step s's last
    ones still run, each at its own time. Nothing was carried over: each sample's work is whole."""
    b = RunBuilder(tmp_path / "run")
    tr, engine = b.process("trainer"), b.process("rollout")
    for step in range(6):
        t = 0.5 * step
        engine.span("generate", t, t + 0.6, step=step)
        b.samples(step, [{"sample_id": f"{step}-{i}", "gen_start": t + 0.05 * i, "gen_end": t + 0.05 * i + 0.4,
                          "worker_rank": 0, "weight_version": step, "train_version": step} for i in range(4)])
        tr.span("train", t + 0.6, t + 0.9, step=step)
    b.write()
    cal = whatif.calibrate(store.open(b.run_dir))
    assert not any("carried" in n for n in cal.notes)
    assert np.nanmax(cal.works, axis=1) == pytest.approx([0.4] * 6, abs=1e-6)


def test_samples_from_newer_weights_than_the_trainer_read_as_synchronous(tmp_path):
    """A version mix-up (weight_version above train_version, a negative staleness) is no bound of -1."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(4):
        t = step * 1.0
        tr.span("rollout", t, t + 0.5, step=step)
        tr.span("train", t + 0.5, t + 1.0, step=step)
        b.samples(step, [{"sample_id": f"{step}", "gen_start": t, "gen_end": t + 0.5, "weight_version": step + 3,
                          "train_version": step}])
    b.write()
    cal = whatif.calibrate(store.open(b.run_dir))
    assert cal.staleness == 0
    assert _predict(cal)["predicted_step_s"] == pytest.approx(1.0, abs=1e-6)


GQA = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
       "torch_dtype": "bfloat16"}  # 57,344 bytes of KV a token: 57.3 MB a 1,000-token prompt
KV = 57_344 * 1000


def _requests_loop(tmp_path, *, decode, prefill=0.1, train=0.5, sync=0.1, steps=6, model=GQA, bandwidth=None,
                   requests=True):
    """A synchronous loop on one unified engine that records each request as vLLM does (queue,
    prefill and decode time, 1,000 prompt tokens): per step it prefills the prompts one after
    another, then decodes them together; train and weight_sync follow."""
    from rltrace.analysis import configure_serving

    b = RunBuilder(tmp_path / "run")
    tr, engine = b.process("trainer"), b.process("vllm")
    t = 0.0
    for step in range(steps):
        filled = prefill * len(decode)
        end = filled + max(decode)
        engine.span("generate", t, t + end, step=step)
        for i, d in enumerate(decode):
            if requests:
                engine.span("llm_request", t, t + filled + d, step=step, request_id=f"{step}-{i}", e2e_latency=filled + d,
                            queue_time=prefill * i, prefill_s=prefill, decode_s=d, prompt_tokens=1000)
        b.samples(step, [{"sample_id": f"{step}-{i}", "gen_start": t, "gen_end": t + filled + d, "worker_rank": 0,
                          "weight_version": step, "train_version": step} for i, d in enumerate(decode)])
        tr.span("train", t + end, t + end + train, step=step)
        tr.span("weight_sync", t + end + train, t + end + train + sync, step=step)
        t += end + train + sync
    b.write()
    con = store.open(b.run_dir)
    configure_serving(con, model=model, kv_bandwidth=bandwidth)
    return con


def test_a_prefill_decode_split_replays_prefill_kv_link_and_decode(tmp_path):
    """Recorded on one unified engine: 4 prompts prefilled 0.1 s each one after another, decoded
    together for 0.3 s, train 0.5, sync 0.1 (1.3 s a step). Each split's step, the stage that held
    its last request, and the serving formula's answer beside it, known exactly."""
    con = _requests_loop(tmp_path, decode=[0.3] * 4, bandwidth=KV / 0.05)  # the KV link: 0.05 s a prompt
    cal = whatif.calibrate(con)
    assert cal.requests["prefill_s"].shape == (6, 4) and cal.kv_bandwidth == pytest.approx(KV / 0.05)
    assert np.nanmean(cal.requests["kv_bytes"]) == KV
    t = whatif.table(cal, [whatif.Scenario(staleness=0, pd=(1, 1)), whatif.Scenario(staleness=0, pd=(2, 2)),
                           whatif.Scenario(staleness=0, pd=(2, 1), kv_bandwidth=KV / 0.2)], replicates=10)
    assert t["scenario"].tolist() == ["as recorded", "sync, prefill/decode 1:1", "sync, prefill/decode 2:2",
                                      "sync, prefill/decode 2:1, KV link 287 MB/s"]
    assert t["predicted_step_s"].tolist() == pytest.approx([
        1.3,
        0.4 + 0.05 + 0.3 + 0.6,  # one prefill engine: the last prompt's prefill ends at 0.4, the link is free
        0.3 + 0.3 + 0.6,  # two end two prompts each at 0.1 and 0.2: the link sends them by 0.15 .. 0.3
        0.1 + 4 * 0.2 + 0.3 + 0.6,  # a slow link (0.2 s a prompt): the last KV arrives at 0.9
    ], abs=1e-6)
    assert t["binding"].tolist()[1:] == ["prefill", "decode", "KV link"]
    assert "the request that finished each step last spent 53% of its time in prefill" in t["why"][1]
    assert all(sum(s.values()) == pytest.approx(1.0) for s in t["pd_shares"][1:])
    # max(M / (n_P μ_P) = 0.4 / n_P, M · S_KV / B_KV, the longest decode 0.3) + train + sync
    assert t["analytic_s"].tolist()[1:] == pytest.approx([0.4 + 0.6, 0.3 + 0.6, 0.8 + 0.6], abs=1e-6)


def test_a_split_without_what_it_needs_is_refused_with_the_reason(tmp_path):
    """No model config, no KV link bandwidth, no engine request spans: each a one-line reason; the
    other scenarios of the run still predict."""
    from rltrace.analysis import configure_serving

    con = _requests_loop(tmp_path / "a", decode=[0.1] * 4, model=None, bandwidth=1e9)
    refusals = {"no KV bytes per request: no model config": whatif.calibrate(con)}
    configure_serving(con, model=GQA)
    refusals["no KV link bandwidth (no KV transfer recorded): give --kv-bandwidth"] = whatif.calibrate(con)
    refusals["no engine request spans"] = whatif.calibrate(_loop(tmp_path / "b", gens=[0.5], train=0.5, sync=0.1))
    configure_serving(con, model={**GQA, "sliding_window": 4096, "max_position_embeddings": 32768}, kv_bandwidth=1e9)
    refusals["no KV bytes per request: sliding-window attention (sliding_window 4096 on every layer"] = \
        whatif.calibrate(con)  # a refused config names its reason, never "no model config"
    for said, cal in refusals.items():
        assert _predict(cal, staleness=0)["predicted_step_s"] == pytest.approx(1.1, abs=1e-6)
        with pytest.raises(whatif.Refused, match="cannot predict a prefill/decode split") as refused:
            _predict(cal, staleness=0, pd=(1, 1))
        assert said in str(refused.value) and "\n" not in str(refused.value)


def _capped_loop(tmp_path, *, cap=2, work=1.0, requests=4, train=0.5, sync=0.1, steps=6, queue_spans=True):
    """A synchronous loop on one engine that batches continuously with a cap: each step's requests
    arrive together and each runs `work` seconds, `cap` at a time, a waiting one starting as
    another ends. `queue_spans`: samples start at arrival and each request span records its time in
    the queue (as vLLM does); otherwise samples start when the engine started serving them."""
    b = RunBuilder(tmp_path / "run")
    tr, engine = b.process("trainer"), b.process("vllm")
    t = 0.0
    for step in range(steps):
        rows = []
        for i in range(requests):
            began = t + (i // cap) * work
            rid = f"{step}-{i}"
            rows.append({"sample_id": rid, "gen_start": t if queue_spans else began, "gen_end": began + work,
                         "worker_rank": 0, "weight_version": step, "train_version": step})
            if queue_spans:
                engine.span("llm_request", t, began + work, step=step, request_id=rid, e2e_latency=began + work - t,
                            queue_time=began - t, prefill_s=0.0, decode_s=work, prompt_tokens=1000)
        rollout = -(-requests // cap) * work
        engine.span("generate", t, t + rollout, step=step)
        b.samples(step, rows)
        tr.span("train", t + rollout, t + rollout + train, step=step)
        tr.span("weight_sync", t + rollout + train, t + rollout + train + sync, step=step)
        t += rollout + train + sync
    b.write()
    return store.open(b.run_dir)


@pytest.mark.parametrize("queue_spans", [True, False], ids=["queue time on request spans", "samples start when served"])
def test_continuous_batching_replays_with_the_recorded_cap(tmp_path, queue_spans):
    """Cap 2, 4 requests of 1 s on one engine: 2 s of rollout, two rounds. Two engines take 2 requests
    each (1 s); four, one each (1 s); a static batch would have said 1 s for one engine too."""
    cal = whatif.calibrate(_capped_loop(tmp_path, queue_spans=queue_spans))
    assert cal.cap == 2 and cal.workers == 1
    assert np.nanmax(cal.works, axis=1) == pytest.approx([1.0] * 6, abs=1e-3)  # service time, not queue
    assert any("at most 2 requests at once" in n for n in cal.notes)
    step = lambda **k: _predict(cal, **k)["predicted_step_s"]  # noqa: E731
    assert step(staleness=0) == pytest.approx(2.6, abs=1e-3)
    assert step(staleness=0, rollout_workers=2) == pytest.approx(1.6, abs=1e-3)
    assert step(staleness=0, rollout_workers=4) == pytest.approx(1.6, abs=1e-3)
    assert step(staleness=1) == pytest.approx(2.0, abs=1e-3)  # the rollout binds: 2 s > train + sync
    assert step(staleness=1, rollout_workers=2) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(whatif.Refused, match="batch continuously"):
        _predict(cal, staleness=1, partial=1.25)


def test_a_static_batch_or_an_uncapped_engine_has_no_cap(tmp_path):
    """Requests that all ran at once (a static batch; requests that queued for their prefill, then
    decoded together) record no cap, nor do two static batches one after another on an engine (the
    second waits for the first's longest sample, where a capped engine fills each slot as it frees)."""
    assert whatif.calibrate(_loop(tmp_path / "a", gens=[0.1, 0.2, 1.0], train=0.5, sync=0.1)).cap is None
    assert whatif.calibrate(_capped_loop(tmp_path / "b", cap=4)).cap is None
    prefilled = whatif.calibrate(_requests_loop(tmp_path / "c", decode=[0.3, 0.3, 0.3, 0.6]))
    assert prefilled.cap is None
    assert np.nanmax(prefilled.works, axis=1) == pytest.approx([0.4 + 0.6] * 6, abs=1e-6)  # its queue time kept
    b = RunBuilder(tmp_path / "d" / "run")
    tr, engine = b.process("trainer"), b.process("rollout")
    for step in range(4):
        t = 2.0 * step
        engine.span("generate", t, t + 1.5, step=step)
        b.samples(step, [{"sample_id": f"{step}-{i}", "gen_start": t + 0.5 * (i // 2), "gen_end": t + 0.5 * (i // 2) + g,
                          "worker_rank": 0, "weight_version": step, "train_version": step}
                         for i, g in enumerate([0.2, 0.5, 1.0, 0.3])])
        tr.span("train", t + 1.5, t + 2.0, step=step)
    b.write()
    assert whatif.calibrate(store.open(b.run_dir)).cap is None


def test_decode_engines_are_capped_only_when_the_run_recorded_a_cap(tmp_path):
    """4 requests a step, no prefill, 1 s of decode each; the KV link sends a prompt in 0.01 s (they
    arrive at 0.01 .. 0.04). Recorded with a cap of 2, one decode engine decodes them in two rounds
    (the third starts when the first ends, 1.01 s: the last ends at 2.02 s) and two engines in one
    (1.04 s); recorded as a static batch, one decode engine takes all four at once (1.04 s)."""
    from rltrace.analysis import configure_serving

    def split_steps(con):
        configure_serving(con, model=GQA, kv_bandwidth=KV / 0.01)
        cal = whatif.calibrate(con)
        return cal, [_predict(cal, staleness=0, pd=pd) for pd in ((1, 1), (1, 2))]

    cal, (one, two) = split_steps(_capped_loop(tmp_path / "capped"))
    assert cal.cap == 2
    assert [one["predicted_step_s"], two["predicted_step_s"]] == pytest.approx([2.02 + 0.6, 1.04 + 0.6], abs=1e-3)
    assert one["binding"] == "decode" and "at most 2 requests at once" in one["why"]
    cal, (one, two) = split_steps(_capped_loop(tmp_path / "static", cap=4))
    assert cal.cap is None
    assert [one["predicted_step_s"], two["predicted_step_s"]] == pytest.approx([1.04 + 0.6] * 2, abs=1e-3)
    assert "takes every request it is sent at once" in one["why"]
