"""Scores completions with `reward.fns`: a weighted sum, each function's part kept for the metrics.

Built-in functions (trusted) run here; user functions (import paths) in worker processes with a per-call
deadline, a memory cap and recycling (rlft.rewards.pool, which says what is guaranteed). Every result is
checked (rlft.rewards.as_reward: a float or a dict of floats, finite; a str is refused), and one function's
results in a batch must agree: all floats, or all dicts with the same keys.

A sample whose function raises, times out, kills its worker or returns a malformed or disagreeing result:
with `reward.on_error=raise` the first such failure ends the batch at once (the calls in flight are killed)
and stops the run with one error naming the function, the sample and what went wrong; with
`reward.on_error=zero` it scores 0 (every part, for a dict reward) and is counted in Scores.errors.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rlft.errors import ConfigError, RewardError
from rlft.rewards import as_reward, call_reward, is_import_path, resolve_reward
from rlft.rewards.pool import CANCELLED, Outcome, RewardPool
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
        stop = self.on_error == "raise"  # the first failure ends the batch: no waiting on the rest
        if is_import_path(name):
            outcomes = self.pool.run(name, calls, stop_at_first_error=stop)
        else:
            outcomes = _run_here(fn, calls, stop)
        outcomes = _agreeing(outcomes)
        failures = [(i, o.error) for i, o in enumerate(outcomes) if o.error is not None and not o.cancelled]
        if stop and failures:
            index, error = failures[0]
            raise RewardError(f"reward '{name}' failed on sample {index} (prompt {calls[index]['prompt']!r}, "
                              f"completion {calls[index]['completion']!r}): {error}")
        values = [0.0 if o.error is not None else o.value for o in outcomes]
        if any(isinstance(v, dict) for v in values):  # a failed sample of a dict reward scores 0 in every part
            keys = next(v for v in values if isinstance(v, dict)).keys()
            values = [v if isinstance(v, dict) else dict.fromkeys(keys, 0.0) for v in values]
        return values, len(failures)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _totals(values: list) -> list[float]:
    """Each sample's reward: the value, or the sum of a dict reward's parts."""
    return [sum(v.values()) if isinstance(v, dict) else v for v in values]


def _run_here(fn, calls: list[dict[str, Any]], stop_at_first_error: bool) -> list[Outcome]:
    """A built-in function (trusted) in this process, each result checked as a worker checks it."""
    outcomes = []
    for arguments in calls:
        try:
            outcomes.append(Outcome(value=as_reward(call_reward(fn, arguments))))
        except Exception as err:
            outcomes.append(Outcome(error=f"{type(err).__name__}: {err}"))
            if stop_at_first_error:
                break
    return outcomes + [CANCELLED] * (len(calls) - len(outcomes))


def _agreeing(outcomes: list[Outcome]) -> list[Outcome]:
    """One function's results must be of one shape: all floats, or all dicts with the same keys (the parts
    logged). The first successful sample sets it; a sample that differs is that sample's error."""
    first = next((i for i, o in enumerate(outcomes) if o.error is None), None)
    if first is None:
        return outcomes
    shape = _shape(outcomes[first].value)
    return [o if o.error is not None or _shape(o.value) == shape else
            Outcome(error=f"TypeError: returned {_shown(o.value)} but sample {first} returned "
                          f"{_shown(outcomes[first].value)}: a function's rewards are all floats, or all dicts "
                          f"with the same keys")
            for o in outcomes]


def _shape(value) -> tuple[str, ...] | None:
    return tuple(sorted(value)) if isinstance(value, dict) else None


def _shown(value) -> str:
    if isinstance(value, dict):
        return f"a dict with the keys {', '.join(sorted(value))}"
    return f"the float {value:g}"
