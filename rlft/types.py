"""The records that cross rlft's seams, and the two interfaces the loop talks to.

    data ──Problem──> rollout.collect ──Rollout + Scores = ScoredGroups──> trainer
    trainer ──TrainBatch, LossSettings──> Learner ──UpdateStats──> trainer
    Learner ──weights──> RolloutEngine (SyncStats back);  trainer ──TrainerState──> checkpoint

Every side imports its records from here and from nowhere else, so rollout and learner never import each
other. Shapes: N = prompts x group size responses, the G responses to one prompt in adjacent rows; P the
left-padded prompt width, R the right-padded response width.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Protocol

import torch


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; reward functions compare completions to `answer`, and get
    the row's other fields (`fields`: test code, task metadata, ...) as keyword arguments."""

    prompt: str
    answer: str
    fields: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1                  # responses per prompt (the group size)
    temperature: float = 1.0    # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 16


@dataclass
class Rollout:
    """Responses to N = len(prompts) * n requests; the n responses to one prompt are adjacent rows.

    The prompt is left-padded and the response right-padded, so `cat([prompt_ids, response_ids], 1)` is a
    batch the learner can score directly: the response always starts at column P.
    """

    prompt_ids: torch.Tensor      # [N, P] long, left-padded with pad_id
    prompt_mask: torch.Tensor     # [N, P] long, 1 on prompt tokens
    response_ids: torch.Tensor    # [N, R] long, right-padded with pad_id
    response_mask: torch.Tensor   # [N, R] long, 1 on the response's tokens (EOS included), padding 0
    logprobs: torch.Tensor        # [N, R] float32, the engine's log-prob of each sampled token, 0 elsewhere
    truncated: torch.Tensor       # [N] bool, True where max_new_tokens (an episode's budget) was hit before EOS
    # [N, P+R, layers, k] uint8: the MoE experts each token was routed to (only when asked for, R3 replay).
    # Padding, and the last sampled token (never fed back), hold expert 0: causal attention keeps them
    # out of every scored log-prob.
    routes: torch.Tensor | None = None
    # [N, R] long, 1 on the tokens the engine sampled; None: all of the response (one turn). In a multi-turn
    # episode the response also holds observation tokens (tool output, the environment's messages): the
    # learner reads them as context (response_mask) but never trains on them (sampled_mask 0).
    sampled_mask: torch.Tensor | None = None
    # [N, R] long, the weights version (learner updates) that sampled each response token, 0 on padding; None:
    # all of one version (ScoredGroups.weights_version). Set by partial rollouts, whose responses span versions.
    versions: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    @property
    def model_mask(self) -> torch.Tensor:  # [N, R] the tokens the policy chose: what the loss may train on
        return self.response_mask if self.sampled_mask is None else self.sampled_mask

    @property
    def response_lengths(self) -> torch.Tensor:  # [N] the policy's tokens (observations not counted)
        return self.model_mask.sum(-1)

    def select(self, rows: torch.Tensor | slice) -> Rollout:
        """The rows at `rows` (indices, a bool mask or a slice), in order."""
        return Rollout(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows]
                          for f in fields(self)})

    def to(self, device: torch.device | str) -> Rollout:
        return Rollout(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                          for f in fields(self)})

    @staticmethod
    def concat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Stack rollouts row-wise, re-padding prompts on the left and responses on the right."""
        if len(parts) == 1:
            return parts[0]
        p = max(r.prompt_ids.shape[1] for r in parts)
        w = max(r.response_ids.shape[1] for r in parts)

        def pad(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
            fill = torch.full((t.shape[0], width - t.shape[1], *t.shape[2:]), value, dtype=t.dtype)
            return torch.cat([fill, t] if left else [t, fill], dim=1)

        sampled = None
        if any(r.sampled_mask is not None for r in parts):
            sampled = torch.cat([pad(r.model_mask, w, 0, False) for r in parts])
        routes = None
        if all(r.routes is not None for r in parts):  # prompt part padded left, response part right
            routes = torch.cat([torch.cat([pad(r.routes[:, :r.prompt_ids.shape[1]], p, 0, True),
                                           pad(r.routes[:, r.prompt_ids.shape[1]:], w, 0, False)], dim=1)
                                for r in parts])
        versions = None
        if all(r.versions is not None for r in parts):
            versions = torch.cat([pad(r.versions, w, 0, False) for r in parts])
        return Rollout(
            prompt_ids=torch.cat([pad(r.prompt_ids, p, pad_id, True) for r in parts]),
            prompt_mask=torch.cat([pad(r.prompt_mask, p, 0, True) for r in parts]),
            response_ids=torch.cat([pad(r.response_ids, w, pad_id, False) for r in parts]),
            response_mask=torch.cat([pad(r.response_mask, w, 0, False) for r in parts]),
            logprobs=torch.cat([pad(r.logprobs, w, 0.0, False) for r in parts]),
            truncated=torch.cat([r.truncated for r in parts]),
            routes=routes,
            sampled_mask=sampled,
            versions=versions,
        )


@dataclass
class Scores:
    """The reward functions' verdict on N completions."""

    total: torch.Tensor               # [N] the weighted sum of the reward functions
    correct: torch.Tensor             # [N] 1.0 where reward.accuracy gives full marks
    parts: dict[str, torch.Tensor]    # name -> [N] each function's (or dict part's) unweighted value
    errors: int = 0                   # calls that raised or timed out (scored 0 with on_error=zero)


