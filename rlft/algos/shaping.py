"""Reward-side parts of DAPO (arXiv 2503.14476): overlong reward shaping and the dynamic-sampling filter."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """[N] reward added for response length |y| (ALGORITHMS.md, "Overlong reward shaping"):

    0                                   if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max   (falls linearly to -1)
    -1                                  if |y| > L_max
    all times `penalty`.
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong buffer must be in [1, {max_len}], not {buffer}")
    lengths = lengths.to(torch.float64)
    soft_start = max_len - buffer
    shaped = torch.where(lengths <= soft_start, torch.zeros_like(lengths), (soft_start - lengths) / buffer)
    shaped = torch.where(lengths > max_len, -torch.ones_like(lengths), shaped)
    return (penalty * shaped).to(torch.float32)


def mixed_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N / group_size] bool: True for groups whose rewards are not all equal (the ones that carry a gradient)."""
    grouped = rewards.view(-1, group_size)
    return (grouped != grouped[:, :1]).any(dim=1)
