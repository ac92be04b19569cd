"""Phases 1-3 of the loop: sample prompts, generate a group of responses each, score them.

With DAPO's dynamic sampling, groups whose task rewards are all equal (all right or all wrong: no
gradient) are dropped and more prompts are sampled, until the batch holds `prompts_per_step` groups or
`max_sampling_rounds` rounds have run; the batch then holds what was kept.

With rollout.async_steps=1, `CollectAhead` runs the next step's collection in a background thread while
the learner updates on this step's batch, with the weights the engine holds then (one version behind).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from rlft.algos.shaping import mixed_groups, overlong_penalty
from rlft.data.sampler import PromptSampler
from rlft.data.types import Problem
from rlft.rewards.scorer import Scores
from rlft.rollout.base import Rollout, RolloutEngine, SamplingParams, concat_rollouts

# (the problem of each response, completions, response lengths in tokens) -> Scores (RewardScorer.score)
ScoreFn = Callable[[list[Problem], list[str], list[int]], Scores]


@dataclass(frozen=True)
class Overlong:
    max_len: int      # L_max = rollout.max_new_tokens
    buffer: int       # L_cache
    penalty: float


@dataclass
class ScoredGroups:
    """The step's training groups; N = groups x group_size rows, the rows of one group adjacent."""

    problems: list[Problem]     # one per group
    rollout: Rollout            # [N, ...]
    rewards: torch.Tensor       # [N] task reward plus any length shaping: what advantages are computed from
    correct: torch.Tensor       # [N] 1.0 where reward.accuracy gives full marks, for the accuracy metric
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N] each reward fn's value
    reward_errors: int = 0      # reward calls that failed (scored 0 with reward.on_error=zero)
    rounds: int = 1
    dropped_groups: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    weights_version: int = 0    # learner updates in the weights that generated the batch

    @property
    def num_groups(self) -> int:
        return len(self.problems)


def collect_groups(sampler: PromptSampler, engine: RolloutEngine, encode: Callable[[str], list[int]],
                   decode: Callable[[torch.Tensor], list[str]], score: ScoreFn, sampling: SamplingParams,
                   pad_id: int, *, prompts_per_step: int, dynamic_sampling: bool, max_sampling_rounds: int,
                   overlong: Overlong | None) -> ScoredGroups:
    group_size = sampling.n
    kept: list[ScoredGroups] = []
    kept_groups, dropped, rounds, errors = 0, 0, 0, 0
    seconds = {"generate": 0.0, "reward": 0.0}
    for rounds in range(1, (max_sampling_rounds if dynamic_sampling else 1) + 1):
        problems = sampler.next(prompts_per_step)
        t = time.perf_counter()
        rollout = engine.generate([encode(p.prompt) for p in problems], sampling)
        seconds["generate"] += time.perf_counter() - t

        t = time.perf_counter()
        per_response = [p for p in problems for _ in range(group_size)]
        scores = score(per_response, decode(rollout.response_ids), rollout.response_lengths.tolist())
        errors += scores.errors
        task_rewards = rewards = scores.total
        if overlong is not None:
            rewards = rewards + overlong_penalty(rollout.response_lengths, overlong.max_len, overlong.buffer,
                                                 overlong.penalty)
        seconds["reward"] += time.perf_counter() - t

        keep = torch.ones(len(problems), dtype=torch.bool)
        if dynamic_sampling:
            keep = mixed_groups(task_rewards, group_size)
            dropped += int((~keep).sum())
        rows = keep.repeat_interleave(group_size)
        kept.append(ScoredGroups([p for p, k in zip(problems, keep) if k], rollout.select(rows), rewards[rows],
                                 scores.correct[rows], {k: v[rows] for k, v in scores.parts.items()}))
        kept_groups += int(keep.sum())
        if kept_groups >= prompts_per_step:
            break

    problems = [p for part in kept for p in part.problems][:prompts_per_step]
    n = len(problems) * group_size
    rollout = concat_rollouts([part.rollout for part in kept], pad_id).select(torch.arange(n))
    return ScoredGroups(problems=problems, rollout=rollout,
                        rewards=torch.cat([part.rewards for part in kept])[:n],
                        correct=torch.cat([part.correct for part in kept])[:n],
                        reward_parts={k: torch.cat([part.reward_parts[k] for part in kept])[:n]
                                      for k in kept[0].reward_parts},
                        reward_errors=errors, rounds=rounds, dropped_groups=dropped, seconds=seconds)


class CollectAhead:
    """One collection at a time in a background thread: `start` it before the policy update, `wait` for it
    before the engine's weights change, `take` its groups in the next step. Exceptions surface in `take`
    and `wait`, in the trainer's thread."""

    def __init__(self, collect: Callable[[], ScoredGroups]):
        self._collect = collect
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlft-collect-ahead")
        self._pending: tuple[Future, int] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def start(self, weights_version: int) -> None:
        assert self._pending is None, "one collection ahead at most"
        self._pending = (self._pool.submit(self._collect), weights_version)

    def wait(self) -> float:
        """Block until the pending collection is done (the engine is idle after); the seconds waited."""
        t = time.perf_counter()
        if self._pending is not None:
            self._pending[0].exception()  # waits; an error is raised by take()
        return time.perf_counter() - t

    def take(self) -> ScoredGroups:
        future, version = self._pending
        self._pending = None
        scored = future.result()
        scored.weights_version = version
        return scored

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
