"""A GPU-shaped RL loop whose engines sleep: the timing of a real post-training loop without a GPU.

    python -m examples.sleeping_loop runs/sleep --staleness 1 --rollout-workers 2

Each step draws `batch` response lengths from a lognormal (long-tailed, as real generations are),
splits them over the rollout engines and lets each engine "decode" its share as one static batch:
a sample finishes after `len × tok_s`, the batch when its longest sample does. The trainer
scores (reward), trains (`train_s + train_per_sample_s × batch`) and syncs weights, each a sleep.
Engines run on their own threads, so the schedule is real: with `staleness` K an engine starts
the batch of step i as soon as it finished its last one and weights of version >= i - K exist
(K = 0 is the synchronous loop); `partial` over-samples by that factor and ends each batch when
its share of samples finished, carrying the unfinished ones (with their tokens so far) into the
engine's next batch. Every phase is an rltrace span; every sample a row with its generation times,
length, weight version and engine: what `rltrace whatif` calibrates on (benchmarks/bench_whatif.py).

With `prefill_tok_s` > 0 each sample is an engine request with a prompt (lognormal lengths, median
`prompt_tokens`), recorded as vLLM records one (an `llm_request` span from arrival to finish with
its queue, prefill and decode times, through the run's OpenTelemetry tracer), and the engines stand
in for a prefill/decode deployment by sleeping too:
- unified (`pd` None): an engine prefills its share one prompt after another (`prompt × prefill_tok_s`
  each), then decodes the share as one static batch (a decode step waits while a prefill runs);
- split (`pd` = (P, D)): P prefill engines prefill the step's prompts one after another each; every
  prompt's KV (`prompt × kv_bytes_per_token` bytes) then crosses one link of `kv_bandwidth` bytes/s,
  first come first served; D decode engines take the requests in turn and decode each from the
  moment its KV arrived (every request they are sent at once; with `cap`, at most `cap` at once, a
  request waiting for a slot first come first served). Each prefill, transfer and decode is a sleep
  on its own thread; the KV bytes are those of `MODEL` (stored with the run).

With `cap` set, each engine batches continuously instead: it runs at most `cap` of its share's
requests at once, each for its own time (prefill then decode), and starts a waiting one the
moment another finishes; the rest wait in its queue (`time_in_queue` on the request span).
"""

from __future__ import annotations

import argparse
import heapq
import math
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

import rltrace


@dataclass
class Shape:
    """The loop's costs (seconds) and sizes; the defaults are the validation benchmark's."""

    steps: int = 40
    batch: int = 32
    rollout_workers: int = 1
    staleness: int = 0  # K: a batch may be generated with weights up to K versions old (0: synchronous)
    partial: float | None = None  # over-sampling factor of partial rollouts (None: off)
    tok_s: float = 1.6e-4  # decode time per token
    overhead_s: float = 0.002  # per engine batch (launch, prefill)
    median_tokens: float = 200.0
    sigma: float = 0.6  # lognormal spread of response lengths
    max_tokens: int = 2048
    reward_s: float = 0.005
    train_s: float = 0.060
    train_per_sample_s: float = 0.001
    sync_s: float = 0.015
    seed: int = 0
    prefill_tok_s: float = 0.0  # prefill time per prompt token; > 0: samples are engine requests with prompts
    prompt_tokens: float = 512.0  # median prompt length
    pd: tuple[int, int] | None = None  # (prefill engines, decode engines); None: unified engines
    kv_bandwidth: float = 1e10  # the KV link between prefill and decode engines, bytes/s
    cap: int | None = None  # continuous batching: requests an engine runs at once (None: static batches)


#: The served model's config (a 0.5B-parameter GQA model: 24 layers, 2 KV heads of 64, bf16): the KV
#: bytes a prompt token leaves on a prefill engine, stored with the run (`rltrace.init(model=...)`).
MODEL = {"model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
         "head_dim": 64, "hidden_size": 896, "torch_dtype": "bfloat16"}
KV_BYTES_PER_TOKEN = 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * MODEL["head_dim"] * 2  # K and V, bf16


def _sleep_until(deadline: float) -> None:
    """Sleep to a perf_counter deadline (not for a duration: a late wake-up is not added up step after step)."""
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


class _Versions:
    """The newest weight version the engines can load, and a way to wait for one."""

    def __init__(self):
        self.version, self._cond = 0, threading.Condition()

    def publish(self, version: int) -> None:
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def wait_for(self, version: int) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.version >= version)
            return self.version


