"""Group-relative advantages (ALGORITHMS.md, "Advantages")."""

from __future__ import annotations

import torch

STD_EPS = 1e-6


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group") -> torch.Tensor:
    """One advantage per response; the responses to one prompt are `group_size` adjacent entries.

    group: (R - group mean) / (unbiased group std + eps)        GRPO, arXiv 2402.03300
    batch: (R - group mean) / (unbiased std of the whole batch + eps)
    none:  R - group mean                                        Dr. GRPO, arXiv 2503.20783
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)                                  # [prompts, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (grouped.std(dim=1, unbiased=True, keepdim=True) + STD_EPS)
    elif scale_rewards == "batch":
        centred = centred / (rewards.std(unbiased=True) + STD_EPS)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be group, batch or none, not '{scale_rewards}'")
    return centred.reshape(-1)
