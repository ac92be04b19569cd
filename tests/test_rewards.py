"""Reward functions: the built-ins, user functions by import path (in worker processes, with per-call
deadlines, a memory cap, recycling and their processes killed at close), strict result types, weighted sums
with their parts, and the two error policies."""

import os
import re
import textwrap
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlft.config.reward import FormattedReward, RewardConfig, check
from rlft.types import Problem
from rlft.errors import ConfigError, RewardError
from rlft.registry import Registry
from rlft.rewards import REWARDS, as_reward, exact_match, resolve_reward
from rlft.rewards.pool import RewardPool, default_memory_mb
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
        import os, signal, subprocess, time
        import numpy as np

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

        def stringly(completion):                       # a number as a str: refused, not coerced
            return "1.0"

        def verdict(completion, answer):                # a bool, a numpy scalar: accepted
            return {"right": completion == answer, "np": np.float32(0.5)}

        def mixed(completion):                          # a float on one path, a dict on the other
            return 0.0 if completion == "x" else {"a": 1.0}

        def keys_differ(completion):
            return {"a": 1.0} if completion == "x" else {"b": 1.0}

        def ignores_the_timer(completion):              # as a call stuck in C code would
            if completion == "hang":
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(600)
            return 1.0

        def slow_unless(completion):
            if completion == "bad":
                raise ValueError("bad")
            if completion == "slow":
                time.sleep(30)
            return 1.0

        def pid():
            return {"pid": os.getpid()}

        def hog():
            return float(len(bytearray(4 << 30)))       # 4 GiB, past a cap of 2048 MiB

        def spawns(completion):
            return float(subprocess.Popen(["sleep", "600"]).pid)
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
    ("not_a_number", "2", "TypeError: returned str 'high': a reward is a float or a dict of floats"),
])
def test_a_hanging_crashing_or_malformed_reward_is_contained(user_rewards, fn, completion, error):
    raising, zeroing = (scorer(fns=[f"my_rewards:{fn}"], timeout_s=1.0, on_error=policy)
                        for policy in ("raise", "zero"))
    try:
        # not_a_number fails on every sample: the first to fail ends the batch, whichever worker ran it
        first_bad = "[01]" if fn == "not_a_number" else 1
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


# ---- Strict results ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    (1, 1.0), (0.25, 0.25), (True, 1.0), (False, 0.0),          # bool: a pass/fail verdict, as 1 or 0
    (np.float32(0.5), 0.5), (np.int64(2), 2.0), (np.bool_(True), 1.0), (np.array(0.75), 0.75),
    (torch.tensor(0.5), 0.5), (torch.tensor(True), 1.0),
    ({"a": 1, "b": np.float64(0.5), "c": True}, {"a": 1.0, "b": 0.5, "c": 1.0}),
])
def test_a_reward_is_a_real_number_or_a_dict_of_them(value, expected):
    result = as_reward(value)
    assert result == expected and type(result) is type(expected)
    if isinstance(result, dict):
        assert all(type(v) is float for v in result.values())


@pytest.mark.parametrize("value,error", [
    ("1.0", "returned str '1.0': a reward is a float"),           # never coerced
    (b"1", "returned bytes"), (None, "returned NoneType None"), (1 + 2j, "returned complex"),
    ([1.0], "returned list"), (np.array([1.0, 2.0]), "returned ndarray"), (torch.ones(2), "returned Tensor"),
    ({}, "returned an empty dict"), ({1: 1.0}, "the key 1 \\(int\\): a part's name is a str"),
    ({"a": "1"}, "returned str '1' as part 'a'"),
    (float("nan"), "non-finite reward \\(nan\\)"), ({"a": float("inf")}, "non-finite reward \\(inf as part 'a'\\)"),
])
def test_anything_else_is_refused_saying_what_was_returned(value, error):
    with pytest.raises((TypeError, ValueError), match=error):
        as_reward(value)


