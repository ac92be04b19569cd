import pytest
import torch

from rlft.algos.shaping import mixed_groups, overlong_penalty


def test_overlong_penalty_in_its_three_regions():
    # L_max 20, L_cache 5: no penalty up to 15, linear to -1 at 20, -1 beyond.
    lengths = torch.tensor([3, 15, 16, 18, 20, 25])
    shaped = overlong_penalty(lengths, max_len=20, buffer=5)
    assert torch.allclose(shaped, torch.tensor([0.0, 0.0, -0.2, -0.6, -1.0, -1.0]))
    assert torch.allclose(overlong_penalty(lengths, max_len=20, buffer=5, penalty=0.5), shaped * 0.5)


def test_overlong_rejects_a_buffer_outside_the_length():
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), max_len=8, buffer=9)


def test_mixed_groups_flags_groups_with_different_rewards():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    assert mixed_groups(rewards, 3).tolist() == [False, True, True]
