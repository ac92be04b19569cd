"""Group-relative advantages (ALGORITHMS.md, "Advantages"; RLOO and REINFORCE++ in docs/objectives.md),
registered by name: `algo.scale_rewards` picks one. Each takes the [N] rewards, the responses to one prompt
`group_size` adjacent entries, and returns one advantage per response."""

from __future__ import annotations

from typing import Callable

import torch

from rlft.registry import Registry

STD_EPS = 1e-6

ADVANTAGES: Registry[Callable[[torch.Tensor, int], torch.Tensor]] = Registry("advantage estimator")


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.view(-1, group_size)                                     # [prompts, G]


@ADVANTAGES.register("group")
def group_normalised(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(R - group mean) / (unbiased group std + eps): GRPO, arXiv 2402.03300."""
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred / (grouped.std(dim=1, unbiased=True, keepdim=True) + STD_EPS)).reshape(-1)


@ADVANTAGES.register("batch")
def batch_normalised(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(R - group mean) / (unbiased std of the whole batch + eps)."""
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred / (rewards.std(unbiased=True) + STD_EPS)).reshape(-1)


@ADVANTAGES.register("none")
def group_centred(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """R - group mean: Dr. GRPO, arXiv 2503.20783."""
    grouped = _grouped(rewards, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)


@ADVANTAGES.register("rloo")
def leave_one_out(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """R_i - mean of the group's other G - 1 rewards: RLOO, arXiv 2402.14740 (a baseline independent of
    R_i, so the estimate stays unbiased); equals G/(G-1) (R_i - group mean)."""
    grouped = _grouped(rewards, group_size)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).reshape(-1)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A' = R - group mean, then A' / (unbiased std of A' over the whole batch + eps): REINFORCE++ with a
    group baseline (arXiv 2501.03262, "REINFORCE++-baseline"). The paper's global normalisation also
    subtracts the batch mean of A', which is 0 here: every group's A' sums to 0."""
    centred = group_centred(rewards, group_size)
    return centred / (centred.std(unbiased=True) + STD_EPS)


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group") -> torch.Tensor:
    """One advantage per response with the registered estimator `scale_rewards`."""
    return ADVANTAGES[scale_rewards](rewards, group_size)
