"""Generated tasks draw their held-out problems first, then training ones that differ from them."""

from __future__ import annotations

from typing import Callable, Hashable

from rlft.types import Problem


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
