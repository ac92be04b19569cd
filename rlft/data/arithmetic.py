"""The default task: two-number addition, "57+65=" -> "122".

The train and held-out sets are a fixed, seeded split of every operand pair in the range, so the
held-out problems are never trained on, neither by the SFT build script nor by RL.

`sloppy_sum` is the SFT teacher of the shipped tiny model: it forgets each carry with a fixed
probability. It stands in for an imperfect SFT dataset; its effect is a model that knows how to
carry but mostly does not, which is a stable plateau (more SFT does not move it) and leaves RL
with a verifiable reward something real to learn.
"""

from __future__ import annotations

import random

from rlft.types import Problem


def addition_problem(a: int, b: int) -> Problem:
    return Problem(prompt=f"{a}+{b}=", answer=str(a + b))


def split_problems(min_operand: int, max_operand: int, eval_size: int, split_seed: int
                   ) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): every pair (a, b) in the range, shuffled once by `split_seed`."""
    pairs = [(a, b) for a in range(min_operand, max_operand + 1)
             for b in range(min_operand, max_operand + 1)]
    if eval_size >= len(pairs):
        raise ValueError(f"data.eval_size={eval_size} leaves no training problems "
                         f"({len(pairs)} pairs in [{min_operand}, {max_operand}])")
    random.Random(split_seed).shuffle(pairs)
    held_out = [addition_problem(a, b) for a, b in pairs[:eval_size]]
    train = [addition_problem(a, b) for a, b in pairs[eval_size:]]
    return train, held_out


def sloppy_sum(a: int, b: int, forget_carry_prob: float, rng: random.Random) -> str:
    """Column addition, least significant digit first, dropping each carry with the given probability."""
    digits, carry = [], 0
    while a or b or carry:
        column = a % 10 + b % 10 + carry
        digits.append(column % 10)
        carry = column // 10
        if carry and rng.random() < forget_carry_prob:
            carry = 0
        a, b = a // 10, b // 10
    return "".join(str(d) for d in reversed(digits)) or "0"
