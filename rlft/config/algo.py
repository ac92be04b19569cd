"""`algo`: the policy-gradient algorithm (ALGORITHMS.md, docs/objectives.md). GRPO, DAPO, GSPO, CISPO, GMPO,
SAPO, KL-Cov, Clip-Cov, RLOO and REINFORCE++ are presets of these keys: the schema's defaults are GRPO's, and the other
files of conf/algo/ list what differs. The preset's name labels a run in `rlft compare` and W&B (the options
line of its config.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional, Union

from rlft.algos.advantages import ADVANTAGES
from rlft.algos.corrections import CORRECTIONS
from rlft.algos.losses import KL_ESTIMATORS, LOSS_AGGS, OBJECTIVES, RATIO_LEVELS
from rlft.config.checks import at_least, finite, positive, within
from rlft.errors import ConfigError

# The choices of these keys are the registered functions' names (rlft.algos)
RatioLevel = RATIO_LEVELS.choices("RatioLevel", __name__)
LossAgg = LOSS_AGGS.choices("LossAgg", __name__)
KLEstimator = KL_ESTIMATORS.choices("KLEstimator", __name__)
ScaleRewards = ADVANTAGES.choices("ScaleRewards", __name__)
Objective = OBJECTIVES.choices("Objective", __name__)
CorrectionKind = CORRECTIONS.choices("CorrectionKind", __name__)


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
class SapoGate:
    tau_pos: float = 1.0
    """SAPO's gate temperature for positive advantages: the gate is (4/tau) sigmoid(tau (r - 1)); a larger
    tau fades the gradient of off-policy tokens faster."""
    tau_neg: float = 1.05
    """SAPO's gate temperature for negative advantages (the paper keeps it above tau_pos: negative updates
    spread over the vocabulary and destabilise sooner)."""


@dataclass
class KLCov:
    frac: float = 2e-3
    """KL-Cov: share k of a micro-batch's tokens, those of largest covariance between log-prob and
    advantage, that get the KL term (the paper: 2e-3 for 7B models, 2e-4 for 32B)."""
    coef: float = 1.0
    """KL-Cov: weight beta of |logp - old| on the selected tokens."""


@dataclass
class ClipCov:
    frac: float = 2e-4
    """Clip-Cov: share r of a micro-batch's tokens whose gradient is removed, drawn at random from the
    unclipped tokens with covariance inside (low, high) (the paper: 2e-4)."""
    low: float = 1.0
    """Clip-Cov: lower end of the covariance band (the paper: 1)."""
    high: float = 5.0
    """Clip-Cov: upper end of the covariance band (the paper: 5)."""


@dataclass
class RolloutCorrection:
    kind: CorrectionKind = CorrectionKind.token_tis
    """Weight of each token's policy loss from the engine/learner ratio rho = exp(old - engine log-prob):
    token_tis = min(rho, cap); seq_tis = min(product over the sequence, cap); token_mask = 0 outside
    [low, high]; seq_mask = the same for the sequence's product; icepop = rho inside [low, high], 0 outside;
    geo_mask = 0 for a sequence whose geometric-mean ratio is outside [low, high]."""
    low: float = 0.5
    """The masks' band: a ratio below `low` (0 <= low <= 1) is masked (IcePop's alpha, 0.5)."""
    high: float = 2.0
    """The masks' band: a ratio above `high` (>= 1) is masked (IcePop's beta is 5)."""
    cap: float = 2.0
    """token_tis and seq_tis: the importance weight's cap C (> 0)."""


