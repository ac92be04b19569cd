"""The policy loss of ALGORITHMS.md as pure tensor functions: ratios, objectives (PPO-clip and the ones of
docs/objectives.md), KL, aggregation.

GRPO, DAPO and GSPO are settings of `policy_loss`, not separate code paths; CISPO, GMPO, SAPO, KL-Cov and
Clip-Cov are registered objectives beside PPO-clip. Ratio levels, objectives, KL estimators and aggregations are
registered by name (the config's choices are these names); adding one is one function here and its test.
The rollout corrections (engine vs learner log-probs) are in rlft.algos.corrections. Shapes: N responses in
the micro-batch, T response tokens (right-padded); `mask` is 1 on tokens that count in the loss.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from rlft.algos.corrections import apply_correction, engine_mismatch
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


class Surrogate(NamedTuple):
    """An objective's per-token policy loss, and where it clipped (for the clip fractions)."""

    loss: torch.Tensor           # [N, T]
    clipped_low: torch.Tensor    # [N, T] bool: the lower bound acted
    clipped_high: torch.Tensor   # [N, T] bool: the upper bound acted
    metrics: dict[str, float]    # the objective's own, named "OBJECTIVE/what"


# (log_ratio, logp, advantages, mask, **hyper-parameters) -> Surrogate. `uses`: the LossSettings fields it
# takes (policy_loss passes it exactly those); `ratio_levels`: the levels it is defined at (None: any).
OBJECTIVES: Registry[Callable[..., Surrogate]] = Registry("objective")


def _unclipped(loss: torch.Tensor) -> Surrogate:
    never = torch.zeros_like(loss, dtype=torch.bool)
    return Surrogate(loss, never, never, {})


@OBJECTIVES.register("ppo_clip", uses=("eps_low", "eps_high", "clip_ratio_c"), ratio_levels=None)
def ppo_clip(log_ratio, logp, advantages, mask, *, eps_low: float, eps_high: float, clip_ratio_c: float | None
             ) -> Surrogate:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A), optional dual clip (PPO, GRPO, DAPO, GSPO)."""
    return Surrogate(*clipped_surrogate(log_ratio.exp(), advantages, eps_low, eps_high, clip_ratio_c), {})


@OBJECTIVES.register("cispo", uses=("eps_low", "eps_high"), ratio_levels=None)
def cispo(log_ratio, logp, advantages, mask, *, eps_low: float, eps_high: float) -> Surrogate:
    """-sg[clip(r, 1-eps_low, 1+eps_high)] A logp (MiniMax-M1, arXiv 2506.13585): the clip bounds the
    importance weight, never drops a token's gradient."""
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    return Surrogate(-weight * advantages * logp, ratio < 1 - eps_low, ratio > 1 + eps_high, {})


def _log_bounds(eps_low: float, eps_high: float) -> tuple[float, float]:
    """[1 - eps_low, 1 + eps_high] in log space; eps_low = 1 means no lower bound."""
    return (math.log(1 - eps_low) if eps_low < 1 else -math.inf), math.log1p(eps_high)


@OBJECTIVES.register("gmpo", uses=("eps_low", "eps_high"), ratio_levels=("token",))
def gmpo(log_ratio, logp, advantages, mask, *, eps_low: float, eps_high: float) -> Surrogate:
    """-A_i (prod_t r~_{i,t})^(1/|o_i|) on every token of o_i (GMPO, arXiv 2507.20673), with r~ the token
    ratio clipped PPO-style in log space before the geometric mean: min(r, clip r) for A > 0, max for A < 0."""
    low, high = _log_bounds(eps_low, eps_high)
    sign = torch.where(advantages < 0, -1.0, 1.0).to(log_ratio.dtype)
    # the pessimistic one of the clipped and the unclipped log-ratio, as PPO's min does per token
    kept = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(low, high))
    geometric_mean = masked_sequence_mean(kept, mask).exp()                 # [N]
    loss = -advantages * geometric_mean[:, None]
    return Surrogate(loss, (log_ratio < low) & (advantages < 0), (log_ratio > high) & (advantages > 0), {})


@OBJECTIVES.register("sapo", uses=("tau_pos", "tau_neg"), ratio_levels=None)
def sapo(log_ratio, logp, advantages, mask, *, tau_pos: float, tau_neg: float) -> Surrogate:
    """-(4/tau) sigmoid(tau (r - 1)) A, tau = tau_pos for A > 0, tau_neg otherwise (SAPO, arXiv 2511.20347):
    a smooth gate whose gradient weight 4 s(1 - s) is 1 on-policy and fades off-policy; nothing is clipped."""
    tau = torch.full_like(advantages, tau_neg).masked_fill(advantages > 0, tau_pos)
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1)) * 4 / tau
    return _unclipped(-gate * advantages)