def _request_span(role: str, step: int, rid: str, start: float, end: float, **latency: float) -> None:
    """One engine request as vLLM's OutputProcessor.do_tracing records it: an `llm_request` span from
    arrival to finish (wall-clock seconds), its gen_ai latency and usage attributes; `rl.engine.role`
    says which kind of engine served it."""
    run = rltrace.current_run()
    if run is None:
        return
    names = {"queue_s": "gen_ai.latency.time_in_queue", "prefill_s": "gen_ai.latency.time_in_model_prefill",
             "decode_s": "gen_ai.latency.time_in_model_decode", "prompt_tokens": "gen_ai.usage.prompt_tokens",
             "completion_tokens": "gen_ai.usage.completion_tokens"}
    attrs = {names[k]: v for k, v in latency.items()} | {
        "gen_ai.request.id": rid, "gen_ai.latency.e2e": end - start, "rl.engine.role": role, "rl.step": step}
    run.tracer.start_span("llm_request", attributes=attrs, start_time=int(start * 1e9)).end(end_time=int(end * 1e9))


class _Engine(threading.Thread):
    """One rollout engine: generates its share of each step's batch, as one static batch."""

    def __init__(self, rank: int, shape: Shape, versions: _Versions, results: dict, done: threading.Condition):
        super().__init__(name=f"engine-{rank}", daemon=True)
        self.rank, self.shape, self.versions, self.results, self.done = rank, shape, versions, results, done
        self.rng = np.random.default_rng(shape.seed * 1009 + rank)
        self.share = len(range(rank, shape.batch, shape.rollout_workers))
        self.carry: list[dict] = []  # partial rollouts: unfinished samples, with what they have left
        self.next_id = 0
        self.requests: list[tuple] = []  # request spans, recorded when the run ends (`run`)

    def _lengths(self, n: int) -> np.ndarray:
        s = self.shape
        return np.minimum(np.ceil(self.rng.lognormal(math.log(s.median_tokens), s.sigma, n)), s.max_tokens)

    def _prompts(self, n: int) -> np.ndarray:
        return np.clip(np.ceil(self.rng.lognormal(math.log(self.shape.prompt_tokens), 0.3, n)), 16, 8192)

    def run(self) -> None:
        s = self.shape
        for step in range(s.steps):
            version = self.versions.wait_for(step - s.staleness)
            with rltrace.phase("generate", step=step, weight_version=version, samples=self.share):
                start = time.perf_counter()
                _sleep_until(start + s.overhead_s)
                samples = self._batch(step, version, time.time(), time.perf_counter())
            with self.done:
                self.results.setdefault(step, []).extend(samples)
                self.done.notify_all()

    def _batch(self, step: int, version: int, wall0: float, t0: float) -> list[dict]:
        """Decode one batch: every slot's sample from now; returns the samples that finished in it."""
        s = self.shape
        if s.cap:
            return self._continuous(step, version, wall0, t0)
        if s.prefill_tok_s > 0:
            return self._requests(step, version, wall0, t0)
        slots = self.share if s.partial is None else math.ceil(self.share * s.partial)
        fresh = self._lengths(max(0, slots - len(self.carry)))
        for n in fresh:
            self.carry.append({"sample_id": f"{self.rank}-{self.next_id}", "response_len": int(n), "left": int(n),
                               "weight_version": version, "gen_start": wall0})
            self.next_id += 1
        batch, self.carry = self.carry, []
        finish = np.array([x["left"] * s.tok_s for x in batch])
        cut = float(np.sort(finish)[self.share - 1]) if s.partial is not None else float(finish.max())
        _sleep_until(t0 + cut)
        out = []
        for x, f in zip(batch, finish):
            if f <= cut:
                out.append({**{k: v for k, v in x.items() if k != "left"}, "gen_end": wall0 + f,
                            "worker_rank": self.rank, "train_version": step})
            else:  # partial rollout: aborted at the cut, resumed in the next batch with its tokens so far
                x["left"] -= int(cut / s.tok_s)
                self.carry.append(x)
        return out

    def _requests(self, step: int, version: int, wall0: float, t0: float) -> list[dict]:
        """A unified engine's batch of requests: its prompts prefilled one after another, then every
        response decoded together (a static batch: decoding waits while a prompt is prefilled)."""
        s = self.shape
        lengths, prompts = self._lengths(self.share), self._prompts(self.share)
        prefill = prompts * s.prefill_tok_s
        filled = np.cumsum(prefill)  # each prompt's prefill end, after batch start
        decode = lengths * s.tok_s
        ends = filled[-1] + decode
        _sleep_until(t0 + float(ends.max()))
        out = []
        for i, (n, p) in enumerate(zip(lengths, prompts)):
            rid = f"{self.rank}-{self.next_id}"
            self.next_id += 1
            self.requests.append((("unified", step, rid, wall0, wall0 + ends[i]), dict(
                queue_s=float(filled[i] - prefill[i]), prefill_s=float(prefill[i]), decode_s=float(decode[i]),
                prompt_tokens=int(p), completion_tokens=int(n))))
            out.append({"sample_id": rid, "response_len": int(n), "weight_version": version, "gen_start": wall0,
                        "gen_end": wall0 + float(ends[i]), "worker_rank": self.rank, "train_version": step})
        return out


    def _continuous(self, step: int, version: int, wall0: float, t0: float) -> list[dict]:
        """Continuous batching with a cap: the share's requests all arrive now; each of `cap` slots
        takes the next waiting request when its last one finishes."""
        s = self.shape
        lengths, prompts = self._lengths(self.share), self._prompts(self.share)
        prefill, decode = prompts * s.prefill_tok_s, lengths * s.tok_s
        slots = [0.0] * s.cap
        began, ends = np.zeros(self.share), np.zeros(self.share)
        for i in range(self.share):  # first come, first served
            began[i] = heapq.heappop(slots)
            ends[i] = began[i] + prefill[i] + decode[i]
            heapq.heappush(slots, ends[i])
        _sleep_until(t0 + float(ends.max()))
        out = []
        for i in range(self.share):
            rid = f"{self.rank}-{self.next_id}"
            self.next_id += 1
            self.requests.append((("unified", step, rid, wall0, wall0 + ends[i]), dict(
                queue_s=float(began[i]), prefill_s=float(prefill[i]), decode_s=float(decode[i]),
                prompt_tokens=int(prompts[i]), completion_tokens=int(lengths[i]))))
            out.append({"sample_id": rid, "response_len": int(lengths[i]), "weight_version": version, "gen_start": wall0,
                        "gen_end": wall0 + float(ends[i]), "worker_rank": self.rank, "train_version": step})
        return out


