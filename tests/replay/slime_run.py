"""slime dumps made by slime's own rollout code (tests/replay/slime_src), with a stand-in engine.

`run(tmp, rollouts=2, partial=True)` runs `slime.rollout.sglang_rollout.generate_rollout` for
each rollout id of a synchronous run (rollout, then a training pause, then a weight update), and
writes what `--save-debug-rollout-data` and `--save-debug-train-data` write, with slime's
`save_debug_rollout_data` and `_build_dump_payload`. It returns the samples and slime's own
metrics of each rollout (`compute_metrics_from_samples`, `compute_perf_metrics_from_samples`,
`compute_pass_rate`): the numbers rltrace must reproduce.

Stand-ins, because they cannot run here (see slime_src/README.md): `Engine` answers `/generate`
the way SGLang does (token log-probs, finish reason, `weight_version`, prompt/cached/completion
tokens, queue time, e2e latency, decode throughput, PD prefill/decode durations) and stops
mid-answer on abort; the tokenizer gives one id per character; the reward is 1 when the answer
holds the label, 0.5 when it holds its neighbour, else 0. `tool_generate` is a custom generate
function (slime's `--custom-generate-function-path`) that adds a tool turn (loss mask 0, traced as
a `tool_call` span) between two engine calls for every fourth sample.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import sys
import time
import types
import uuid
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path

import torch

#: A checkout of slime (THUDM/slime, tested at commit 624b824a). slime is not on PyPI and its code is
#: not ours to commit: the pinned copy beside the checkout (`../shared/slime_src`, as in CI), or the
#: checkout named by RLTRACE_SLIME_SRC, which wins.
_BESIDE = Path(__file__).resolve().parents[3] / "shared" / "slime_src"
SRC = Path(os.environ.get("RLTRACE_SLIME_SRC") or _BESIDE)
MISSING = (f"needs slime's own rollout code: no checkout of THUDM/slime (tested at 624b824a) at {SRC}; "
           "place the pinned copy at ../shared/slime_src beside this checkout or set RLTRACE_SLIME_SRC")


def available() -> bool:
    """Whether slime's rollout code is there to run."""
    return (SRC / "slime" / "rollout" / "sglang_rollout.py").is_file()
_SLIME = None  # the run the stand-ins serve
TOOL_TEXT = '<|im_start|>tool\n42<|im_end|>\n'


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 256 for c in text]


def _stub(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class Engine:
    """Stands in for SGLang behind slime's router: one `/generate` with SGLang's meta_info."""

    def __init__(self, *, slots: int = 10, token_s: float = 0.002, pd: bool = True):
        self.version, self.token_s, self.pd, self.n_slots = 1, token_s, pd, slots
        self.slots = None  # made on the event loop that slime runs the rollout on
        self.aborted, self.running, self.seen = False, 0, []
        self.slow_prompt: str | None = "Question 2:"
        self.spec = False
        self.kv_speed_gb_s: float | None = None  # set: the PD transfer's speed and time are reported too

    async def generate(self, payload: dict) -> dict:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.n_slots)
        ids, params = list(payload["input_ids"]), payload["sampling_params"]
        rng = random.Random(hash((tuple(ids), self.version)) & 0xFFFFFFFF)
        arrived = time.time()
        self.running += 1
        try:
            async with self.slots:
                queued = time.time() - arrived
                cached = max((_common(ids, s) for s in self.seen), default=0)
                self.seen.append(ids)
                want = rng.choice([3, 5, 8, 12, 20, 70])
                carried = bool(self.slow_prompt) and self.slow_prompt in "".join(map(chr, ids))
                slow = carried and self.version == 1
                if carried:  # still running when rollout 0 has enough groups: aborted, then first done in rollout 1
                    want = 60 if slow else 3
                limit = params["max_new_tokens"]
                n, finish = (limit, "length") if want >= limit else (want, "stop")
                prefill_start = time.time()
                await asyncio.sleep(0.00002 * (len(ids) - cached))  # prefill the uncached part of the prompt
                prefill_s = time.time() - prefill_start
                out = []
                decode_start = time.time()
                for _ in range(n):
                    if self.aborted:
                        finish = "abort"
                        break
                    await asyncio.sleep(self.token_s * (3 if slow else 1))
                    out.append(97 + rng.randrange(6))
                decode_s = max(time.time() - decode_start, 1e-9)
        finally:
            self.running -= 1
        meta = {
            "id": uuid.uuid4().hex, "finish_reason": {"type": finish}, "weight_version": str(self.version),
            "prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": cached,
            "queue_time": queued, "e2e_latency": time.time() - arrived, "decode_throughput": len(out) / decode_s,
            "output_token_logprobs": [(-0.05 - 0.9 * rng.random(), t) for t in out],
        }
        if self.spec:  # speculative decoding: drafts of 4 tokens per verify step, about 60% accepted
            steps = max(1, math.ceil(len(out) / 3))
            meta |= {"spec_verify_ct": steps, "spec_draft_token_num": 4 * steps,
                     "spec_accept_token_num": sum(rng.random() < 0.6 for _ in range(4 * steps))}
        if self.pd:
            meta |= {"pd_prefill_bootstrap_queue_duration": queued, "pd_prefill_forward_duration": prefill_s,
                     "pd_decode_forward_duration": decode_s, "pd_transfer_total_mb": 0.25 * len(ids) / 64}
            if self.kv_speed_gb_s:  # SGLang: MiB moved, at GiB/s (its transfer time is their ratio)
                meta |= {"pd_transfer_speed_gb_s": self.kv_speed_gb_s,
                         "pd_decode_transfer_duration": meta["pd_transfer_total_mb"] / 1024 / self.kv_speed_gb_s}
        return {"text": "".join(map(chr, out)), "meta_info": meta}