@dataclass
class EpisodeStats:
    """Multi-turn episodes (rlft.envs): per episode, in the rows of their rollout."""

    turns: torch.Tensor               # [N] long, the model's turns
    tool_calls: torch.Tensor          # [N] long, tool calls parsed from its turns
    tool_errors: torch.Tensor         # [N] long, calls that failed: unknown tool, bad arguments, raised, timed out
    observation_tokens: torch.Tensor  # [N] long, tokens the environment added (trained on as context only)
    cut: list[str]                    # [N] why each episode ended: "done", "turns", "tokens", "tool_timeout"
    env_rewards: torch.Tensor         # [N] float32, the environment's rewards, summed over the episode
    answer_from_tool: torch.Tensor    # [N] bool, the final answer is (stripped) the output of one of its tool calls
    tool_seconds: float = 0.0         # wall clock spent waiting for tools, over the batch
    transcripts: list[str] = field(default_factory=list)  # [N] each whole episode as text (for the logs)

    def select(self, rows: torch.Tensor | slice) -> EpisodeStats:
        index = torch.arange(len(self.cut))[rows].tolist()
        return EpisodeStats(self.turns[rows], self.tool_calls[rows], self.tool_errors[rows],
                            self.observation_tokens[rows], [self.cut[i] for i in index], self.env_rewards[rows],
                            self.answer_from_tool[rows], self.tool_seconds, [self.transcripts[i] for i in index] if self.transcripts else [])

    @staticmethod
    def concat(parts: list[EpisodeStats]) -> EpisodeStats:
        return EpisodeStats(*(torch.cat([getattr(p, name) for p in parts])
                              for name in ("turns", "tool_calls", "tool_errors", "observation_tokens")),
                            [c for p in parts for c in p.cut], torch.cat([p.env_rewards for p in parts]),
                            torch.cat([p.answer_from_tool for p in parts]), sum(p.tool_seconds for p in parts), [t for p in parts for t in p.transcripts])


