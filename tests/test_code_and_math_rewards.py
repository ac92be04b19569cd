"""math-verify and answer_match answers (the code sandbox and code_tests: tests/test_sandbox.py)."""

import pytest

from rlft.rewards.builtin import math_verify


@pytest.mark.parametrize("completion,answer,score", [
    ("The answer is \\boxed{0.5}", "1/2", 1.0),
    ("To find the sum of 25 + 60, we add", "85", 0.0),   # restating the question is no answer
    ("The answer is 85", "85", 0.0),                     # neither <answer> nor \boxed{}
    ("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("<answer>\\frac{2}{4}</answer>", "\\frac{1}{2}", 1.0),
    ("<answer>0.6</answer>", "1/2", 0.0),
    ("<answer>17+25 = 32</answer>", "42", 0.0),
    ("I do not know", "42", 0.0),
])
def test_math_verify_accepts_equivalent_forms_only(completion, answer, score):
    assert math_verify(completion, answer) == score


@pytest.mark.parametrize("completion,answer,score", [
    ("The answer is 0.50.", "0.5", 1.0),
    ("25 + 60 = 85", "85", 1.0),
    ("To find the sum of 25 + 60, we need to", "85", 0.0),
    ("<think>2+2</think><answer>4</answer>", "4", 1.0),
    ("<answer>1,234</answer>", "1234", 1.0),
    ("<answer>Paris</answer>", "Paris", 1.0),
    ("no number here", "7", 0.0),
])
def test_answer_match_takes_the_last_number_of_the_final_answer(completion, answer, score):
    from rlft.rewards.builtin import answer_match
    assert answer_match(completion, answer) == score
