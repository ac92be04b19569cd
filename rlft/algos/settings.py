"""What the loss and the optimizer get each step, from the algo and optim configs: the frozen loss settings
(with the eps_high schedule of clip-higher) and the learning rate (linear warm-up)."""

from __future__ import annotations

import math

from rlft.types import LossSettings

# `algo` below is the run's rlft.config.algo.AlgoConfig (not imported: the config imports this package).


def loss_settings(algo, step: int, max_response_len: int) -> LossSettings:
    """The keyword arguments of rlft.algos.losses.policy_loss at this step (1-based)."""
    return LossSettings(ratio_level=str(algo.ratio_level), eps_low=algo.eps_low, eps_high=eps_high_at(step, algo),
                        clip_ratio_c=algo.clip_ratio_c, loss_agg=str(algo.loss_agg),
                        max_response_len=max_response_len,
                        kl_coef=0.0 if algo.kl_in_reward else algo.kl_coef,
                        kl_estimator=str(algo.kl_estimator), tis_cap=algo.tis_cap)


def eps_high_at(step: int, algo) -> float:
    """eps_high at this step: constant, or moving to schedule.end over schedule.steps (clip-higher)."""
    schedule = algo.eps_high_schedule
    if schedule is None:
        return algo.eps_high
    progress = min(1.0, step / max(1, schedule.steps))
    if schedule.kind == "cosine":
        progress = 0.5 * (1 - math.cos(progress * math.pi))
    return algo.eps_high + (schedule.end - algo.eps_high) * progress


def lr_at(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over the first `warmup_steps` steps (1-based), constant after."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps > 0 else lr
