"""Reward functions: `fn(prompt, completion, answer, **fields) -> float | dict[str, float]`.

`reward.fns` names them: a registered name (the built-ins of rlft.rewards.builtin) or a user function by
import path, `mypkg.rewards:score`. A function gets, as keyword arguments, the prompt, the completion,
the reference answer, `response_tokens` (the completion's length in tokens) and the row's other fields,
each only if its signature names it (or takes **kwargs). A dict result is a set of named parts that add up.

What a function may return (`as_reward`), strictly, so that a slip is an error naming the function and
the sample rather than a silently wrong reward:
- a number: any `numbers.Real` (int, float, a numpy int or float) or a 0-d numpy array or torch tensor of
  one; bool too, as 1.0 or 0.0 (a pass/fail check may return its verdict as is). A str is refused, even
  "1.0", and so are None, complex, lists and arrays of more than one element;
- or a non-empty dict of such numbers under str keys: the parts.
Every value must be finite. Across one function's batch (rlft.rewards.scorer) the samples must agree: all
numbers, or all dicts with the same keys; a sample that differs is that sample's error.

Tools of multi-turn environments (rlft.envs) run in the same worker pool; `as_tool_output` checks theirs.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
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


def as_reward(value: Any) -> float | dict[str, float]:
    """The function's result as a float or a dict of floats (the rules above); TypeError or ValueError
    saying what was returned."""
    if isinstance(value, dict):
        if not value:
            raise TypeError("returned an empty dict: a dict reward needs at least one part")
        return {_part_name(key): _as_number(part, f" as part {key!r}") for key, part in value.items()}
    return _as_number(value)


def _as_number(value: Any, where: str = "") -> float:
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy scalars, 0-d arrays and tensors
        value = value.item()
    if not isinstance(value, numbers.Real):
        shown = f"{type(value).__name__} {value!r}"[:200]
        raise TypeError(f"returned {shown}{where}: a reward is a float or a dict of floats")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"returned a non-finite reward ({number}{where})")
    return number


def _part_name(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"returned a dict with the key {key!r} ({type(key).__name__}): a part's name is a str")
    return key


# A tool's output beyond this is cut (its tail dropped), so one call cannot flood the context.
MAX_TOOL_OUTPUT_CHARS = 4000


def as_tool_output(value: Any) -> str:
    """A tool returns text; numbers, bools and JSON-able lists and dicts are written as JSON. None and other
    objects are refused (TypeError), so a tool that forgot to return is an error, not an empty observation."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (bool, int, float, list, dict)):
        text = json.dumps(value)
    else:
        raise TypeError(f"returned {type(value).__name__} {value!r:.100}: a tool returns its output as a str")
    if len(text) > MAX_TOOL_OUTPUT_CHARS:
        text = text[:MAX_TOOL_OUTPUT_CHARS] + f"... [{len(text) - MAX_TOOL_OUTPUT_CHARS} more characters cut]"
    return text
