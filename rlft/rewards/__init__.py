"""Reward functions: (prompt, completion, answer) -> float, looked up by name (`reward.name`)."""

from __future__ import annotations

from typing import Callable

from rlft.errors import RewardError
from rlft.registry import Registry

RewardFn = Callable[[str, str, str], float]
REWARDS: Registry[RewardFn] = Registry("reward")


@REWARDS.register("exact_match")
def exact_match(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, is exactly the answer."""
    return float(completion.strip() == answer.strip())


def score(fn: RewardFn, name: str, prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
    rewards = []
    for index, (prompt, completion, answer) in enumerate(zip(prompts, completions, answers)):
        try:
            value = float(fn(prompt, completion, answer))
        except Exception as err:
            raise RewardError(f"reward '{name}' raised on sample {index} (prompt {prompt!r}, "
                               f"completion {completion!r}): {type(err).__name__}: {err}") from err
        rewards.append(value)
    return rewards