@dataclass
class ScoredGroups:
    """A step's training groups, as the collector hands them to the trainer; rows of one group adjacent."""

    problems: list[Problem]     # one per group
    rollout: Rollout            # [N, ...]
    scores: Scores              # [N] the task rewards
    rewards: torch.Tensor       # [N] scores.total plus any length shaping: what advantages are computed from
    episodes: EpisodeStats | None = None  # multi-turn runs (an environment): what the episodes did
    rounds: int = 1             # sampling rounds (dynamic sampling samples again for mixed groups)
    dropped_groups: int = 0     # groups dropped by dynamic sampling (all rewards equal)
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0
    weights_version: int = 0    # learner updates in the (oldest) weights that generated the rollout
    staleness: int = 0          # learner updates since then, when the trainer takes the groups
    # [k + 1] share of the sampled tokens 0, 1, ..., k versions old when the trainer takes them
    staleness_histogram: list[float] = field(default_factory=list)
    stale_dropped: int = 0      # partial rollouts: groups dropped for a token more than k versions old
    carried_groups: int = 0     # partial rollouts: groups begun in an earlier step's generation
    passes: int = 1             # engine passes of the collection (partial rollouts: chunks)
    generated_reward_mean: float = float("nan")  # the task reward of every response generated, kept or dropped

    @property
    def num_groups(self) -> int:
        return len(self.problems)


@dataclass(frozen=True)
class LossSettings:
    """The keyword hyper-parameters of rlft.algos.losses.policy_loss for one step, built from the algo
    config by rlft.algos.settings.loss_settings (eps_high may follow a schedule)."""

    ratio_level: str                   # a registered ratio level (rlft.algos.losses.RATIO_LEVELS)
    eps_low: float
    eps_high: float
    clip_ratio_c: float | None         # dual clip for negative advantages; None = off
    loss_agg: str                      # a registered aggregation (LOSS_AGGS)
    max_response_len: int              # L_max, for seq_mean_token_sum_norm
    kl_coef: float = 0.0               # the KL term in the loss (0 when it goes into the reward instead)
    kl_estimator: str = "k3"           # a registered estimator (KL_ESTIMATORS)
    objective: str = "ppo_clip"        # a registered objective (OBJECTIVES); the rest of its keys below
    tau_pos: float = 1.0               # sapo: gate temperature for A > 0
    tau_neg: float = 1.05              # sapo: for A <= 0
    kl_cov_frac: float = 2e-3          # kl_cov: share of the tokens that get the KL term
    kl_cov_coef: float = 1.0           # kl_cov: its weight
    clip_cov_frac: float = 2e-4        # clip_cov: share of the tokens whose gradient is removed
    clip_cov_low: float = 1.0          # clip_cov: the covariance band (low, high) they are drawn from
    clip_cov_high: float = 5.0
    correction: str | None = None      # a registered rollout correction (rlft.algos.corrections); None = off
    correction_low: float = 0.5        # the masks' ratio band [low, high]
    correction_high: float = 2.0
    correction_cap: float = 2.0        # truncated IS: the weight cap C


@dataclass
class TrainBatch:
    """What the learner trains on: a rollout, and what the trainer computed from its scores."""

    rollout: Rollout                   # [N, ...] the engine's tokens, masks and log-probs
    advantages: torch.Tensor           # [N] one per response
    loss_mask: torch.Tensor            # [N, R] response_mask less the responses filtered out of the loss
    ref_logprobs: torch.Tensor | None = None  # [N, R] under the frozen reference, when the KL is in the loss

    @property
    def size(self) -> int:
        return self.rollout.size

    def to(self, device: torch.device | str) -> TrainBatch:
        return replace(self, rollout=self.rollout.to(device), advantages=self.advantages.to(device),
                       loss_mask=self.loss_mask.to(device),
                       ref_logprobs=None if self.ref_logprobs is None else self.ref_logprobs.to(device))


@dataclass
class RoutingStats:
    """Mixture-of-experts routing over one update (rlft.models.routing), summed over passes and ranks."""

    routing_drift: float        # share of token-layer pairs whose experts differ from the old pass's (0 with replay)
    router_drift: float         # the same for the experts the current router would pick
    load_balance_loss: float    # Switch-Transformer auxiliary loss of the whole step
    expert_load_cv: float       # coefficient of variation of the tokens per expert
    expert_tokens: list[float]  # routed slots per expert, summed over layers


