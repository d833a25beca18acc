"""The rollout side: problems -> chat template -> engine -> samples, plus the async producer loop.

`RolloutWorker` is plain Python. Colocated, it runs on a thread of the trainer's process;
disaggregated, `ray_actors.RolloutActor` wraps it in its own process. Every engine call is a
`generate` span carrying the weight version the samples were drawn under.

Async mode (`start_producing`): a thread keeps generating groups into a bounded queue whatever the
trainer is doing; the trainer `take`s finished groups. A weight update lands between two batches
(it waits for the batch in flight: the weight-update stall of async training).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass, field

import rltrace
from examples.tiny_grpo.policy import PolicyConfig, policy_config
from examples.tiny_grpo.system.engine import Completion, RolloutEngine, SamplingParams
from examples.tiny_grpo.system.tokenizer import Tokenizer
from examples.tiny_grpo.task import Problem, ProblemSource

STRAGGLER_TOKENS = 96  # the --straggler sample's budget


@dataclass
class RolloutSettings:
    """What the rollout side needs to know (a slice of the trainer's Config; picklable for Ray)."""

    policy: PolicyConfig
    seed: int = 0
    group_size: int = 8
    min_digits: int = 5
    max_digits: int = 5
    max_new_tokens: int = 12
    temperature: float = 1.0
    top_p: float = 1.0
    precision: str = "fp32"
    straggler: bool = False  # one sample per batch ignores <|eos|> and runs to straggler_tokens
    straggler_tokens: int = STRAGGLER_TOKENS
    bad_template: bool = False  # render prompts without the <|assistant|> generation prompt
    hang_after: int | None = None  # from this step on, generate() never returns

    @classmethod
    def from_config(cls, cfg) -> RolloutSettings:
        """The rollout side's slice of the trainer's `cli.Config` (the engines get the trainer's model shape)."""
        return cls(
            policy_config(cfg), seed=cfg.seed, group_size=cfg.group_size, min_digits=cfg.digits, max_digits=cfg.digits,
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
            precision=cfg.rollout_precision, straggler=cfg.straggler, bad_template=cfg.bad_template,
            hang_after=cfg.hang_after,
        )


@dataclass
class Sample:
    """One generated response and what is known about it when it leaves the rollout side."""

    sample_id: int
    group_id: int
    problem: Problem
    prompt_text: str
    prompt_tokens: list[int]
    response_text: str  # decoded, special tokens shown, final <|eos|> removed
    completion: Completion
    weight_version: int  # v_s: the engine's weights when generation started
    worker_rank: int = 0
    extras: dict = field(default_factory=dict)


def _span_ids(carrier: dict | None) -> dict:
    """`weight_sync_trace_id`/`_span_id` from a carrier's W3C traceparent (`00-<trace>-<span>-<flags>`)."""
    parts = (carrier or {}).get("traceparent", "").split("-")
    return {"weight_sync_trace_id": parts[1], "weight_sync_span_id": parts[2]} if len(parts) == 4 else {}


class RolloutWorker:
    """Owns a `RolloutEngine` (its own weights), the problem stream and the rollout fault flags."""

    def __init__(self, settings: RolloutSettings, rank: int = 0, n_workers: int = 1):
        self.settings, self.rank, self.n_workers = settings, rank, n_workers
        self.tokenizer = Tokenizer()
        self.engine = RolloutEngine(
            settings.policy,
            eos_id=self.tokenizer.eos_id,
            pad_id=self.tokenizer.pad_id,
            precision=settings.precision,
            seed=settings.seed * 1009 + rank,
        )
        self.problems = ProblemSource(settings.seed * 1009 + rank + 1, settings.min_digits, settings.max_digits)
        self._straggler_rng = random.Random(settings.seed * 1009 + rank + 2)
        self.version = 0
        self.weights_from: dict = {}  # ids of the trainer's weight_sync span that sent the current weights
        self._next_group = 0
        self._never = threading.Event()  # the --hang-after fault waits on this; nothing sets it
        self._engine_lock = threading.Lock()  # async: a weight update waits for the batch in flight
        self._queue: queue.Queue[list[Sample]] | None = None
        self._stop = threading.Event()
        self._producer: threading.Thread | None = None
        self.error: BaseException | None = None  # what stopped the producer loop, if anything

    # --- weights ------------------------------------------------------------------------------
    def load_weights(self, named_tensors, version: int, sender: dict | None = None) -> int:
        """Copy new weights into the engine (between batches); returns the bytes copied. `sender` is the
        `rltrace.inject()` carrier of the trainer's weight_sync span, named on later generate spans."""
        with rltrace.phase("drain"):  # weight_sync's child phases (docs/store.md)
            if not self._engine_lock.acquire(blocking=False):
                with rltrace.phase("wait", waiting_for="generate"):  # async: a batch is in flight
                    self._engine_lock.acquire()
        try:
            with rltrace.phase("load") as span:
                nbytes = self.engine.load_weights(named_tensors)
                span.set(bytes=nbytes)
            self.version, self.weights_from = version, _span_ids(sender)
        finally:
            self._engine_lock.release()
        return nbytes

    # --- one batch ----------------------------------------------------------------------------
    def generate(self, n_groups: int, step: int) -> list[Sample]:
        """Generate `n_groups` groups of `group_size` samples, as one engine batch (one span)."""
        s = self.settings
        problems = [self.problems.next() for _ in range(n_groups)]
        # group ids interleave the ranks, so they are unique across workers
        group_ids = [(self._next_group + i) * self.n_workers + self.rank for i in range(n_groups)]
        self._next_group += n_groups
        texts = [self.tokenizer.chat_prompt(p.user_text, add_generation_prompt=not s.bad_template) for p in problems]
        prompts = [self.tokenizer.encode(t) for t in texts]
        params = [SamplingParams(s.max_new_tokens, s.temperature, s.top_p)] * (n_groups * s.group_size)
        if s.straggler:  # vLLM-style ignore_eos with a large budget: this one sample holds the batch
            params = list(params)
            params[self._straggler_rng.randrange(len(params))] = SamplingParams(
                s.straggler_tokens, s.temperature, s.top_p, ignore_eos=True
            )
        flat_prompts = [p for p in prompts for _ in range(s.group_size)]
        with rltrace.phase("generate", step=step, weight_version=self.version) as span:
            span.set(samples=len(flat_prompts), precision=s.precision, **self.weights_from)
            if s.hang_after is not None and step >= s.hang_after:
                self._never.wait()  # --hang-after: this worker stops answering, inside its generate span
            completions = self.engine.generate(flat_prompts, params)
            span.set(response_tokens=sum(len(c.tokens) for c in completions))
        samples = []
        for i, c in enumerate(completions):
            g = i // s.group_size
            body = c.tokens[:-1] if c.finish_reason == "stop" else c.tokens
            samples.append(
                Sample(
                    sample_id=group_ids[g] * s.group_size + i % s.group_size,
                    group_id=group_ids[g],
                    problem=problems[g],
                    prompt_text=texts[g],
                    prompt_tokens=prompts[g],
                    response_text=self.tokenizer.decode(body),
                    completion=c,
                    weight_version=self.version,
                    worker_rank=self.rank,
                )
            )
        return samples

    # --- async: a producer thread and a bounded queue of groups --------------------------------
    def start_producing(self, groups_per_batch: int, capacity_groups: int) -> None:
        """Generate continuously in a thread; at most `capacity_groups` finished groups wait in the queue."""
        self._queue = queue.Queue(maxsize=capacity_groups)
        self._producer = threading.Thread(
            target=self._produce, args=(groups_per_batch,), name=f"rollout-producer-{self.rank}", daemon=True
        )
        self._producer.start()

    def _produce(self, groups_per_batch: int) -> None:
        try:
            while not self._stop.is_set():
                with self._engine_lock:
                    # step = the trainer step these weights belong to (version v is trained at step v)
                    samples = self.generate(groups_per_batch, step=self.version)
                size = self.settings.group_size
                for start in range(0, len(samples), size):
                    self._put(samples[start : start + size])
        except BaseException as exc:  # surfaced to the trainer by take()
            self.error = exc

    def _put(self, group: list[Sample]) -> None:
        try:
            self._queue.put_nowait(group)
            return
        except queue.Full:
            pass
        with rltrace.phase("wait", waiting_for="train", step=self.version):  # the queue is full: back-pressure
            while not self._stop.is_set():
                try:
                    self._queue.put(group, timeout=0.2)
                    return
                except queue.Full:
                    continue

    def take(self, n_groups: int, min_version: int, timeout: float) -> tuple[list[Sample], int]:
        """`n_groups` finished groups generated at version >= `min_version`, oldest first, and how
        many older groups were dropped to honour it (the `--max-staleness` bound)."""
        if self._queue is None:
            raise RuntimeError("take() needs start_producing() first")
        groups, dropped, deadline = [], 0, time.monotonic() + timeout
        while len(groups) < n_groups:
            if self.error is not None:
                raise RuntimeError(f"rollout producer of rank {self.rank} failed: {self.error!r}") from self.error
            try:
                group = self._queue.get(timeout=min(0.2, max(deadline - time.monotonic(), 0.001)))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"rollout worker {self.rank} produced no group within {timeout:.0f} s") from None
                continue
            if group[0].weight_version < min_version:
                dropped += 1
                continue
            groups.append(group)
        return [sample for group in groups for sample in group], dropped

    def stop(self, timeout: float = 5.0) -> None:
        """Stop producing; the batch in flight finishes (so its span ends) unless it takes over `timeout`."""
        self._stop.set()
        if self._producer is not None:
            self._producer.join(timeout)
