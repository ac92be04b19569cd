"""Rollout corrections (docs/objectives.md, "Rollout corrections"): the rollout engine samples with log-probs
`engine` that differ from the learner's `old` ones for the same tokens (kernels, precision, stale weights).
Each correction is a registered, pure function of the log engine/learner ratio log rho = old - engine that
returns a detached weight for every token's policy loss: capped (truncated importance sampling) or 0/1
(masking), per token or per sequence. `algo.correction.kind` picks one (`algo.tis_cap` is token_tis).

Masked tokens keep counting in the aggregation's denominators, as a token with A = 0 does: the learner's old
log-probs of later micro-batches are not known when an earlier one's loss is formed, so a denominator that
left them out would make gradient accumulation change the result.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from rlft.registry import Registry

# (log_rho [N, T], mask [N, T], **its keys of algo.correction) -> (weight [N, T], affected): `affected` marks
# the tokens ([N, T]) or sequences ([N]) whose weight the correction changed. Attributes: `uses` (its keys),
# `per_sequence` (what `affected` counts), `effect` ("capped" or "masked", the name of its metric).
CORRECTIONS: Registry[Callable[..., tuple[torch.Tensor, torch.Tensor]]] = Registry("rollout correction")

QUANTILES = {"p01": 0.01, "p50": 0.5, "p99": 0.99}


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _sequence_log_rho(log_rho: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] -> [N]: log of the product of a sequence's token ratios."""
    return (log_rho * mask).sum(-1)


def _inside(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """low <= exp(x) <= high, compared in log space (no overflow of a long sequence's product)."""
    return (x >= _log(low)) & (x <= _log(high))


@CORRECTIONS.register("token_tis", uses=("cap",), per_sequence=False, effect="capped")
def token_tis(log_rho: torch.Tensor, mask: torch.Tensor, *, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = min(rho_t, C): truncated importance sampling per token."""
    rho = log_rho.exp()
    return rho.clamp(max=cap), rho > cap


@CORRECTIONS.register("seq_tis", uses=("cap",), per_sequence=True, effect="capped")
def seq_tis(log_rho: torch.Tensor, mask: torch.Tensor, *, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w_i = min(prod_t rho_t, C) on every token of o_i: the sequence's own importance weight, truncated."""
    log_w = _sequence_log_rho(log_rho, mask)                                # [N]
    weight = log_w.clamp(max=_log(cap)).exp()                               # capped before exp: no overflow
    return weight[:, None].expand_as(log_rho), log_w > _log(cap)


@CORRECTIONS.register("token_mask", uses=("low", "high"), per_sequence=False, effect="masked")
def token_mask(log_rho: torch.Tensor, mask: torch.Tensor, *, low: float, high: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = 1 if low <= rho_t <= high else 0: tokens outside the band are rejected, the rest unweighted."""
    keep = _inside(log_rho, low, high)
    return keep.to(log_rho.dtype), ~keep


@CORRECTIONS.register("seq_mask", uses=("low", "high"), per_sequence=True, effect="masked")
def seq_mask(log_rho: torch.Tensor, mask: torch.Tensor, *, low: float, high: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """w_i = 1 if low <= prod_t rho_t <= high else 0, on every token of o_i."""
    keep = _inside(_sequence_log_rho(log_rho, mask), low, high)            # [N]
    return keep[:, None].expand_as(log_rho).to(log_rho.dtype), ~keep


@CORRECTIONS.register("icepop", uses=("low", "high"), per_sequence=False, effect="masked")
def icepop(log_rho: torch.Tensor, mask: torch.Tensor, *, low: float, high: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = rho_t if low <= rho_t <= high else 0 (IcePop, Ling team 2025): importance-weighted inside the
    band, no gradient at all outside it, on both sides."""
    keep = _inside(log_rho, low, high)
    return torch.where(keep, log_rho.exp(), 0.0), ~keep   # where, not a product: rho may overflow outside


@CORRECTIONS.register("geo_mask", uses=("low", "high"), per_sequence=True, effect="masked")
def geo_mask(log_rho: torch.Tensor, mask: torch.Tensor, *, low: float, high: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """w_i = 1 if low <= (prod_t rho_t)^(1/|o_i|) <= high else 0: the geometric mean of the token ratios,
    which does not grow with length as the product does."""
    geometric = _sequence_log_rho(log_rho, mask) / mask.sum(-1).clamp(min=1)  # [N] log of the geometric mean
    keep = _inside(geometric, low, high)
    return keep[:, None].expand_as(log_rho).to(log_rho.dtype), ~keep


def apply_correction(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, kind: str, *,
                     low: float, high: float, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """([N, T] detached weight of each token's policy loss, {"offpolicy/capped_frac" or "masked_frac": share of
    the masked-in tokens, or of the sequences with tokens, that the correction changed})."""
    fn = CORRECTIONS[kind]
    keys = dict(low=low, high=high, cap=cap)
    with torch.no_grad():
        weight, affected = fn(old_logp - engine_logp, mask, **{key: keys[key] for key in fn.uses})
        counted = mask.sum(-1) > 0 if fn.per_sequence else mask.bool()
        share = affected[counted].sum().item() / max(counted.sum().item(), 1)
    return weight.detach(), {f"offpolicy/{fn.effect}_frac": share}


def quantiles(values: torch.Tensor, probs: list[float]) -> list[float]:
    """Linear-interpolation quantiles of a 1-D tensor (torch.quantile's default, without its size limit)."""
    ordered = values.sort().values
    out = []
    for p in probs:
        position = p * (ordered.numel() - 1)
        below = math.floor(position)
        above = min(below + 1, ordered.numel() - 1)
        out.append((ordered[below] + (position - below) * (ordered[above] - ordered[below])).item())
    return out


def engine_mismatch(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampling distribution is from the learner's old policy, over the masked tokens:
    offpolicy/engine_kl, the k3 estimate of KL(engine || old) from the engine's own samples,
    (rho - 1) - log rho with rho = exp(old - engine); and quantiles of rho (offpolicy/ratio_p01, _p50, _p99)."""
    with torch.no_grad():
        log_rho = (old_logp - engine_logp)[mask.bool()]
        if log_rho.numel() == 0:
            return {}
        rho = log_rho.exp()
        metrics = {"offpolicy/engine_kl": (rho - 1 - log_rho).mean().item()}
    return metrics | ratio_quantiles(log_rho)


def ratio_quantiles(log_rho: torch.Tensor) -> dict[str, float]:
    """offpolicy/ratio_p01, _p50, _p99 of rho = exp(log_rho), a 1-D tensor of every token's log ratio. Quantiles
    do not combine across micro-batches or ranks: the learner calls this once on the whole step's tokens."""
    with torch.no_grad():
        values = quantiles(log_rho.exp(), list(QUANTILES.values()))
    return {f"offpolicy/ratio_{name}": v for name, v in zip(QUANTILES, values)}