@dataclass
class UpdateStats:
    """What one learner update did, reduced over micro-batches, epochs and ranks. Means are over the
    step's loss tokens (sequences for a sequence-level ratio); None where nothing was measured."""

    loss: float                        # the step's loss, mean over ppo epochs
    pg_loss: float                     # its policy-gradient part
    approx_kl: float                   # old -> new, mean of (r - 1) - log r
    entropy: float                     # of the old policy, over the loss tokens
    grad_norm: float                   # before clipping, mean over ppo epochs
    tokens: int                        # loss tokens
    logprob_diff_mean: float           # |engine - learner| log-prob of the sampled tokens, old weights
    logprob_diff_max: float
    forward_seconds: float             # this rank's passes (the first epoch's give the old log-probs too)
    backward_seconds: float
    optimizer_seconds: float           # gradient reduction, clipping, AdamW
    kl_ref: float | None = None        # KL to the reference, when it is in the loss
    clip_frac_low: float | None = None
    clip_frac_high: float | None = None
    ratio_mean: float | None = None
    ratio_min: float | None = None
    ratio_max: float | None = None
    routing: RoutingStats | None = None  # mixture-of-experts policies only
    skipped_updates: int = 0           # optimizer steps not applied: their loss or gradient norm was not finite
    nonfinite: str | None = None       # the first non-finite quantity of those, e.g. "loss = nan"
    named: dict[str, float] = field(default_factory=dict)  # policy_loss's namespaced metrics, logged as named


@dataclass(frozen=True)
class SyncStats:
    seconds: float   # learner -> engine weight transfer, wall clock
    bytes: int


@dataclass
class TrainerState:
    """What a checkpoint holds besides weights and optimizer state."""

    step: int                      # last completed step
    sampler_position: int          # problems dealt so far
    rollout_rng: torch.Tensor      # the engine's sampling generator (stacked, with several rollout workers)
    torch_rng: torch.Tensor


class RolloutEngine(Protocol):
    """Generates from token ids and takes new weights by name (HF engine, vLLM, Ray rollout workers)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def rng_state(self) -> torch.Tensor: ...

    def set_rng_state(self, state: torch.Tensor) -> None: ...

    def sleep(self) -> None:
        """Release accelerator memory until the next call (colocated vLLM); a no-op elsewhere."""


class WeightsCopy(Protocol):
    """One weights version kept for an engine that takes it later (Learner.snapshot_weights)."""

    bytes: int

    def load_into(self, engine: RolloutEngine) -> None: ...

    def release(self) -> None: ...


@dataclass
class HeldWeights:
    """A WeightsCopy held in this process: the tensors themselves."""

    weights: dict[str, torch.Tensor]

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def load_into(self, engine: RolloutEngine) -> None:
        engine.update_weights(list(self.weights.items()))

    def release(self) -> None:
        self.weights = {}


class Learner(Protocol):
    """The policy's side of the loop (one process: rlft.learner.local.LocalLearner; Ray learner ranks:
    rlft.distributed.learner_actors.RemoteLearner). One signature for every placement."""

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        """[N, R] log-probs of the sampled tokens under the frozen reference; None without one."""

    def update(self, batch: TrainBatch, loss: LossSettings, lr: float) -> UpdateStats:
        """ppo_epochs optimizer steps on the batch, with this step's loss settings and learning rate."""

    def push_weights(self, engine: RolloutEngine) -> SyncStats: ...

    def snapshot_weights(self) -> WeightsCopy:
        """A copy of what push_weights sends, for an engine that takes it later (rollout.max_staleness >= 2)."""

    def save_checkpoint(self, run_dir: Path, state: TrainerState, keep: int) -> None: ...

    def load_checkpoint(self, folder: Path) -> TrainerState: ...

    def save_model(self, folder: Path) -> None: ...

    def peak_memory_mb(self) -> float: ...
