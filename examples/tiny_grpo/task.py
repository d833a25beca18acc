"""The task: reverse a short string of digits. Verifiable, with partial credit per position.

    prompt  "reverse 3141"      answer "1413"      reward = matching positions / max(len)

A random policy scores about 0.05; a perfect one 1.0. (The `--slow-reward` fault swaps in a
CPU-bound checker standing for an LLM judge: system/faults.py.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    digits: str

    @property
    def user_text(self) -> str:
        return f"reverse {self.digits}"

    @property
    def answer(self) -> str:
        return self.digits[::-1]


class ProblemSource:
    """An endless, seeded stream of problems with `min_digits`..`max_digits` digits."""

    def __init__(self, seed: int, min_digits: int = 3, max_digits: int = 6):
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}..{max_digits}")
        self._rng = random.Random(seed)
        self.min_digits, self.max_digits = min_digits, max_digits

    def next(self) -> Problem:
        n = self._rng.randint(self.min_digits, self.max_digits)
        return Problem("".join(self._rng.choice("0123456789") for _ in range(n)))


def reward(problem: Problem, response_text: str) -> float:
    """Partial credit: fraction of positions where the response matches the reversed digits.

    `response_text` is the decoded response without its final `<|eos|>`; leaked special
    tokens count as characters, so a broken template costs reward.
    """
    target = problem.answer
    matches = sum(a == b for a, b in zip(response_text, target))
    return matches / max(len(target), len(response_text), 1)