def _token_covariance(logp: torch.Tensor, advantages: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """[M] (logp - mean logp)(A - mean A) over the M tokens where `on` (KL-Cov's and Clip-Cov's ranking)."""
    lp, adv = logp[on], advantages[on]
    return (lp - lp.mean()) * (adv - adv.mean())


@OBJECTIVES.register("kl_cov", uses=("kl_cov_frac", "kl_cov_coef"), ratio_levels=("token",))
def kl_cov(log_ratio, logp, advantages, mask, *, kl_cov_frac: float, kl_cov_coef: float) -> Surrogate:
    """-r A, plus kl_cov_coef |logp - old| on the floor(kl_cov_frac x M) tokens of largest covariance
    (logp - mean logp)(A - mean A) among the M masked tokens of this micro-batch (KL-Cov, arXiv 2505.22617):
    a KL brake on the tokens that drive entropy down."""
    selected = torch.zeros_like(mask, dtype=torch.bool)
    on = mask.bool()
    with torch.no_grad():
        cov = _token_covariance(logp, advantages, on)                      # [M]
        k = int(kl_cov_frac * cov.numel())
        if k > 0:
            rows, cols = on.nonzero(as_tuple=True)
            top = cov.topk(k).indices
            selected[rows[top], cols[top]] = True
    loss = -advantages * log_ratio.exp() + kl_cov_coef * log_ratio.abs() * selected
    never = torch.zeros_like(selected)
    share = k / cov.numel() if cov.numel() else 0.0
    return Surrogate(loss, never, never, {"kl_cov/selected_frac": share})


@OBJECTIVES.register("clip_cov", uses=("eps_low", "eps_high", "clip_cov_frac", "clip_cov_low", "clip_cov_high"),
                     ratio_levels=("token",))
def clip_cov(log_ratio, logp, advantages, mask, *, eps_low: float, eps_high: float, clip_cov_frac: float,
             clip_cov_low: float, clip_cov_high: float) -> Surrogate:
    """PPO-clip, with the loss (so the gradient) of a few tokens removed: of the M masked tokens of this
    micro-batch that the clip left alone and whose covariance (logp - mean logp)(A - mean A) lies strictly
    inside (clip_cov_low, clip_cov_high), a uniformly random max(1, floor(clip_cov_frac x M)) (Clip-Cov,
    arXiv 2505.22617). The draw uses torch's global CPU generator, which the trainer's checkpoints save."""
    ratio = log_ratio.exp()
    loss, clipped_low, clipped_high = clipped_surrogate(ratio, advantages, eps_low, eps_high)
    on = mask.bool()
    detached = torch.zeros_like(on)
    with torch.no_grad():
        cov = torch.zeros_like(logp)
        cov[on] = _token_covariance(logp, advantages, on)
        inside = (cov > clip_cov_low) & (cov < clip_cov_high)
        candidates = (on & ~clipped_low & ~clipped_high & inside).nonzero()          # [C, 2]
        count = min(max(1, int(clip_cov_frac * int(on.sum()))), len(candidates))
        draw = torch.randperm(len(candidates))[:count]  # torch's CPU generator, on any device
        chosen = candidates[draw.to(candidates.device)]
        detached[chosen[:, 0], chosen[:, 1]] = True
    share = count / int(on.sum()) if on.any() else 0.0
    return Surrogate(loss * ~detached, clipped_low, clipped_high, {"clip_cov/detached_frac": share})


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
                objective: str = "ppo_clip", tau_pos: float = 1.0, tau_neg: float = 1.05,
                kl_cov_frac: float = 2e-3, kl_cov_coef: float = 1.0, clip_cov_frac: float = 2e-4,
                clip_cov_low: float = 1.0, clip_cov_high: float = 5.0, correction: str | None = None,
                correction_low: float = 0.5, correction_high: float = 2.0, correction_cap: float = 2.0,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's loss contribution of one micro-batch, and its metrics (means over its masked tokens).

    logp, old_logp, ref_logp, rollout_logp, mask: [N, T]; advantages: [N] (one per response). The keyword
    hyper-parameters are the fields of rlft.types.LossSettings; `tis_cap=C` is the shorthand of
    correction="token_tis", correction_cap=C (the config's algo.tis_cap). With the engine's log-probs, the
    metrics include its mismatch with old_logp ("offpolicy/...", rlft.algos.corrections).
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None].expand_as(logp)                                 # [N, T]
    log_ratio = log_importance_ratio(logp, old_logp, mask, ratio_level)       # [N, T]
    fn = OBJECTIVES[objective]
    if fn.ratio_levels is not None and ratio_level not in fn.ratio_levels:
        raise ValueError(f"objective '{objective}' works at ratio level {' or '.join(fn.ratio_levels)}, "
                         f"not {ratio_level}")
    hyper = dict(eps_low=eps_low, eps_high=eps_high, clip_ratio_c=clip_ratio_c, tau_pos=tau_pos, tau_neg=tau_neg,
                 kl_cov_frac=kl_cov_frac, kl_cov_coef=kl_cov_coef, clip_cov_frac=clip_cov_frac,
                 clip_cov_low=clip_cov_low, clip_cov_high=clip_cov_high)
    surrogate, clipped_low, clipped_high, objective_metrics = fn(log_ratio, logp, adv, mask,
                                                                **{key: hyper[key] for key in fn.uses})
    if tis_cap is not None:
        if correction is not None:
            raise ValueError("tis_cap is the shorthand of correction='token_tis': give one of them")
        correction, correction_cap = "token_tis", tis_cap
    offpolicy = {}
    if correction is not None:
        if rollout_logp is None:
            raise ValueError(f"correction '{correction}' needs the rollout engine's log-probs")
        weight, offpolicy = apply_correction(old_logp, rollout_logp, mask, correction, low=correction_low,
                                             high=correction_high, cap=correction_cap)
        surrogate = surrogate * weight
    per_token = surrogate
    kl = None
    if ref_logp is not None and kl_coef != 0.0:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = per_token + kl_coef * kl
    counts = dict(num_sequences=num_sequences, num_tokens=num_tokens, max_response_len=max_response_len)
    loss = aggregate(per_token, mask, loss_agg, **counts)
    with torch.no_grad():
        metrics = _metrics(logp, old_logp, log_ratio.exp(), clipped_low, clipped_high, mask,
                           RATIO_LEVELS[ratio_level].per_sequence)
        metrics["pg_loss"] = aggregate(surrogate, mask, loss_agg, **counts).item()
        if kl is not None:
            metrics["kl_ref"] = _token_mean(kl, mask)
        if rollout_logp is not None:
            metrics |= engine_mismatch(old_logp, rollout_logp, mask)
    return loss, metrics | objective_metrics | offpolicy


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
