"""Multi-step arithmetic with a reasoning format: "Compute 23*4+17-9." The model is asked to work in
<think></think> and answer in <answer></answer>; `answer_match` scores the answer, `format` the layout."""

from __future__ import annotations

import random

from rlft.data.unique import draw_unique
from rlft.types import Problem

PROMPT = ("Compute {expression}. Work it out step by step inside <think></think>, then give only the number "
          "inside <answer></answer>.")


def multistep_problem(rng: random.Random, steps: int, max_number: int) -> Problem:
    expression = str(rng.randint(1, max_number))
    for _ in range(steps):
        expression += rng.choice("+-*") + str(rng.randint(1, max_number))
    value = evaluate_arithmetic(expression)
    return Problem(prompt=PROMPT.format(expression=expression), answer=str(value), fields={"expression": expression})


def evaluate_arithmetic(expression: str) -> int:
    """+ - * over integers, * first: the usual precedence, without eval."""
    terms, sign, product, number = 0, 1, 1, ""
    for ch in expression + "+":
        if ch.isdigit():
            number += ch
            continue
        product *= int(number)
        number = ""
        if ch == "*":
            continue
        terms += sign * product
        sign, product = (1 if ch == "+" else -1), 1
    return terms


def multistep_split(size: int, eval_size: int, steps: int, max_number: int, seed: int
                    ) -> tuple[list[Problem], list[Problem]]:
    taken: set[str] = set()
    eval_rng, train_rng = random.Random(f"multistep-eval:{seed}"), random.Random(f"multistep-train:{seed}")

    def prompt(problem: Problem) -> str:
        return problem.prompt

    held_out = draw_unique(lambda: multistep_problem(eval_rng, steps, max_number), prompt, eval_size, taken)
    return draw_unique(lambda: multistep_problem(train_rng, steps, max_number), prompt, size, taken), held_out
