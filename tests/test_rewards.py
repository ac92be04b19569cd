"""Reward functions: the built-ins, user functions by import path (in worker processes, with timeouts),
weighted sums with their parts, and the two error policies."""

import textwrap
from dataclasses import replace

import pytest

from rlft.config.reward import FormattedReward
from rlft.types import Problem
from rlft.errors import ConfigError, RewardError
from rlft.registry import Registry
from rlft.rewards import REWARDS, exact_match, resolve_reward
from rlft.rewards.builtin import countdown, final_answer, format_reward, length_penalty
from rlft.rewards.scorer import RewardScorer


def test_exact_match_ignores_surrounding_whitespace_only():
    assert exact_match("1+1=", " 2\n", "2") == 1.0
    assert exact_match("1+1=", "2 2", "2") == 0.0
    assert exact_match("1+1=", "", "2") == 0.0


def test_registry_refuses_duplicates_and_names_the_choices():
    registry = Registry("reward")
    registry.register("a")(len)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(len)
    with pytest.raises(ConfigError, match=r"unknown reward 'b' \(available: a\)"):
        registry.get("b")
    assert REWARDS.get("exact_match") is exact_match


@pytest.mark.parametrize("completion,score", [
    ("<answer>(6+4)*5-2</answer>", 1.0),           # every number once, = 48
    ("(6+4)*5-2 = 48", 1.0),                       # the last line, "= target" allowed
    ("<think>try 6*5</think>\n<answer>5*(6+4)-2</answer>", 1.0),
    ("<answer>(6+4)*5</answer>", 0.0),             # a number unused
    ("<answer>(6+4)*5-2+2</answer>", 0.0),         # a number used twice
    ("<answer>(6+4)*5-3</answer>", 0.0),           # 3 is not given
    ("<answer>(6+4)*5+2</answer>", 0.0),           # wrong value
    ("<answer>6/(4-4)*5+2</answer>", 0.0),         # division by zero
    ("<answer>__import__('os').system('echo hi')</answer>", 0.0),  # not arithmetic: never executed
    ("<answer>2**6</answer>", 0.0),
    ("no idea", 0.0),
])
def test_countdown_verifies_numbers_and_value(completion, score):
    assert countdown(completion, numbers=[6, 4, 5, 2], target=48) == score


def test_countdown_is_exact_with_division():
    assert countdown("<answer>7/3*3+1</answer>", numbers=[7, 3, 3, 1], target=8) == 1.0


def test_format_and_final_answer():
    pattern = FormattedReward().format_pattern
    assert format_reward("<think>a\nb</think> <answer>3</answer>", pattern) == 1.0
    assert format_reward("<answer>3</answer>", pattern) == 0.0
    assert format_reward("<think>a</think><answer>3</answer> trailing", pattern) == 0.0
    assert final_answer("x\n<answer>1</answer><answer> 2 </answer>") == "2"
    assert final_answer("first\nlast line\n") == "last line"


def test_length_penalty_is_zero_to_the_target_then_linear_to_minus_one():
    assert length_penalty(4, max_response_tokens=8, length_target=None) == 0.0
    assert length_penalty(6, max_response_tokens=8, length_target=None) == -0.5
    assert length_penalty(8, max_response_tokens=8, length_target=None) == -1.0
    assert length_penalty(3, max_response_tokens=8, length_target=2) == pytest.approx(-1 / 6)


PROBLEMS = [Problem("1+1=", "2", {"level": 1}), Problem("2+2=", "4", {"level": 2})]


def scorer(**keys) -> RewardScorer:
    return RewardScorer(replace(FormattedReward(), **keys), max_response_tokens=8)


def test_weighted_sum_keeps_each_part():
    scores = scorer(fns=["exact_match", "length_penalty"], weights=[1.0, 0.5]).score(
        PROBLEMS, ["2", "5"], response_tokens=[8, 2])
    assert scores.total.tolist() == [1.0 - 0.5, 0.0]
    assert scores.parts["exact_match"].tolist() == [1.0, 0.0]
    assert scores.parts["length_penalty"].tolist() == [-1.0, 0.0]
    assert scores.correct.tolist() == [1.0, 0.0] and scores.errors == 0


