"""Scores completions with `reward.fns`: a weighted sum, each function's part kept for the metrics.

Built-in functions run here; user functions (import paths) in a process pool with a per-call timeout
(rlft.rewards.pool). A function that raises or times out stops the run with one error naming the function
and the sample (`reward.on_error=raise`), or scores 0 and is counted (`reward.on_error=zero`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from rlft.errors import ConfigError, RewardError
from rlft.rewards import call_reward, is_import_path, resolve_reward
from rlft.rewards.pool import Outcome, RewardPool
from rlft.types import Problem, Scores

# Reward settings an option's schema may have (rlft.config.reward), passed to the functions that name them
SETTINGS = ("format_pattern", "length_target", "sandbox_timeout_s", "sandbox_memory_mb")


class RewardScorer:
    def __init__(self, cfg, max_response_tokens: int):
        names = list(cfg.fns)
        weights = list(cfg.weights) if cfg.weights is not None else [1.0] * len(names)
        if not names:
            raise ConfigError("reward.fns is empty: name at least one reward function")
        if len(weights) != len(names):
            raise ConfigError(f"reward.weights has {len(weights)} values for {len(names)} reward.fns")
        self.fns = [(name, resolve_reward(name), weight) for name, weight in zip(names, weights)]
        self.accuracy = cfg.accuracy
        self.accuracy_fn = resolve_reward(cfg.accuracy)
        self.on_error = cfg.on_error
        self.settings = {key: getattr(cfg, key) for key in SETTINGS if hasattr(cfg, key)}
        self.settings["max_response_tokens"] = max_response_tokens
        uses_pool = any(is_import_path(n) for n in names + [cfg.accuracy])
        # CPU-bound Python: a worker per core, up to 4 (each is a spawned interpreter importing the user's module)
        self.pool = RewardPool(min(4, len(os.sched_getaffinity(0))), cfg.timeout_s) if uses_pool else None

    def score(self, problems: list[Problem], completions: list[str], response_tokens: list[int]) -> Scores:
        """`problems[i]` is the problem `completions[i]` answers."""
        calls = [{**problem.fields, **self.settings, "prompt": problem.prompt, "completion": completion,
                  "answer": problem.answer, "response_tokens": int(tokens)}
                 for problem, completion, tokens in zip(problems, completions, response_tokens)]
        total = torch.zeros(len(calls))
        parts: dict[str, torch.Tensor] = {}
        errors = 0
        raw: dict[str, list[float]] = {}
        for name, fn, weight in self.fns:
            values, failed = self._values(name, fn, calls)
            errors += failed
            raw[name] = _totals(values)
            total += weight * torch.tensor(raw[name])
            if values and isinstance(values[0], dict):
                for key in values[0]:
                    parts[f"{name}/{key}"] = torch.tensor([v.get(key, 0.0) for v in values])
            parts[name] = torch.tensor(raw[name])
        if self.accuracy in raw:
            accuracy = raw[self.accuracy]
        else:
            values, failed = self._values(self.accuracy, self.accuracy_fn, calls)
            errors += failed
            accuracy = _totals(values)
        correct = torch.tensor([float(a >= 1.0) for a in accuracy])
        return Scores(total=total, correct=correct, parts=parts, errors=errors)

    def _values(self, name: str, fn, calls: list[dict[str, Any]]) -> tuple[list, int]:
        if is_import_path(name):
            outcomes = self.pool.run(name, calls)
        else:
            outcomes = [_call_here(fn, arguments) for arguments in calls]
        values, failed = [], 0
        for index, (outcome, arguments) in enumerate(zip(outcomes, calls)):
            value, error = outcome.value, outcome.error
            if error is None:
                value, error = _as_reward(value)
            if error is not None:
                if self.on_error == "raise":
                    raise RewardError(f"reward '{name}' failed on sample {index} (prompt {arguments['prompt']!r}, "
                                      f"completion {arguments['completion']!r}): {error}")
                failed += 1
                value = 0.0
            values.append(value)
        if any(isinstance(v, dict) for v in values):  # a failed sample of a dict reward scores 0 in every part
            keys = next(v for v in values if isinstance(v, dict)).keys()
            values = [v if isinstance(v, dict) else dict.fromkeys(keys, 0.0) for v in values]
        return values, failed

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _totals(values: list) -> list[float]:
    """Each sample's reward: the value, or the sum of a dict reward's parts."""
    return [sum(v.values()) if isinstance(v, dict) else v for v in values]


def _call_here(fn, arguments: dict[str, Any]) -> Outcome:
    try:
        return Outcome(value=call_reward(fn, arguments))
    except Exception as err:
        return Outcome(error=f"{type(err).__name__}: {err}")


def _as_reward(value) -> tuple[Any, str | None]:
    """A float, or a dict of floats; anything else is the function's error."""
    try:
        if isinstance(value, dict):
            value = {str(k): float(v) for k, v in value.items()}
            bad = [k for k, v in value.items() if not math.isfinite(v)]
        else:
            value = float(value)
            bad = [] if math.isfinite(value) else ["value"]
    except (TypeError, ValueError):
        return None, f"returned {type(value).__name__} {value!r}: a reward is a float or a dict of floats"
    if bad:
        return None, f"returned a non-finite reward ({value!r})"
    return value, None