@pytest.mark.parametrize("fn,completions,error", [
    ("stringly", ["1", "1"], r"sample [01] \(.*\): TypeError: returned str '1.0': a reward is a float"),
    ("mixed", ["y", "x"], r"sample 1 \(prompt '2\+2=', completion 'x'\): TypeError: returned the float 0 but sample 0 "
                          r"returned a dict with the keys a: a function's rewards are all floats, or all dicts"),
    ("keys_differ", ["x", "y"], r"sample 1 .*: TypeError: returned a dict with the keys b but sample 0 returned a "
                                r"dict with the keys a"),
    ("verdict", ["2", "5"], None),
])
def test_a_user_functions_results_are_checked_and_must_agree(user_rewards, fn, completions, error):
    raising, zeroing = (scorer(fns=[f"my_rewards:{fn}"], on_error=policy) for policy in ("raise", "zero"))
    try:
        if error is None:
            scores = raising.score(PROBLEMS, completions, [1, 1])
            assert scores.parts["my_rewards:verdict/right"].tolist() == [1.0, 0.0]
            assert scores.total.tolist() == [1.5, 0.5] and scores.errors == 0
            return
        with pytest.raises(RewardError, match=f"reward 'my_rewards:{fn}' failed on {error}"):
            raising.score(PROBLEMS, completions, [1, 1])
        scores = zeroing.score(PROBLEMS, completions, [1, 1])
        assert scores.errors >= 1 and scores.total[1] == 0.0
    finally:
        raising.close()
        zeroing.close()


# ---- Workers: deadlines, early stop, recycling, memory, their processes --------------------------------

def test_a_hang_is_reported_a_call_deadline_after_it_started_whatever_the_batch_size(user_rewards):
    """The old pool waited out the batch's budget (timeout x calls / workers + 5 s: 25 s here)."""
    s = scorer(fns=["my_rewards:ignores_the_timer"], timeout_s=1.0, on_error="zero")
    try:
        s.score(PROBLEMS, ["1", "1"], [1, 1])  # workers started: their start-up is not the call's
        problems = [PROBLEMS[0]] * 40
        started = time.monotonic()
        scores = s.score(problems, ["hang"] + ["1"] * 39, [1] * 40)
        elapsed = time.monotonic() - started
        assert scores.errors == 1 and scores.total[0] == 0.0 and scores.total[1:].tolist() == [1.0] * 39
        assert elapsed < 6.0, elapsed  # ~2 s: timeout_s + 1 s of grace; slack for a loaded machine
        with pytest.raises(RewardError, match=r"sample 1 .*TimeoutError: no result within 1 s \(worker killed\)"):
            replace_policy(s, "raise").score(PROBLEMS, ["1", "hang"], [1, 1])
    finally:
        s.close()


def replace_policy(s: RewardScorer, on_error: str) -> RewardScorer:
    s.on_error = on_error
    return s


def test_on_error_raise_stops_at_the_first_failure_without_waiting_for_the_rest(user_rewards):
    s = scorer(fns=["my_rewards:slow_unless"], timeout_s=60.0)
    try:
        s.score(PROBLEMS, ["1", "1"], [1, 1])
        started = time.monotonic()
        with pytest.raises(RewardError, match=r"failed on sample 0 .*: ValueError: bad"):
            s.score([PROBLEMS[0]] * 12, ["bad"] + ["slow"] * 11, [1] * 12)
        assert time.monotonic() - started < 15.0  # the 11 others would sleep 30 s each
        assert s.score(PROBLEMS, ["1", "1"], [1, 1]).total.tolist() == [1.0, 1.0]  # the pool is usable
    finally:
        s.close()


def test_workers_are_recycled_after_max_calls(user_rewards):
    pool = RewardPool(1, timeout_s=10.0, max_calls=2)
    try:
        pids = [o.value["pid"] for o in pool.run("my_rewards:pid", [{}] * 5)]
    finally:
        pool.close()
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] and os.getpid() not in pids


def test_a_worker_past_its_memory_cap_gets_a_memory_error_naming_the_cap(user_rewards):
    pool = RewardPool(2, timeout_s=30.0, memory_mb=2048)
    try:
        outcomes = pool.run("my_rewards:hog", [{}, {}])
        assert all(re.match(r"MemoryError: past the reward worker's memory cap \(2048 MiB", o.error) for o in outcomes)
        assert [o.value for o in pool.run("my_rewards:pid", [{}])][0]["pid"] > 0  # fresh workers serve on
    finally:
        pool.close()


def test_the_default_memory_cap_shares_half_the_machine():
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20
    assert default_memory_mb(2) == max(2048, total_mb // 4)
    assert default_memory_mb(1) >= default_memory_mb(4) >= 2048


def test_close_kills_the_processes_a_reward_function_started(user_rewards):
    s = scorer(fns=["my_rewards:spawns"])
    try:
        pids = [int(p) for p in s.score(PROBLEMS, ["1", "1"], [1, 1]).total.tolist()]
        assert all(_alive(pid) for pid in pids)
    finally:
        s.close()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)




def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
