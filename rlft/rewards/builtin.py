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


THINK_ANSWER = r"<think>.*?</think>\s*<answer>.*?</answer>"


@REWARDS.register("format")
def format_reward(completion: str, format_pattern: str = THINK_ANSWER) -> float:
    """1.0 when the whole completion (whitespace stripped) matches the pattern (`reward.format_pattern`,
    by default reasoning in <think> tags, then the answer in <answer> tags)."""
    return float(re.fullmatch(format_pattern, completion.strip(), flags=re.DOTALL) is not None)


@REWARDS.register("length_penalty")
def length_penalty(response_tokens: int, max_response_tokens: int, length_target: int | None = None) -> float:
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


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@REWARDS.register("answer_match")
def answer_match(completion: str, answer: str) -> float:
    """1.0 when the final answer (<answer> tags, or the last line) equals the reference. A numeric reference
    is compared with the last number of the final answer, as a number ("The answer is 0.50." matches 0.5);
    restating the question ("25 + 60") is not an answer. Other references: whitespace-stripped text."""
    given = final_answer(completion).replace(",", "")
    try:
        reference = Fraction(answer.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return float(given == answer.strip())
    numbers = NUMBER.findall(given)
    try:
        return float(bool(numbers) and Fraction(numbers[-1]) == reference)
    except ZeroDivisionError:
        return 0.0


@REWARDS.register("math_verify")
def math_verify(completion: str, answer: str) -> float:
    r"""1.0 when the completion's answer, in <answer> tags or \boxed{}, is mathematically equal to the
    reference (math-verify: 1/2, 0.5 and \frac{1}{2} agree). A completion with neither scores 0: parsing
    free text lets a model score by restating the question, which math-verify evaluates ("25 + 60" equals
    85; measured on SmolLM2). Its timeouts use SIGALRM, so off the main thread they are off too."""
    import threading

    from math_verify import parse, verify
    tagged = ANSWER_TAG.findall(completion)
    if not tagged and "\\boxed" not in completion:
        return 0.0
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(answer if "$" in answer or "\\" in answer else f"${answer}$", parsing_timeout=timeout)
    predicted = parse(tagged[-1] if tagged else completion, parsing_timeout=timeout)
    return float(bool(gold) and bool(predicted) and verify(gold, predicted, timeout_seconds=timeout))


@REWARDS.register("reasoning_gym")
def reasoning_gym_score(completion: str, rg_task: str, rg_entry: dict) -> float:
    """reasoning-gym's own verifier (0..1) on the answer in the last <answer></answer>, as the prompt asks;
    0 without the tags. Strict, so it is the accuracy: a lenient reading never inflates it."""
    tagged = ANSWER_TAG.findall(completion)
    return _reasoning_gym_verdict(tagged[-1].strip(), rg_task, rg_entry) if tagged else 0.0


@REWARDS.register("reasoning_gym_lenient")
def reasoning_gym_lenient(completion: str, rg_task: str, rg_entry: dict) -> float:
    """The verifier on the answer in any of the usual final-answer forms (lenient_answer): a learning signal
    for a model that answers right but not yet in the tags."""
    return _reasoning_gym_verdict(lenient_answer(completion), rg_task, rg_entry)


def _reasoning_gym_verdict(answer: str, rg_task: str, rg_entry: dict) -> float:
    import reasoning_gym
    return float(reasoning_gym.get_score_answer_fn(rg_task)(answer, rg_entry))


BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
DECORATION = " \t*_`$.:"  # markdown bold and code, LaTeX dollars, a closing full stop


def lenient_answer(completion: str) -> str:
    """The final answer in the forms small instruct models use, first match wins: <answer> tags, \\boxed{},
    "The answer is X" / "Answer: X", the right side of the last line's last "=", else the last line."""
    tagged = ANSWER_TAG.findall(completion)
    if tagged:
        return tagged[-1].strip()
    boxed = BOXED.findall(completion)
    if boxed:
        return boxed[-1].strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    stated = [m for line in lines if (m := ANSWER_IS.search(line))]
    if stated:
        return stated[-1][1].strip(DECORATION)
    return lines[-1].rpartition("=")[2].strip(DECORATION)


@REWARDS.register("answer_format")
def answer_format(completion: str) -> float:
    """1.0 when the completion ends with its one <answer></answer>, not empty: the layout the prompt asks
    for, rewarded on its own (with its own weight) so the strict accuracy can be learned."""
    tagged = ANSWER_TAG.findall(completion)
    return float(len(tagged) == 1 and bool(tagged[0].strip()) and completion.rstrip().endswith("</answer>"))


# Where a HumanEval completion's function body ends: the model goes on writing the next definition.
CODE_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


@REWARDS.register("code_tests")
def code_tests(prompt: str, completion: str, test: str, entry_point: str, sandbox_timeout_s: float = 10.0,
               sandbox_memory_mb: int = 1024) -> float:
    """1.0 when prompt + completion passes the problem's tests (HumanEval's `check(entry_point)`), run in the
    sandbox (rlft.rewards.sandbox: bubblewrap, else rlimits) with time, memory and process limits; 0.0
    otherwise. A pass is the test harness's own report (a per-call token after `check` returned), not the
    exit status: exiting early, killing the program or patching print does not score."""
    from rlft.rewards.sandbox import run_tests
    body = completion
    for stop in CODE_STOPS:
        body = body.split(stop)[0]
    return float(run_tests(prompt, body, test, entry_point, timeout_s=sandbox_timeout_s,
                           memory_mb=sandbox_memory_mb).passed)
