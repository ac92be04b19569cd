"""Reward functions: `fn(prompt, completion, answer, **fields) -> float | dict[str, float]`.

`reward.fns` names them: a registered name (the built-ins of rlft.rewards.builtin) or a user function by
import path, `mypkg.rewards:score`. A function gets, as keyword arguments, the prompt, the completion,
the reference answer, `response_tokens` (the completion's length in tokens) and the row's other fields,
each only if its signature names it (or takes **kwargs). A dict result is a set of named parts that add up.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from rlft.registry import Registry, import_function

RewardFn = Callable[..., Any]
REWARDS: Registry[RewardFn] = Registry("reward")


@REWARDS.register("exact_match")
def exact_match(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, is exactly the answer."""
    return float(completion.strip() == answer.strip())


def is_import_path(name: str) -> bool:
    return ":" in name


def resolve_reward(name: str) -> RewardFn:
    """A registered reward, or `module.path:function`; ConfigError naming what is wrong."""
    if not is_import_path(name):
        import rlft.rewards.builtin  # noqa: F401  (registers the built-ins)
        return REWARDS.get(name)
    return import_function(name, "reward")


def call_reward(fn: RewardFn, arguments: dict[str, Any]) -> Any:
    """fn with the arguments its signature accepts."""
    return fn(**accepted_arguments(fn, arguments))


def accepted_arguments(fn: RewardFn, arguments: dict[str, Any]) -> dict[str, Any]:
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return arguments
    return {k: v for k, v in arguments.items() if k in parameters}
