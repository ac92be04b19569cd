"""reasoning-gym's procedural tasks (106 generators with verifiers, offline): `data.tasks` mixes them by
weight. Each problem keeps its entry, so the `reasoning_gym` reward scores with the task's own scorer."""

from __future__ import annotations

from rlft.types import Problem
from rlft.errors import ConfigError

ANSWER_FORMAT = " Give only the final answer inside <answer></answer>."


def reasoning_gym_split(tasks: dict[str, float], size: int, eval_size: int, seed: int
                        ) -> tuple[list[Problem], list[Problem]]:
    # held-out and training entries come from different seeds (a held-out one may repeat by chance)
    return _mix(tasks, size, seed * 2 + 1), _mix(tasks, eval_size, seed * 2)


def _mix(tasks: dict[str, float], total: int, seed: int) -> list[Problem]:
    import reasoning_gym
    weights = sum(tasks.values())
    if weights <= 0:
        raise ConfigError("data.tasks: the weights must add up to more than 0")
    counts = {name: round(total * w / weights) for name, w in tasks.items()}
    problems = []
    for index, (name, count) in enumerate(counts.items()):
        try:
            dataset = reasoning_gym.create_dataset(name, size=max(1, count), seed=seed * 1000 + index)
        except Exception as err:  # an unknown name raises inside reasoning-gym's registry
            raise ConfigError(f"data.tasks: reasoning-gym has no task '{name}' ({err})") from None
        for entry in dataset:
            problems.append(Problem(prompt=entry["question"] + ANSWER_FORMAT, answer=str(entry["answer"]),
                                    fields={"rg_task": name, "rg_entry": dict(entry)}))
    return problems