class _SplitEngines(_Engine):
    """P prefill engines, one KV link and D decode engines that generate each step's batch together
    (a static batch: the group takes the next step's prompts when the last response is in)."""

    def __init__(self, shape: Shape, versions: _Versions, results: dict, done: threading.Condition):
        super().__init__(0, Shape(**{**shape.__dict__, "rollout_workers": 1}), versions, results, done)

    def _batch(self, step: int, version: int, wall0: float, t0: float) -> list[dict]:
        s, m = self.shape, self.shape.batch
        n_p, n_d = s.pd
        lengths, prompts = self._lengths(m), self._prompts(m)
        prefill, decode, kv = prompts * s.prefill_tok_s, lengths * s.tok_s, prompts * KV_BYTES_PER_TOKEN
        filled, arrived, began, ended = np.zeros(m), np.zeros(m), np.zeros(m), np.zeros(m)
        link, to_decode = queue.Queue(), [queue.Queue() for _ in range(n_d)]

        def prefill_engine(k: int) -> None:  # its prompts one after another
            at = t0
            for i in range(k, m, n_p):
                at += prefill[i]
                _sleep_until(at)
                filled[i] = at
                link.put(i)

        def kv_link() -> None:  # first come, first served, one transfer at a time
            free = t0
            for n in range(m):
                i = link.get()
                free = max(free, filled[i]) + kv[i] / s.kv_bandwidth
                _sleep_until(free)
                arrived[i] = free
                to_decode[n % n_d].put(i)

        def decode_engine(d: int) -> None:  # each request decoded from its KV's arrival: all at once, or `cap` at a time
            expected, running, slots = len(range(d, m, n_d)), [], [0.0] * (s.cap or 0)
            while expected:
                try:
                    i = to_decode[d].get(timeout=max(0.0, running[0][0] - time.perf_counter()) if running else None)
                    # with a cap, a request starts when its KV arrived and a slot is free (first come, first served)
                    began[i] = max(arrived[i], heapq.heappop(slots)) if s.cap else arrived[i]
                    if s.cap:
                        heapq.heappush(slots, began[i] + decode[i])
                    heapq.heappush(running, (began[i] + decode[i], i))
                except queue.Empty:
                    pass
                while running and running[0][0] <= time.perf_counter():
                    at, i = heapq.heappop(running)
                    ended[i] = at
                    expected -= 1

        threads = ([threading.Thread(target=prefill_engine, args=(k,)) for k in range(n_p)] + [threading.Thread(target=kv_link)]
                   + [threading.Thread(target=decode_engine, args=(d,)) for d in range(n_d)])
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = lambda t: wall0 + (t - t0)  # noqa: E731 - perf_counter time to wall clock
        out = []
        for i in range(m):
            rid = f"{step}-{i}"
            self.requests += [
                (("prefill", step, rid, wall0, wall(filled[i])), dict(
                    queue_s=float(filled[i] - t0 - prefill[i]), prefill_s=float(prefill[i]),
                    prompt_tokens=int(prompts[i]), completion_tokens=1)),
                (("decode", step, rid, wall(arrived[i]), wall(ended[i])), dict(
                    queue_s=float(began[i] - arrived[i]), decode_s=float(decode[i]), prompt_tokens=int(prompts[i]),
                    completion_tokens=int(lengths[i])))]
            out.append({"sample_id": rid, "response_len": int(lengths[i]), "weight_version": version, "gen_start": wall0,
                        "gen_end": wall(ended[i]), "worker_rank": 0, "train_version": step})
        return out


