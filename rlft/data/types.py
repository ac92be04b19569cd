from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; reward functions compare completions to `answer`, and get
    the row's other fields (`fields`: test code, task metadata, ...) as keyword arguments."""

    prompt: str
    answer: str
    fields: dict[str, Any] = field(default_factory=dict, compare=False)


def draw_unique(make: Callable[[], Problem | None], key: Callable[[Problem], Hashable], count: int,
                taken: set) -> list[Problem]:
    """`count` problems from `make` (None: draw again) whose keys are not yet in `taken`, which grows; a
    generated task draws its held-out set first, then its training set with the same `taken`."""
    problems: list[Problem] = []
    while len(problems) < count:
        problem = make()
        if problem is not None and key(problem) not in taken:
            taken.add(key(problem))
            problems.append(problem)
    return problems
