from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; the reward function compares completions to `answer`."""

    prompt: str
    answer: str
