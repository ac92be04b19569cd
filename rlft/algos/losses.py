"""The policy loss of ALGORITHMS.md as pure tensor functions: ratios, clipped surrogate, KL, aggregation.

GRPO, DAPO and GSPO are settings of `policy_loss`, not separate code paths. Shapes: N responses in the
micro-batch, T response tokens (right-padded); `mask` is 1 on tokens that count in the loss.
"""

from __future__ import annotations

import torch

RATIO_LEVELS = ("token", "sequence", "sequence_token")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean")


def masked_sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] -> [N]: mean over each row's masked tokens (0 for a row with none)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def log_importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str
                         ) -> torch.Tensor:
    """[N, T] log of the importance ratio each token's surrogate uses.

    token:          log r_{i,t} = logp - old
    sequence:       log s_i = mean_t (logp - old), the same for every token of o_i (GSPO)
    sequence_token: sg[log s_i] + logp - sg[logp]; value log s_i, gradient of logp_{i,t} (GSPO-token)
    """
    token = logp - old_logp
    if level == "token":
        return token
    sequence = masked_sequence_mean(token, mask)[:, None].expand_as(token)   # [N, T]
    if level == "sequence":
        return sequence
    if level == "sequence_token":
        return sequence.detach() + logp - logp.detach()
    raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, not '{level}'")


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


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman's k1, k2, k3)."""
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator == "k3":
        return log_ratio.exp() - log_ratio - 1
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, not '{estimator}'")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, num_sequences: int,
              num_tokens: int, max_response_len: int) -> torch.Tensor:
    """Per-token losses -> this micro-batch's share of the step's loss.

    The denominators are the whole step's counts (not this micro-batch's), so summing the results of
    all micro-batches gives exactly the loss of one big batch: gradient accumulation changes nothing.
    """
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / max(num_tokens, 1)
    if mode in ("seq_mean_token_mean", "seq_mean"):
        # seq_mean: GSPO's mean of sequence losses; a sequence-level ratio makes every token of a
        # sequence carry that sequence's loss, so its token mean is the sequence loss.
        return masked_sequence_mean(per_token, mask).sum() / max(num_sequences, 1)
    if mode == "seq_mean_token_sum_norm":
        return masked.sum() / max(num_sequences * max_response_len, 1)
    raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, not '{mode}'")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                ratio_level: str, eps_low: float, eps_high: float, clip_ratio_c: float | None,
                loss_agg: str, num_sequences: int, num_tokens: int, max_response_len: int,
                ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                rollout_logp: torch.Tensor | None = None, tis_cap: float | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's loss contribution of one micro-batch, and its metrics (means over its masked tokens).

    logp, old_logp, ref_logp, rollout_logp, mask: [N, T]; advantages: [N] (one per response).
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
        metrics = _metrics(logp, old_logp, ratio, clipped_low, clipped_high, mask, ratio_level)
        metrics["pg_loss"] = aggregate(surrogate, mask, loss_agg, **counts).item()
        if kl is not None:
            metrics["kl_ref"] = _token_mean(kl, mask)
    return loss, metrics


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return ((x * mask).sum() / mask.sum().clamp(min=1)).item()


def _metrics(logp, old_logp, ratio, clipped_low, clipped_high, mask, ratio_level) -> dict[str, float]:
    log_r = logp - old_logp
    approx_kl = _token_mean(log_r.exp() - 1 - log_r, mask)
    if ratio_level == "token":
        on = mask.bool()
        values, low, high = ratio[on], clipped_low[on], clipped_high[on]
    else:  # one ratio per sequence: count sequences, not tokens
        has_tokens = mask.sum(-1) > 0
        values, low, high = ratio[:, 0][has_tokens], clipped_low[:, 0][has_tokens], clipped_high[:, 0][has_tokens]
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