def test_mismatched_weights_and_unknown_functions_fail_at_start():
    with pytest.raises(ConfigError, match="reward.weights has 1 values for 2 reward.fns"):
        scorer(fns=["exact_match", "format"], weights=[1.0])
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        scorer(fns=["nope"])
    with pytest.raises(ConfigError, match="reward 'no_such_module:f': cannot import module 'no_such_module'"):
        resolve_reward("no_such_module:f")


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    """A user module on the path, as `rlft train reward.fns=[my_rewards:...]` finds it in the run's cwd."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent('''
        import os, time

        def by_level(completion, answer, level):        # a row field as a keyword argument
            return {"right": float(completion == answer), "level": level / 10}

        def flaky(completion, **everything):
            if completion == "bad":
                raise ValueError("cannot parse " + completion)
            return 1.0

        def hangs(completion):
            if completion == "hang":
                while True:
                    time.sleep(0.01)
            return 1.0

        def crashes(completion):
            if completion == "crash":
                os._exit(3)
            return 1.0

        def not_a_number(completion):
            return "high"
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_user_function_by_import_path_runs_in_a_worker_with_the_row_fields(user_rewards):
    s = scorer(fns=["my_rewards:by_level"], accuracy="my_rewards:by_level")
    try:
        scores = s.score(PROBLEMS, ["2", "5"], [1, 1])
    finally:
        s.close()
    assert scores.parts["my_rewards:by_level/right"].tolist() == [1.0, 0.0]
    assert scores.parts["my_rewards:by_level/level"].tolist() == pytest.approx([0.1, 0.2])
    assert scores.total.tolist() == pytest.approx([1.1, 0.2])
    assert scores.correct.tolist() == [1.0, 0.0]  # full marks: the parts add up to >= 1


def test_a_raising_reward_names_itself_and_the_sample_or_scores_zero(user_rewards):
    s = scorer(fns=["my_rewards:flaky"])
    with pytest.raises(RewardError, match=r"reward 'my_rewards:flaky' failed on sample 1 \(prompt '2\+2=', "
                                          r"completion 'bad'\): ValueError: cannot parse bad"):
        s.score(PROBLEMS, ["2", "bad"], [1, 1])
    s = scorer(fns=["my_rewards:flaky"], on_error="zero")
    scores = s.score(PROBLEMS, ["2", "bad"], [1, 1])
    s.close()
    assert scores.total.tolist() == [1.0, 0.0] and scores.errors == 1


@pytest.mark.parametrize("fn,completion,error", [
    ("hangs", "hang", "TimeoutError: no result within 1 s"),
    ("crashes", "crash", "WorkerDied: the reward worker process died during the call"),
    ("not_a_number", "2", "returned str 'high': a reward is a float or a dict of floats"),
])
def test_a_hanging_crashing_or_malformed_reward_is_contained(user_rewards, fn, completion, error):
    raising, zeroing = (scorer(fns=[f"my_rewards:{fn}"], timeout_s=1.0, on_error=policy)
                        for policy in ("raise", "zero"))
    try:
        first_bad = 0 if fn == "not_a_number" else 1  # that one fails on every sample
        with pytest.raises(RewardError, match=f"reward 'my_rewards:{fn}' failed on sample {first_bad} .*: {error}"):
            raising.score(PROBLEMS, ["1", completion], [1, 1])
        scores = zeroing.score(PROBLEMS, ["1", completion], [1, 1])
        assert scores.total[1] == 0.0 and scores.errors >= 1
        # the workers are whole again for the next step
        if fn != "not_a_number":
            assert zeroing.score(PROBLEMS, ["1", "1"], [1, 1]).total.tolist() == [1.0, 1.0]
    finally:
        raising.close()
        zeroing.close()
