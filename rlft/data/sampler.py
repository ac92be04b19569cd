"""Prompt order for training: a fresh seeded shuffle each epoch (or the data's order), resumable from a position."""

from __future__ import annotations

import random

from rlft.types import Problem


class PromptSampler:
    """Deals problems in epochs; `position` (problems dealt so far) is all a checkpoint needs to resume."""

    def __init__(self, problems: list[Problem], seed: int, position: int = 0, shuffle: bool = True):
        if not problems:
            raise ValueError("no training problems")
        self.problems = problems
        self.seed = seed
        self.position = position
        self.shuffle = shuffle
        self._epoch, self._order = -1, []

    def next(self, count: int) -> list[Problem]:
        batch = []
        for _ in range(count):
            epoch, index = divmod(self.position, len(self.problems))
            if epoch != self._epoch:
                self._order = list(range(len(self.problems)))
                if self.shuffle:
                    random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
                self._epoch = epoch
            batch.append(self.problems[self._order[index]])
            self.position += 1
        return batch