def _common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Slime:
    """slime's modules, imported from slime_src with the stand-ins in place."""

    engine: Engine = field(default_factory=Engine)

    def __post_init__(self):
        if str(SRC) not in sys.path:
            sys.path.insert(0, str(SRC))
        global _SLIME
        _SLIME = self  # the stand-ins below serve the newest run (slime's modules import them once)
        if "slime.rollout.sglang_rollout" in sys.modules:
            self._bind()
            return
        engine = sys.modules[__name__]

        async def post(url, payload, max_retries=60, headers=None):
            if url.endswith("/generate"):
                return await engine._SLIME.engine.generate(payload)
            return {}

        async def get(url):
            return {"workers": [{"url": "http://engine"}]}

        async def abort_servers_until_idle(urls):
            engine._SLIME.engine.aborted = True
            while engine._SLIME.engine.running:
                await asyncio.sleep(0.001)

        async def async_rm(args, sample):
            await asyncio.sleep(0.003)
            text = sample.response[-4:]
            return 1.0 if sample.label in text else 0.5 if chr(ord(sample.label) + 1) in text else 0.0

        async def batched_async_rm(args, samples):
            return [await async_rm(args, s) for s in samples]

        _stub("slime.utils.http_utils", post=post, get=get, get_rollout_num_engines=lambda args: 1,
              is_port_available=lambda port: True)
        _stub("slime.observability.logging_utils", log=lambda *a, **k: None)
        _stub("slime.backends").__path__ = []
        _stub("slime.backends.sglang_utils").__path__ = []
        _stub("slime.backends.sglang_utils.server_control", abort_servers_until_idle=abort_servers_until_idle)
        _stub("slime.utils.data", Dataset=object)
        _stub("slime.utils.eval_config", EvalDatasetConfig=object)
        _stub("slime.utils.processing_utils", build_processor_kwargs=dict, encode_image_for_rollout_engine=str,
              load_processor=lambda *a, **k: None, load_tokenizer=lambda *a, **k: CharTokenizer())
        _stub("slime.rollout.rm_hub", async_rm=async_rm, batched_async_rm=batched_async_rm)
        self._bind()

    def _bind(self):
        from slime.observability import metric_utils, rollout_data_utils, rollout_metrics, train_data_utils
        from slime.rollout import sglang_rollout
        from slime.utils import misc, types as slime_types

        self.rollout, self.metrics, self.metric_utils = sglang_rollout, rollout_metrics, metric_utils
        self.rollout_data, self.train_data, self.Sample = rollout_data_utils, train_data_utils, slime_types.Sample
        misc.SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)  # one per run (slime's Timer lives on)


