"""`algo`: the policy-gradient algorithm (ALGORITHMS.md). GRPO, DAPO and GSPO are presets of these keys:
the schema's defaults are GRPO's, and conf/algo/dapo.yaml and gspo.yaml list what differs. The preset's
name labels a run in `rlft compare` and W&B (the options line of its config.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional, Union

from rlft.algos.advantages import ADVANTAGES
from rlft.algos.losses import KL_ESTIMATORS, LOSS_AGGS, RATIO_LEVELS
from rlft.config.checks import at_least, finite, within
from rlft.errors import ConfigError

# The choices of these keys are the registered functions' names (rlft.algos)
RatioLevel = RATIO_LEVELS.choices("RatioLevel", __name__)
LossAgg = LOSS_AGGS.choices("LossAgg", __name__)
KLEstimator = KL_ESTIMATORS.choices("KLEstimator", __name__)
ScaleRewards = ADVANTAGES.choices("ScaleRewards", __name__)


class ScheduleKind(StrEnum):
    linear = "linear"
    cosine = "cosine"


ROUTING_SOURCES = ("learner", "rollout")


@dataclass
class EpsHighSchedule:
    kind: ScheduleKind = ScheduleKind.linear
    """How eps_high moves from its configured value to `end`: linear or cosine."""
    end: float = 0.28
    """eps_high after `steps` steps."""
    steps: int = 100
    """Training steps over which eps_high moves; constant after."""


@dataclass
class OverlongShaping:
    enabled: bool = True
    """Add DAPO's overlong length penalty to the task reward (setting any key here turns it on)."""
    buffer: Optional[int] = None
    """L_cache: the penalty falls from 0 to -penalty over the last `buffer` tokens before
    rollout.max_new_tokens; null = max_new_tokens // 4."""
    penalty: float = 1.0
    """The penalty of a response that reaches rollout.max_new_tokens."""


@dataclass
class AlgoConfig:
    group_size: int = 8
    """G: responses sampled per prompt; a step trains on trainer.prompts_per_step x G responses."""
    scale_rewards: ScaleRewards = ScaleRewards.group
    """Advantage estimator: group = (R - group mean) / group std (GRPO), batch = divided by the batch std,
    none = R - group mean (Dr. GRPO)."""
    ratio_level: RatioLevel = RatioLevel.token
    """Importance ratio: token (PPO/GRPO), sequence (GSPO: length-normalised, one per response),
    sequence_token (GSPO-token)."""
    eps_low: float = 0.2
    """Lower clip bound: ratios below 1 - eps_low are clipped (for negative advantages)."""
    eps_high: float = 0.2
    """Upper clip bound: ratios above 1 + eps_high are clipped (positive advantages); DAPO's clip-higher
    raises it to 0.28."""
    eps_high_schedule: Optional[EpsHighSchedule] = None
    """null = constant eps_high; set a key (algo.eps_high_schedule.end=0.3) to move it over training."""
    clip_ratio_c: Optional[float] = None
    """Dual clip: the loss of a negative advantage is capped at c * |A| (c > 1, typically 3); null = off."""
    loss_agg: LossAgg = LossAgg.seq_mean_token_mean
    """How token losses become one number: token_mean (DAPO), seq_mean_token_mean (GRPO),
    seq_mean_token_sum_norm (Dr. GRPO), seq_mean (GSPO)."""
    kl_coef: float = 0.04
    """beta, the weight of the KL to the reference policy; 0 loads no reference model at all."""
    kl_estimator: KLEstimator = KLEstimator.k3
    """Per-token KL estimate: k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = exp(ref - logp) - (ref - logp) - 1."""
    kl_in_reward: bool = False
    """Subtract kl_coef x the response's KL from its reward (PPO style) instead of adding it to the loss."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts to fill the batch."""
    max_sampling_rounds: int = 3
    """Dynamic sampling: rounds of sampling per step at most; the step trains on what was kept."""
    overlong: Optional[OverlongShaping] = None
    """DAPO's overlong reward shaping; null = off (algo.overlong.buffer=2 or algo.overlong.enabled=true
    turns it on)."""
    mask_truncated: bool = False
    """Overlong filtering: responses cut off at rollout.max_new_tokens (no EOS) get no loss."""
    tis_cap: Optional[float] = None
    """Truncated importance sampling: each token's loss times min(exp(old - engine log-prob), C) with this
    C (2 is usual); corrects engine/learner mismatch and staleness. null = off."""
    ppo_epochs: int = 1
    """Optimizer steps per batch of responses (more than 1 makes later epochs off-policy)."""
    routing_replay: Union[bool, str] = False
    """Mixture-of-experts models: training passes use the experts of the old pass. false; true or learner
    (R2: the learner's own old pass); rollout (R3: the rollout engine's routing)."""
    router_aux_loss_coef: float = 0.0
    """Mixture-of-experts models: weight of the router's load-balancing loss added to the loss."""

    @property
    def routing_source(self) -> str | None:
        """Where replayed routes come from: learner, rollout, or None without replay."""
        if self.routing_replay is True:
            return "learner"
        return self.routing_replay or None


def check(cfg) -> None:
    a = cfg.algo
    at_least("algo.group_size", a.group_size, 2)
    at_least("algo.ppo_epochs", a.ppo_epochs, 1)
    at_least("algo.max_sampling_rounds", a.max_sampling_rounds, 1)
    within("algo.eps_low", a.eps_low, 0, 1, high_open=True)
    at_least("algo.eps_high", a.eps_high, 0)
    if a.clip_ratio_c is not None and not a.clip_ratio_c > 1:
        raise ConfigError(f"algo.clip_ratio_c must be > 1 or null (got {a.clip_ratio_c})")
    if a.tis_cap is not None and not a.tis_cap > 0:
        raise ConfigError(f"algo.tis_cap must be > 0 or null (got {a.tis_cap})")
    at_least("algo.kl_coef", a.kl_coef, 0)
    at_least("algo.router_aux_loss_coef", a.router_aux_loss_coef, 0)
    for key in ("clip_ratio_c", "tis_cap", "eps_high"):
        finite(f"algo.{key}", getattr(a, key))
    if isinstance(a.routing_replay, str) and a.routing_replay not in ROUTING_SOURCES:
        raise ConfigError(f"algo.routing_replay='{a.routing_replay}' is not one of: false, true, "
                          f"{', '.join(ROUTING_SOURCES)}")
    if a.eps_high_schedule is not None:
        at_least("algo.eps_high_schedule.steps", a.eps_high_schedule.steps, 1)
        at_least("algo.eps_high_schedule.end", a.eps_high_schedule.end, 0)
    if a.overlong is not None:
        max_new_tokens = cfg.rollout.max_new_tokens
        if a.overlong.buffer is not None and not 1 <= a.overlong.buffer <= max_new_tokens:
            raise ConfigError(f"algo.overlong.buffer must be in [1, rollout.max_new_tokens={max_new_tokens}] "
                              f"or null (got {a.overlong.buffer})")
        at_least("algo.overlong.penalty", a.overlong.penalty, 0)