def run(out: str, shape: Shape | None = None) -> dict:
    """Record one run of the loop into `out`; returns {"period_s": median time between step ends
    once the pipeline filled (after the first K + 2 steps), "staleness_mean", "staleness_max"}, as
    the loop itself measured them."""
    s = shape or Shape()
    requests = s.prefill_tok_s > 0 or bool(s.cap)
    if s.pd is not None and (s.prefill_tok_s <= 0 or s.partial is not None or min(s.pd) < 1):
        raise ValueError("a prefill/decode split needs prefill_tok_s > 0, no partial rollouts and >= 1 engine of each")
    if s.cap and s.partial is not None:
        raise ValueError("continuous batching (cap) replaces static batches: no partial rollouts with it")
    rltrace.init(out, role="trainer", config=s.__dict__, model=MODEL if requests else None)
    versions, results, done = _Versions(), {}, threading.Condition()
    engines = ([_SplitEngines(s, versions, results, done)] if s.pd else
               [_Engine(r, s, versions, results, done) for r in range(s.rollout_workers)])
    for e in engines:
        e.start()
    ends, ages = [], []
    try:
        for step in range(s.steps):
            with rltrace.phase("step", step=step, weight_version=step):
                with done:
                    if len(results.get(step, ())) < s.batch:
                        with rltrace.phase("wait", waiting_for="rollout"):
                            done.wait_for(lambda: len(results.get(step, ())) >= s.batch)
                    samples = results.pop(step)
                for name, seconds in (("reward", s.reward_s), ("train", s.train_s + s.train_per_sample_s * len(samples))):
                    with rltrace.phase(name, samples=len(samples)):
                        _sleep_until(time.perf_counter() + seconds)
                with rltrace.phase("weight_sync", weight_version=step + 1, bytes=1 << 20, method="sleep"):
                    _sleep_until(time.perf_counter() + s.sync_s)
                versions.publish(step + 1)
            rltrace.log_samples(step, samples)
            ends.append(time.perf_counter())
            ages += [step - x["weight_version"] for x in samples]
    finally:
        versions.publish(s.steps + s.staleness + 1)  # nobody waits on weights after the last step
        for e in engines:
            e.join(5)
        # the engines' request spans, recorded now: a real engine exports them from its own process,
        # here they would take the trainer's CPU in the middle of its steps
        for n, (args, latency) in enumerate(r for e in engines for r in e.requests):
            _request_span(*args, **latency)
            if n % 500 == 499:
                rltrace.flush()  # within the span exporter's queue
        rltrace.shutdown()
    skip = min(len(ends) - 2, 2 + s.staleness)
    return {"period_s": float(np.median(np.diff(ends)[skip:])), "staleness_mean": float(np.mean(ages)),
            "staleness_max": int(max(ages))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.sleeping_loop", description=__doc__.splitlines()[0])
    p.add_argument("out")
    for f in ("steps", "batch", "rollout_workers", "staleness", "seed"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(Shape, f))
    p.add_argument("--partial", type=float, default=None, help="over-sampling factor of partial rollouts")
    p.add_argument("--prefill-tok-s", type=float, default=0.0, help="prefill seconds per prompt token (> 0: requests)")
    p.add_argument("--kv-bandwidth", type=float, default=Shape.kv_bandwidth, help="KV link, bytes/s")
    p.add_argument("--cap", type=int, default=None, help="continuous batching: requests an engine runs at once")
    p.add_argument("--pd", type=lambda v: tuple(int(x) for x in v.split(":")), default=None, metavar="P:D",
                   help="split the engines: P prefill, D decode")
    a = vars(p.parse_args(argv))
    print(run(a.pop("out"), Shape(**a)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
