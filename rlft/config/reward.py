"""`reward`: reward functions (rlft.rewards), built-in names or `module:function`, summed with weights.
Options that use a function with settings (the `format` regex, the code sandbox) have those keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from rlft.config.checks import at_least, finite, positive
from rlft.rewards.builtin import THINK_ANSWER

OnError = StrEnum("OnError", {"raise": "raise", "zero": "zero"}, module=__name__)  # `raise` is a keyword: no class body


@dataclass
class RewardConfig:
    fns: list[str] = field(default_factory=lambda: ["exact_match"])
    """Reward functions: built-in names (exact_match, format, ...) or module:function, summed."""
    weights: Optional[list[float]] = None
    """One weight per function; null = 1 each."""
    accuracy: str = "exact_match"
    """The function whose full marks (>= 1) count as correct, for train and held-out accuracy."""
    on_error: OnError = OnError["raise"]
    """A function that raises or times out: raise stops the run with one line naming it and the sample
    (the last checkpoint is intact); zero scores 0 and counts it in reward/errors."""
    timeout_s: float = 10.0
    """Seconds per call of a user function (module:function), which runs in a worker process; a call past
    it is reported within about a second more (its worker is killed and replaced), whatever the batch size."""


@dataclass
class FormattedReward(RewardConfig):
    format_pattern: str = THINK_ANSWER
    """The `format` reward's regex: full marks when the whole completion matches it."""
    length_target: Optional[int] = None
    """The `length_penalty` reward: tokens without penalty; null = rollout.max_new_tokens // 2."""


@dataclass
class CodeTestsReward(RewardConfig):
    sandbox_timeout_s: float = 10.0
    """`code_tests`: wall-clock (and CPU) seconds per program in the sandbox."""
    sandbox_memory_mb: int = 1024
    """`code_tests`: address space per program, in MiB."""


def check(cfg) -> None:
    """(fns and weights are checked where they are resolved, rlft.rewards.scorer, in preflight)"""
    r = cfg.reward
    positive("reward.timeout_s", r.timeout_s)
    for index, weight in enumerate(r.weights or []):  # negative is allowed: a penalty term
        finite(f"reward.weights[{index}]", weight)
    if isinstance(r, CodeTestsReward):
        positive("reward.sandbox_timeout_s", r.sandbox_timeout_s)
        at_least("reward.sandbox_memory_mb", r.sandbox_memory_mb, 64)  # Python itself cannot start in less
