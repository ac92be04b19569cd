import pytest

from rlft.errors import ConfigError, RewardError
from rlft.registry import Registry
from rlft.rewards import REWARDS, exact_match, score


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


def test_a_reward_that_raises_names_itself_and_the_sample():
    def flaky(prompt, completion, answer):
        if completion == "bad":
            raise ValueError("cannot parse")
        return 1.0

    assert score(flaky, "flaky", ["p", "q"], ["ok", "fine"], ["a", "a"]) == [1.0, 1.0]
    with pytest.raises(RewardError, match=r"reward 'flaky' raised on sample 1 \(prompt 'q', completion 'bad'\): "
                                          r"ValueError: cannot parse"):
        score(flaky, "flaky", ["p", "q"], ["ok", "bad"], ["a", "a"])
