"""The policy loss of ALGORITHMS.md as pure tensor functions: ratios, clipped surrogate, KL, aggregation.

GRPO, DAPO and GSPO are settings of `policy_loss`, not separate code paths. Ratio levels, KL estimators and
aggregations are registered by name (the config's choices are these names); adding one is one function
here and its test. Shapes: N responses in the micro-batch, T response tokens (right-padded); `mask` is 1
on tokens that count in the loss.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlft.registry import Registry

# (logp, old_logp, mask) -> [N, T] log of the importance ratio each token's surrogate uses;
# `per_sequence`: one ratio per response (clip fractions count sequences, not tokens)
RATIO_LEVELS: Registry[Callable[..., torch.Tensor]] = Registry("ratio level")
# (logp, ref_logp) -> [N, T] per-token estimate of KL(pi || ref) from samples of pi (Schulman's k1, k2, k3)
KL_ESTIMATORS: Registry[Callable[..., torch.Tensor]] = Registry("KL estimator")
# (per_token, mask, num_sequences, num_tokens, max_response_len) -> this micro-batch's share of the loss
LOSS_AGGS: Registry[Callable[..., torch.Tensor]] = Registry("loss aggregation")


def masked_sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] -> [N]: mean over each row's masked tokens (0 for a row with none)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@RATIO_LEVELS.register("token", per_sequence=False)
def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log r_{i,t} = logp - old (PPO, GRPO, DAPO)."""
    return logp - old_logp


@RATIO_LEVELS.register("sequence", per_sequence=True)
def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log s_i = mean_t (logp - old), length-normalised, the same for every token of o_i (GSPO)."""
    return masked_sequence_mean(logp - old_logp, mask)[:, None].expand_as(logp)


@RATIO_LEVELS.register("sequence_token", per_sequence=True)
def sequence_token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sg[log s_i] + logp - sg[logp]: value log s_i, gradient of logp_{i,t} (GSPO-token)."""
    return sequence_log_ratio(logp, old_logp, mask).detach() + logp - logp.detach()


def log_importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str
                         ) -> torch.Tensor:
    """[N, T] log of the importance ratio at a registered level."""
    return RATIO_LEVELS[level](logp, old_logp, mask)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float,
                      clip_ratio_c: float | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A), with optional dual clip for A < 0.

    Returns (loss, clipped_low, clipped_high); the two masks mark where the clipped branch is active.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -clip_ratio_c * advantages), loss)
    clipped_low = (ratio < 1 - eps_low) & (advantages < 0)
    clipped_high = (ratio > 1 + eps_high) & (advantages > 0)
    return loss, clipped_low, clipped_high


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """logp - ref: unbiased, can be negative per token."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """0.5 (logp - ref)^2."""
    return 0.5 * (ref_logp - logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """exp(ref - logp) - (ref - logp) - 1: unbiased and never negative (GRPO's)."""
    log_ratio = ref_logp - logp
    return log_ratio.exp() - log_ratio - 1


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) with a registered estimator."""
    return KL_ESTIMATORS[estimator](logp, ref_logp)


# Aggregations divide by the whole step's counts (not this micro-batch's), so summing the results of all
# micro-batches gives exactly the loss of one big batch: gradient accumulation changes nothing.

@LOSS_AGGS.register("token_mean")
def token_mean(per_token, mask, num_sequences: int, num_tokens: int, max_response_len: int) -> torch.Tensor:
    """sum_{i,t} L_{i,t} / sum_i |o_i| over the whole step (DAPO)."""
    return (per_token * mask).sum() / max(num_tokens, 1)


@LOSS_AGGS.register("seq_mean_token_mean")
def seq_mean_token_mean(per_token, mask, num_sequences: int, num_tokens: int, max_response_len: int
                        ) -> torch.Tensor:
    """(1/G) sum_i (1/|o_i|) sum_t L_{i,t} (GRPO paper)."""
    return masked_sequence_mean(per_token, mask).sum() / max(num_sequences, 1)


# GSPO's mean of sequence losses: a sequence-level ratio makes every token of a sequence carry that
# sequence's loss, so its token mean is the sequence loss (with a KL term, its token mean is added).
LOSS_AGGS.register("seq_mean")(seq_mean_token_mean)


@LOSS_AGGS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(per_token, mask, num_sequences: int, num_tokens: int, max_response_len: int
                            ) -> torch.Tensor:
    """sum_{i,t} L_{i,t} / (G * L_max) (Dr. GRPO)."""
    return (per_token * mask).sum() / max(num_sequences * max_response_len, 1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, num_sequences: int,
              num_tokens: int, max_response_len: int) -> torch.Tensor:
    """Per-token losses -> this micro-batch's share of the step's loss, with a registered aggregation."""
    return LOSS_AGGS[mode](per_token, mask, num_sequences=num_sequences, num_tokens=num_tokens,
                           max_response_len=max_response_len)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                ratio_level: str, eps_low: float, eps_high: float, clip_ratio_c: float | None,
                loss_agg: str, num_sequences: int, num_tokens: int, max_response_len: int,
                ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                rollout_logp: torch.Tensor | None = None, tis_cap: float | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's loss contribution of one micro-batch, and its metrics (means over its masked tokens).

    logp, old_logp, ref_logp, rollout_logp, mask: [N, T]; advantages: [N] (one per response). The keyword
    hyper-parameters are the fields of rlft.types.LossSettings.
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None].expand_as(logp)                                 # [N, T]
    ratio = log_importance_ratio(logp, old_logp, mask, ratio_level).exp()     # [N, T]
    surrogate, clipped_low, clipped_high = clipped_surrogate(ratio, adv, eps_low, eps_high, clip_ratio_c)
    if tis_cap is not None:
        if rollout_logp is None:
            raise ValueError("tis_cap needs the rollout engine's logprobs")
        surrogate = surrogate * (old_logp - rollout_logp).exp().clamp(max=tis_cap).detach()
    per_token = surrogate
    kl = None
    if ref_logp is not None and kl_coef != 0.0:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = per_token + kl_coef * kl
    counts = dict(num_sequences=num_sequences, num_tokens=num_tokens, max_response_len=max_response_len)
    loss = aggregate(per_token, mask, loss_agg, **counts)
    with torch.no_grad():
        metrics = _metrics(logp, old_logp, ratio, clipped_low, clipped_high, mask,
                           RATIO_LEVELS[ratio_level].per_sequence)
        metrics["pg_loss"] = aggregate(surrogate, mask, loss_agg, **counts).item()
        if kl is not None:
            metrics["kl_ref"] = _token_mean(kl, mask)
    return loss, metrics


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return ((x * mask).sum() / mask.sum().clamp(min=1)).item()


def _metrics(logp, old_logp, ratio, clipped_low, clipped_high, mask, per_sequence: bool) -> dict[str, float]:
    log_r = logp - old_logp
    approx_kl = _token_mean(log_r.exp() - 1 - log_r, mask)
    if per_sequence:  # one ratio per sequence: count sequences, not tokens
        has_tokens = mask.sum(-1) > 0
        values, low, high = ratio[:, 0][has_tokens], clipped_low[:, 0][has_tokens], clipped_high[:, 0][has_tokens]
    else:
        on = mask.bool()
        values, low, high = ratio[on], clipped_low[on], clipped_high[on]
    if values.numel() == 0:
        return {"approx_kl": approx_kl}
    return {
        "approx_kl": approx_kl,
        "clip_frac_low": low.float().mean().item(),
        "clip_frac_high": high.float().mean().item(),
        "ratio_mean": values.mean().item(),
        "ratio_min": values.min().item(),
        "ratio_max": values.max().item(),
    }