@dataclass
class AlgoConfig:
    group_size: int = 8
    """G: responses sampled per prompt; a step trains on trainer.prompts_per_step x G responses."""
    scale_rewards: ScaleRewards = ScaleRewards.group
    """Advantage estimator: group = (R - group mean) / group std (GRPO), batch = divided by the batch std,
    none = R - group mean (Dr. GRPO), rloo = R - mean of the other G - 1 (RLOO), reinforce_pp = (R - group
    mean) / batch std of that (REINFORCE++-baseline)."""
    objective: Objective = Objective.ppo_clip
    """Per-token policy loss: ppo_clip (PPO/GRPO clipped surrogate), cispo (clipped, detached IS weight
    times logp), gmpo (geometric mean of clipped token ratios), sapo (soft sigmoid gate, algo.sapo),
    kl_cov (KL term on high-covariance tokens, algo.kl_cov), clip_cov (PPO-clip with the gradient of a few
    random high-covariance tokens removed, algo.clip_cov). docs/objectives.md has the formulas."""
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
    sapo: Optional[SapoGate] = None
    """objective=sapo: the gate's temperatures; null = the paper's (tau_pos 1.0, tau_neg 1.05)."""
    kl_cov: Optional[KLCov] = None
    """objective=kl_cov: which tokens get the KL term and its weight; null = frac 2e-3, coef 1."""
    clip_cov: Optional[ClipCov] = None
    """objective=clip_cov: how many tokens lose their gradient, from which covariance band; null = frac
    2e-4, band (1, 5)."""
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
    C (2 is usual); corrects engine/learner mismatch and staleness. null = off. The shorthand of
    algo.correction.kind=token_tis algo.correction.cap=C."""
    correction: Optional[RolloutCorrection] = None
    """Rollout correction of the engine/learner mismatch: truncated importance weights or masks, per token
    or per sequence (algo.correction.kind=icepop turns it on); null = off."""
    ppo_epochs: int = 1
    """Optimizer steps per batch of responses (more than 1 makes later epochs off-policy)."""
    routing_replay: Union[bool, str] = False
    """Mixture-of-experts models: training passes use the experts of the old pass. false; true or learner
    (R2: the learner's own old pass); rollout (R3: the rollout engine's routing)."""
    router_aux_loss_coef: float = 0.0
    """Mixture-of-experts models: weight of the router's load-balancing loss added to the loss."""

    @property
    def sapo_gate(self) -> SapoGate:
        """algo.sapo, or its defaults (the paper's) when null."""
        return self.sapo if self.sapo is not None else SapoGate()

    @property
    def kl_cov_selection(self) -> KLCov:
        """algo.kl_cov, or its defaults when null."""
        return self.kl_cov if self.kl_cov is not None else KLCov()

    @property
    def clip_cov_selection(self) -> ClipCov:
        """algo.clip_cov, or its defaults when null."""
        return self.clip_cov if self.clip_cov is not None else ClipCov()

    @property
    def rollout_correction(self) -> RolloutCorrection | None:
        """The correction in effect: algo.correction, or algo.tis_cap's token_tis."""
        if self.tis_cap is not None:
            return RolloutCorrection(kind=CorrectionKind.token_tis, cap=self.tis_cap)
        return self.correction

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
    within("algo.eps_low", a.eps_low, 0, 1)  # 1: no lower bound (CISPO's choice)
    at_least("algo.eps_high", a.eps_high, 0)
    if a.clip_ratio_c is not None and not a.clip_ratio_c > 1:
        raise ConfigError(f"algo.clip_ratio_c must be > 1 or null (got {a.clip_ratio_c})")
    if a.tis_cap is not None and not a.tis_cap > 0:
        raise ConfigError(f"algo.tis_cap must be > 0 or null (got {a.tis_cap})")
    at_least("algo.kl_coef", a.kl_coef, 0)
    at_least("algo.router_aux_loss_coef", a.router_aux_loss_coef, 0)
    for key in ("clip_ratio_c", "tis_cap", "eps_high"):
        finite(f"algo.{key}", getattr(a, key))
    check_objective(a)
    check_correction(a)
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


def check_objective(a: AlgoConfig) -> None:
    """The objective's own keys: a key another objective uses is refused, not silently ignored."""
    name, fn = str(a.objective), OBJECTIVES[str(a.objective)]
    if fn.ratio_levels is not None and str(a.ratio_level) not in fn.ratio_levels:
        raise ConfigError(f"algo.objective={name} works at algo.ratio_level={' or '.join(fn.ratio_levels)} "
                          f"(got {a.ratio_level})")
    uses = {"clip_ratio_c": "clip_ratio_c", "eps_high_schedule": "eps_high", "sapo": "tau_pos",
            "kl_cov": "kl_cov_frac", "clip_cov": "clip_cov_frac"}
    for key, setting in uses.items():
        if getattr(a, key) is not None and setting not in fn.uses:
            users = [n for n in OBJECTIVES.names() if setting in OBJECTIVES[n].uses]
            raise ConfigError(f"algo.{key} is a key of algo.objective={' or '.join(users)}, not of {name}")
    if a.sapo is not None:
        positive("algo.sapo.tau_pos", a.sapo.tau_pos)
        positive("algo.sapo.tau_neg", a.sapo.tau_neg)
    if a.kl_cov is not None:
        within("algo.kl_cov.frac", a.kl_cov.frac, 0, 1, low_open=True)
        at_least("algo.kl_cov.coef", a.kl_cov.coef, 0)
    if a.clip_cov is not None:
        within("algo.clip_cov.frac", a.clip_cov.frac, 0, 1, low_open=True)
        finite("algo.clip_cov.low", a.clip_cov.low)
        finite("algo.clip_cov.high", a.clip_cov.high)
        if not a.clip_cov.low < a.clip_cov.high:
            raise ConfigError(f"algo.clip_cov.low must be below algo.clip_cov.high (got {a.clip_cov.low} and "
                              f"{a.clip_cov.high})")


def check_correction(a: AlgoConfig) -> None:
    if a.tis_cap is not None and a.correction is not None:
        raise ConfigError("algo.tis_cap is the shorthand of algo.correction.kind=token_tis: set one of "
                          "algo.tis_cap and algo.correction")
    c = a.correction
    if c is None:
        return
    within("algo.correction.low", c.low, 0, 1)
    at_least("algo.correction.high", c.high, 1)
    positive("algo.correction.cap", c.cap)
