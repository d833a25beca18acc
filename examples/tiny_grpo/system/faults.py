"""Fault injection that the loop calls into: `--slow-reward`. (`--straggler`, `--bad-template` and
`--hang-after` live in worker.py, `--slow-sync` in weight_sync.Throttle; docs/demo.md shows how
each one looks in rltrace.)"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from examples.tiny_grpo.task import Problem, reward


def slow_verifier(problem: Problem, response_text: str, rounds: int = 2_000_000) -> float:
    """Reward computed the slow way (pure Python, about 0.5 s): a stand-in for an LLM judge.

    Burns CPU instead of sleeping, so a py-spy profile of a slow `reward` span names this function.
    """
    digest = (problem.digits + "|" + response_text).encode()
    for _ in range(rounds // 1000):
        for _ in range(1000):
            digest = digest[1:] + digest[:1]
        digest = hashlib.blake2b(digest, digest_size=16).digest()
    return reward(problem, response_text)


def sometimes_slow(reward_fn: Callable[[Problem, str], float], fraction: float, seed: int):
    """`reward_fn`, except that a seeded `fraction` of calls go through `slow_verifier` (`--slow-reward`)."""
    rng = random.Random(seed)

    def score(problem: Problem, response_text: str) -> float:
        return (slow_verifier if rng.random() < fraction else reward_fn)(problem, response_text)

    return score
