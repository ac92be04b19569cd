"""Countdown: reach a target from a few numbers with + - * / and parentheses, each number used once.

Problems are generated from a seed: numbers drawn at random, the target the value of a random expression
over all of them (so every problem has a solution, kept as the reference answer). The held-out problems
come from another seed and never share (numbers, target) with the training ones.
"""

from __future__ import annotations

import random
from fractions import Fraction

from rlft.data.unique import draw_unique
from rlft.types import Problem

PROMPT = ("Using the numbers {numbers}, make {target}. Use each number exactly once, with + - * / and "
          "parentheses. Think inside <think></think>, then give only the expression inside <answer></answer>.")


def countdown_problem(rng: random.Random, count: int, max_number: int) -> Problem | None:
    numbers = [rng.randint(1, max_number) for _ in range(count)]
    expression, value = _random_expression(rng, [str(n) for n in numbers], [Fraction(n) for n in numbers])
    if value is None or value.denominator != 1 or not 0 < value <= 1000:
        return None
    target = int(value)
    return Problem(prompt=PROMPT.format(numbers=numbers, target=target), answer=expression,
                   fields={"numbers": numbers, "target": target})


def _random_expression(rng, texts: list[str], values: list[Fraction]) -> tuple[str, Fraction | None]:
    """Combine two random operands until one remains (every number used once)."""
    texts, values = list(texts), list(values)
    while len(values) > 1:
        i, j = rng.sample(range(len(values)), 2)
        op = rng.choice("+-*/")
        a, b = values[i], values[j]
        if op == "/" and b == 0:
            return "", None
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        text = f"({texts[i]}{op}{texts[j]})"
        for k in sorted((i, j), reverse=True):
            del texts[k], values[k]
        texts.append(text)
        values.append(value)
    return texts[0][1:-1] if texts[0].startswith("(") else texts[0], values[0]


def countdown_split(size: int, eval_size: int, count: int, max_number: int, seed: int
                    ) -> tuple[list[Problem], list[Problem]]:
    def key(problem: Problem) -> tuple:
        return tuple(sorted(problem.fields["numbers"])), problem.fields["target"]

    taken: set = set()
    eval_rng, train_rng = random.Random(f"countdown-eval:{seed}"), random.Random(f"countdown-train:{seed}")
    held_out = draw_unique(lambda: countdown_problem(eval_rng, count, max_number), key, eval_size, taken)
    return draw_unique(lambda: countdown_problem(train_rng, count, max_number), key, size, taken), held_out
