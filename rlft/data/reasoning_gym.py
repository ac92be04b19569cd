"""reasoning-gym's procedural tasks (106 generators with verifiers, offline): `data.tasks` mixes them by
weight, each with its generator's options. Each problem keeps its entry, so the `reasoning_gym` rewards score
with the task's own verifier. Held-out problems are drawn first, and no training problem repeats one of them."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from rlft.config.data import check_task_entry
from rlft.errors import ConfigError
from rlft.types import Problem

ANSWER_FORMAT = " Give only the final answer inside <answer></answer>."
DRAWS_PER_PROBLEM = 20  # a task whose generator repeats itself more than this is refused as too small


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    weight: float
    options: dict[str, Any]  # the generator's config keys (min_terms, max_digits, ...), checked against it


def task_specs(tasks: dict[str, Any]) -> list[TaskSpec]:
    """`data.tasks` entries, `name: weight` or `name: {weight: W, option: value, ...}`, checked against
    reasoning-gym's registry and each generator's own config (its keys, their types, its validate())."""
    import reasoning_gym.factory as factory
    specs = []
    for name, entry in tasks.items():
        key = f"data.tasks.{name}"
        if name not in factory.DATASETS:
            raise ConfigError(f"{key}: reasoning-gym has no task '{name}' (it has {len(factory.DATASETS)}, "
                              f"e.g. {', '.join(sorted(factory.DATASETS)[:6])})")
        weight, options = check_task_entry(key, entry)
        _check_options(key, factory.DATASETS[name][1], options)
        specs.append(TaskSpec(name, weight, options))
    return specs


def _check_options(key: str, config_class: type, options: dict[str, Any]) -> None:
    known = {f.name: f for f in dataclasses.fields(config_class) if f.name not in ("seed", "size")}
    for option, value in options.items():
        if option not in known:
            raise ConfigError(f"{key}.{option}: not an option of this task (its options: weight, "
                              f"{', '.join(known)})")
        default = known[option].default
        if not _same_kind(value, default):
            raise ConfigError(f"{key}.{option} must be {type(default).__name__} like its default {default!r} "
                              f"(got {value!r})")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}.{option} must be a finite number (got {value})")
    try:
        config_class(**options).validate()
    except (AssertionError, ValueError) as err:  # reasoning-gym checks ranges with asserts
        raise ConfigError(f"{key}: {err or 'the options are inconsistent'}") from None


def _same_kind(value, default) -> bool:
    """`value` may stand where the generator's `default` stands: the same simple type (an int for a float;
    a bool is not an int here); other defaults (None, lists) are the generator's to check."""
    if not isinstance(default, (bool, int, float, str)):
        return True
    if isinstance(value, bool) or isinstance(default, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def reasoning_gym_split(tasks: dict[str, Any], size: int, eval_size: int, seed: int
                        ) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): each task's share of both by weight; held-out questions are distinct and none is
    among the training ones."""
    specs = task_specs(tasks)
    total = sum(spec.weight for spec in specs)
    train, held_out = [], []
    for index, spec in enumerate(specs):
        eval_count = max(1, round(eval_size * spec.weight / total))
        train_count = max(1, round(size * spec.weight / total))
        entries = _entries(spec, seed * 1000 + index, DRAWS_PER_PROBLEM * (eval_count + train_count))
        task_held_out = _distinct(entries, eval_count, spec)
        taken = {entry["question"] for entry in task_held_out}
        task_train = list(itertools.islice((e for e in entries if e["question"] not in taken), train_count))
        if len(task_train) < train_count:
            raise ConfigError(f"data.tasks.{spec.name}: its generator gave only {len(task_train)} training "
                              f"problems besides the {eval_count} held out (widen its options or lower data.size)")
        held_out += [_problem(spec.name, entry) for entry in task_held_out]
        train += [_problem(spec.name, entry) for entry in task_train]
    return train, held_out


def _entries(spec: TaskSpec, seed: int, limit: int):
    """The task's problems, generated lazily, at most `limit` (a generator may repeat itself)."""
    import reasoning_gym
    dataset = reasoning_gym.create_dataset(spec.name, size=limit, seed=seed, **spec.options)
    return (dataset[i] for i in range(limit))


def _distinct(entries, count: int, spec: TaskSpec) -> list[dict]:
    seen, out = set(), []
    for draws, entry in enumerate(entries, 1):
        if entry["question"] not in seen:
            seen.add(entry["question"])
            out.append(entry)
            if len(out) == count:
                return out
        if draws >= DRAWS_PER_PROBLEM * count:
            break
    raise ConfigError(f"data.tasks.{spec.name}: its generator gave only {len(out)} distinct problems in "
                      f"{DRAWS_PER_PROBLEM * count} draws, fewer than the {count} held out (lower data.eval_size "
                      "or widen its options)")


def _problem(name: str, entry: dict) -> Problem:
    return Problem(prompt=entry["question"] + ANSWER_FORMAT, answer=str(entry["answer"]),
                   fields={"rg_task": name, "rg_entry": dict(entry)})
