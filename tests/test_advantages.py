import math

import pytest
import torch

from rlft.algos.advantages import group_advantages


def test_grpo_advantage_hand_computed():
    # Group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(adv, torch.tensor([expected, -expected, -expected, expected]), atol=1e-6)


def test_groups_are_normalised_separately_and_equal_groups_get_zero():
    adv = group_advantages(torch.tensor([3.0, 3.0, 3.0, 0.0, 2.0, 4.0]), group_size=3)
    assert torch.equal(adv[:3], torch.zeros(3))
    # second group: mean 2, unbiased std 2
    assert torch.allclose(adv[3:], torch.tensor([-1.0, 0.0, 1.0]) * 2 / (2 + 1e-6), atol=1e-6)


def test_dr_grpo_does_not_scale():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, scale_rewards="none")
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_batch_scaling_uses_the_std_of_the_whole_batch():
    rewards = torch.tensor([1.0, 0.0, 5.0, 3.0])
    adv = group_advantages(rewards, group_size=2, scale_rewards="batch")
    std = rewards.std(unbiased=True).item()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 1.0, -1.0]) / (std + 1e-6), atol=1e-6)


def test_random_rewards_match_a_loop_reference():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(40, generator=gen, dtype=torch.float64)
    adv = group_advantages(rewards, group_size=8)
    values = rewards.tolist()
    for start in range(0, 40, 8):
        group = values[start:start + 8]
        mean = sum(group) / 8
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 7)
        for k, r in enumerate(group):
            assert adv[start + k].item() == pytest.approx((r - mean) / (std + 1e-6), abs=1e-9)


def test_rejects_batch_that_does_not_split_into_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), group_size=4)