async def tool_generate(args, sample, sampling_params):
    """slime's `generate`, then for every fourth sample a tool turn (loss mask 0) and a second call."""
    from slime.rollout.sglang_rollout import generate
    from slime.utils.types import Sample

    sample = await generate(args, sample, dict(sampling_params))
    if sample.index % 4 != 1 or sample.status != Sample.Status.COMPLETED or TOOL_TEXT in sample.response:
        return sample
    if sample.response_length + len(TOOL_TEXT) >= args.rollout_max_response_len:
        return sample  # no room left for a tool turn and an answer (slime asserts on the budget)
    from slime.observability.trace_utils import trace_span

    started = time.time()
    with trace_span(sample, "tool_call", attrs={"tool": "answer"}):  # as slime's trace guide shows for tool calls
        await asyncio.sleep(0.004)  # the tool runs
    sample.append_response_tokens(args, tokens=CharTokenizer().encode(TOOL_TEXT), trainable=False, text=TOOL_TEXT)
    sample.non_generation_time += time.time() - started
    sample.status = Sample.Status.PENDING
    return await generate(args, sample, dict(sampling_params))


class DataSource:
    """slime's RolloutDataSourceWithBuffer without a dataset file: the buffer first (`pop_first`), then new
    prompts (`prompts`: how many groups of prompts the dataset holds; default endless)."""

    def __init__(self, slime: Slime, args: Namespace, prompts: int | None = None):
        self.slime, self.args, self.buffer, self.next_group, self.prompts = slime, args, [], 0, prompts

    def get_samples(self, n: int):
        take = min(len(self.buffer), n)
        groups = self.buffer[:take]
        del self.buffer[:take]
        while len(groups) < n and (self.prompts is None or self.next_group < self.prompts):
            g, k = self.next_group, self.args.n_samples_per_prompt
            label = "abcdef"[g % 6]
            groups.append([self.slime.Sample(group_index=g, index=g * k + i, prompt=f"Question {g}: say {label}.", label=label)
                           for i in range(k)])
            self.next_group += 1
        return groups

    def add_samples(self, groups):
        self.buffer.extend(groups)


def args_for(*, partial: bool, n: int = 4, groups: int = 2, over: int = 3, max_len: int = 64, spec: bool = False) -> Namespace:
    return Namespace(
        rollout_global_dataset=True, hf_checkpoint="stand-in", sglang_server_concurrency=64, sglang_dp_size=None,
        rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=max_len,
        rollout_stop=None, rollout_stop_token_ids=None, rollout_skip_special_tokens=False,
        sglang_router_ip="127.0.0.1", sglang_router_port=1, ci_test=False, use_rollout_routing_replay=False,
        partial_rollout=partial, mask_offpolicy_in_partial_rollout=partial, group_rm=False,
        custom_generate_function_path="tests.replay.slime_run.tool_generate", rollout_sample_hook_path=None,
        dynamic_sampling_filter_path=None, rollout_batch_size=groups, over_sampling_batch_size=over if partial else groups,
        n_samples_per_prompt=n, rollout_sample_filter_path=None, rollout_all_samples_process_path=None,
        sglang_speculative_algorithm="EAGLE" if spec else None, advantage_estimator="grpo", reward_key=None, log_reward_category=None,
        rollout_num_gpus=1, sglang_enable_deterministic_inference=False,
    )


@dataclass
class Rollout:
    rollout_id: int
    samples: list  # slime Sample objects, as dumped
    metrics: dict  # compute_metrics_from_samples
    perf: dict  # compute_perf_metrics_from_samples
    pass_rate: dict  # compute_pass_rate on the raw rewards
    started: float
    ended: float


