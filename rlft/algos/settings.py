"""What the loss and the optimizer get each step, from the algo and optim configs: the frozen loss settings
(with the eps_high schedule of clip-higher) and the learning rate (linear warm-up)."""

from __future__ import annotations

import math

from rlft.types import LossSettings

# `algo` below is the run's rlft.config.algo.AlgoConfig (not imported: the config imports this package).


def loss_settings(algo, step: int, max_response_len: int) -> LossSettings:
    """The keyword arguments of rlft.algos.losses.policy_loss at this step (1-based)."""
    sapo, kl_cov, c = algo.sapo_gate, algo.kl_cov_selection, algo.rollout_correction  # c: tis_cap's too
    clip_cov = algo.clip_cov_selection
    correction = {} if c is None else dict(correction=str(c.kind), correction_low=c.low, correction_high=c.high,
                                            correction_cap=c.cap)
    return LossSettings(ratio_level=str(algo.ratio_level), eps_low=algo.eps_low, eps_high=eps_high_at(step, algo),
                        clip_ratio_c=algo.clip_ratio_c, loss_agg=str(algo.loss_agg),
                        max_response_len=max_response_len,
                        kl_coef=0.0 if algo.kl_in_reward else algo.kl_coef,
                        kl_estimator=str(algo.kl_estimator), objective=str(algo.objective),
                        tau_pos=sapo.tau_pos, tau_neg=sapo.tau_neg, kl_cov_frac=kl_cov.frac,
                        kl_cov_coef=kl_cov.coef, clip_cov_frac=clip_cov.frac, clip_cov_low=clip_cov.low,
                        clip_cov_high=clip_cov.high, **correction)


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
