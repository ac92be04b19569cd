"""Reward-side parts of the algorithms: DAPO's overlong reward shaping and dynamic-sampling filter (arXiv
2503.14476), and the KL penalty in the reward (`kl_in_reward`)."""

from __future__ import annotations

import torch

from rlft.algos.losses import kl_penalty


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


def kl_in_reward(rewards: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                 response_mask: torch.Tensor, kl_coef: float, estimator: str) -> torch.Tensor:
    """[N] rewards less kl_coef x the response's summed KL to the reference (`kl_in_reward`, PPO style),
    estimated on the engine's log-probs of the sampled tokens."""
    kl = kl_penalty(logprobs, ref_logprobs, estimator) * response_mask
    return rewards - kl_coef * kl.sum(-1)