def train_payload(slime: Slime, rollout: Rollout) -> dict:
    """What slime's --save-debug-train-data writes for these samples (`_build_dump_payload`, one DP shard);
    the train-side values (log_probs, ref_log_probs, entropy, advantages) stand in for Megatron's forward."""
    samples = rollout.samples
    g = torch.Generator().manual_seed(rollout.rollout_id)
    rollout_lp = [torch.tensor(s.rollout_log_probs, dtype=torch.float32) for s in samples]
    data = {
        "tokens": [torch.tensor(s.tokens, dtype=torch.long) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "total_lengths": [len(s.tokens) for s in samples],
        "loss_masks": [torch.tensor(s.loss_mask, dtype=torch.int) for s in samples],
        "rollout_log_probs": rollout_lp,
        "log_probs": [lp + 0.001 * torch.randn(lp.shape, generator=g) for lp in rollout_lp],
        "ref_log_probs": [lp - 0.01 * torch.rand(lp.shape, generator=g) for lp in rollout_lp],
        "entropy": [torch.rand(lp.shape, generator=g) for lp in rollout_lp],
        "advantages": [torch.full((s.response_length,), float(s.reward) - 0.5) for s in samples],
        "rewards": [float(s.reward) for s in samples],
        "raw_reward": [float(s.reward) for s in samples],
        "sample_indices": [s.index for s in samples],
        "partition": list(range(len(samples))),
        "global_batch_sizes": [len(samples)],
        "num_microbatches": [1],
    }
    shard = {"rank": 0, "data_parallel_rank": 0, "rollout_data": data}
    return slime.train_data._build_dump_payload([shard], rollout_id=rollout.rollout_id, writer_rank=0)


FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"


def _fully_async_worker(args: Namespace, source: DataSource, groups: int) -> None:
    """slime's own fully-async worker (slime/rollout/fully_async_rollout.py) keeping `groups` groups in
    flight, polling every 5 ms (slime's 1 s would only slow the test), installed as the one slime uses."""
    from slime.rollout import fully_async_rollout

    fully_async_rollout._stop_global_worker()
    worker = fully_async_rollout.AsyncRolloutWorker(args, source, concurrency=groups)
    worker.poll_interval = 0.005
    worker.start()
    fully_async_rollout._global_worker = worker


def _starting_the_worker(fn, args: Namespace, source: DataSource):
    """`fn`, which first starts the worker, as slime's first fully-async rollout call does."""

    def rollout(*a, **k):
        _fully_async_worker(args, source, groups=3)
        return fn(*a, **k)

    return rollout


def run(out: Path, *, rollouts: int = 2, partial: bool = True, train: bool = True, pause_s: float = 0.05,
        spec: bool = False, trainer=None, rollout_function_path: str | None = None,
        fully_async: bool = False, kv_speed_gb_s: float | None = None) -> list[Rollout]:
    """A synchronous slime run: rollout, train (a pause), weight update; dumps under `out`.
    `spec`: the engine reports speculative decoding (slime's --sglang-speculative-algorithm);
    `trainer(rollout_id)`: runs in place of the training pause (e.g. slime's timers);
    `rollout_function_path`: slime's --rollout-function-path (default: its sglang_rollout.generate_rollout),
    called as slime's RolloutManager calls it (`call_rollout_fn`);
    `fully_async`: slime's fully-async rollout, with 3 groups in flight and 4 prompts in all: rollout 0
    takes the first two groups to finish, and the slow group 2, started with them, runs on through
    the training pause into rollout 1, which takes it and group 3;
    `kv_speed_gb_s`: the engine also reports its PD KV transfer's speed and time."""
    slime = Slime()
    slime.engine.spec = spec
    slime.engine.kv_speed_gb_s = kv_speed_gb_s
    args = args_for(partial=partial, spec=spec)
    source = DataSource(slime, args, prompts=2 * rollouts if fully_async else None)
    done = []
    for rid in range(rollouts):
        slime.engine.aborted = False
        started = time.time()
        if rollout_function_path or fully_async:
            from slime.rollout.base_types import call_rollout_fn
            from slime.utils.misc import load_function

            fn = load_function(FULLY_ASYNC if fully_async else rollout_function_path)
            if fully_async and rid == 0:
                fn = _starting_the_worker(fn, args, source)
            output = call_rollout_fn(fn, args, rid, source, evaluation=False)
        else:
            output = slime.rollout.generate_rollout(args, rid, source)
        ended = time.time()
        samples = [s for group in output.samples for s in group]
        slime.rollout_data.save_debug_rollout_data(str(out / "rollout_data" / "{rollout_id}.pt"), samples, rollout_id=rid, evaluation=False)
        r = Rollout(
            rid, samples,
            slime.metrics.compute_metrics_from_samples(args, samples),
            slime.metrics.compute_perf_metrics_from_samples(args, samples, ended - started),
            slime.metric_utils.compute_pass_rate(flat_rewards=[s.reward for s in samples], group_size=args.n_samples_per_prompt),
            started, ended,
        )
        if train:
            (out / "train_data").mkdir(parents=True, exist_ok=True)
            torch.save(train_payload(slime, r), out / "train_data" / f"{rid}.pt")
        done.append(r)
        trainer(rid) if trainer else time.sleep(pause_s)  # training
        slime.engine.version += 1  # weight update
    if fully_async:
        from slime.rollout import fully_async_rollout

        fully_async_rollout._stop_global_worker()
    return done
