"""The built-in reward functions (registered by name; their settings come from the reward config)."""

from __future__ import annotations

import ast
import re
from fractions import Fraction

from rlft.rewards import REWARDS

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def final_answer(completion: str) -> str:
    """The last <answer>...</answer> of a completion, or its last non-empty line when it has none."""
    tagged = ANSWER_TAG.findall(completion)
    if tagged:
        return tagged[-1].strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@REWARDS.register("format")
def format_reward(completion: str, format_pattern: str) -> float:
    """1.0 when the whole completion (whitespace stripped) matches the pattern (`reward.format_pattern`,
    by default reasoning in <think> tags, then the answer in <answer> tags)."""
    return float(re.fullmatch(format_pattern, completion.strip(), flags=re.DOTALL) is not None)


@REWARDS.register("length_penalty")
def length_penalty(response_tokens: int, max_response_tokens: int, length_target: int | None) -> float:
    """0 up to `length_target` tokens (null: half of rollout.max_new_tokens), then falling linearly to -1
    at max_new_tokens: a nudge towards shorter answers, added to the task reward."""
    target = max_response_tokens // 2 if length_target is None else length_target
    over = max(0, response_tokens - target)
    return -min(1.0, over / max(1, max_response_tokens - target))


@REWARDS.register("countdown")
def countdown(completion: str, numbers: list[int], target: int) -> float:
    """1.0 when the answer is an arithmetic expression (+ - * / and parentheses) that uses every one of
    `numbers` exactly once and equals `target`; 0.0 otherwise (wrong value, numbers, or not an expression)."""
    expression = final_answer(completion).split("=")[0].strip()
    try:
        used, value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return 0.0
    return float(sorted(used) == sorted(numbers) and value == target)


def _evaluate(node: ast.AST) -> tuple[list[int], Fraction]:
    """(numbers used, exact value) of an expression of integers, + - * / and parentheses; ValueError
    for anything else (names, calls, powers, floats), so no completion is ever executed."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value], Fraction(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        (left_used, left), (right_used, right) = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        elif isinstance(node.op, ast.Mult):
            value = left * right
        else:
            value = left / right
        return left_used + right_used, value
    raise ValueError(f"not allowed in a countdown answer: {type(node).__name__}")


@REWARDS.register("answer_match")
def answer_match(completion: str, answer: str) -> float:
    """1.0 when the final answer (<answer> tags, or the last line) equals the reference: as numbers when
    both are numbers (so "0.50" matches "0.5"), else as whitespace-stripped text."""
    given = final_answer(completion)
    try:
        return float(Fraction(given.replace(",", "")) == Fraction(answer.strip().replace(",", "")))
    except (ValueError, ZeroDivisionError):
        return float(given == answer.strip())
