"""Phases 1-3 of the loop, and the rest of the engine's time: sample prompts, generate a group of responses
each, score them; take the learner's new weights; generate greedily for the held-out evaluation.

With DAPO's dynamic sampling, groups whose task rewards are all equal (all right or all wrong: no gradient)
are dropped and more prompts are sampled, until the batch holds `prompts_per_step` groups or
`max_sampling_rounds` rounds have run; the batch then holds what was kept.

With rollout.async_steps=1 the next step's batch is collected in a background thread while the learner
updates on this one, with the weights the engine holds then (one version behind). The new weights are
pushed once that collection is done, and nothing is collected ahead across a checkpoint, so that resume
starts from the state the run went on with.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch

from rlft.algos.shaping import mixed_groups, overlong_penalty
from rlft.data.sampler import PromptSampler
from rlft.types import (EpisodeStats, Learner, Problem, Rollout, RolloutEngine, SamplingParams, ScoredGroups,
                        Scores, SyncStats)

# (the problem of each response, completions, response lengths in tokens) -> Scores (RewardScorer.score)
ScoreFn = Callable[[list[Problem], list[str], list[int]], Scores]


@dataclass(frozen=True)
class Overlong:
    max_len: int      # L_max = rollout.max_new_tokens
    buffer: int       # L_cache
    penalty: float


class Collector:
    """Owns the engine's use: one collection at a time, weights changed only between collections.

    `weights_version` counts learner updates: the learner's (pushed or not) and the engine's (pushed)."""

    def __init__(self, engine: RolloutEngine, sampler: PromptSampler, encode: Callable[[str], list[int]],
                 decode: Callable[[torch.Tensor], list[str]], score: ScoreFn, sampling: SamplingParams,
                 pad_id: int, *, prompts_per_step: int, dynamic_sampling: bool = False, max_sampling_rounds: int = 1,
                 overlong: Overlong | None = None, collect_ahead: bool = False, sleep: bool = False,
                 weights_version: int = 0, episodes=None):
        self.engine, self.sampler, self.encode, self.decode, self.score = engine, sampler, encode, decode, score
        self.episodes = episodes  # an rlft.envs.EpisodeRunner: multi-turn episodes instead of one response each
        self.sampling, self.pad_id, self.prompts_per_step = sampling, pad_id, prompts_per_step
        self.rounds = max_sampling_rounds if dynamic_sampling else 1
        self.dynamic_sampling, self.overlong, self.sleep = dynamic_sampling, overlong, sleep
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="rlft-collect-ahead") if collect_ahead else None
        self._pending: Future | None = None
        self.learner_version = self.engine_version = weights_version

    def collect(self, ahead: bool = True) -> ScoredGroups:
        """This step's groups: collected during the last update, or now. With collect-ahead on and `ahead`
        (no checkpoint at the end of this step), the next step's collection starts in the background."""
        if self._pending is not None:
            groups, self._pending = self._pending.result(), None
        else:
            groups = self._collect(self.engine_version)
        groups.staleness = self.learner_version - groups.weights_version
        if self._ahead is not None and ahead:
            self._pending = self._ahead.submit(self._collect, self.engine_version)
        if self.sleep:  # colocated: the GPU's memory is the learner's until the next weight push
            self.engine.sleep()
        return groups

    def push_weights(self, learner: Learner) -> tuple[SyncStats, float]:
        """After an update: (the sync's stats, seconds spent waiting for the collection ahead to finish)."""
        waited = self.wait()
        sync = learner.push_weights(self.engine)
        self.learner_version += 1
        self.engine_version = self.learner_version
        return sync, waited

    def wait(self) -> float:
        """Block until the collection ahead, if any, is done (its error is raised by the next collect)."""
        start = time.perf_counter()
        if self._pending is not None:
            self._pending.exception()
        return time.perf_counter() - start

    def evaluate(self, problems: list[Problem], max_new_tokens: int
                 ) -> tuple[list[str], Scores, EpisodeStats | None]:
        """Greedy completions of the held-out problems (multi-turn: whole episodes), their scores, and the
        episodes' stats."""
        self.wait()
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
        rollout, completions, episodes = self._generate(problems, greedy)
        scores = _with_env_rewards(self.score(problems, completions, rollout.response_lengths.tolist()), episodes)
        return (episodes.transcripts if episodes is not None else completions), scores, episodes

    def state(self) -> tuple[int, torch.Tensor]:
        """(problems dealt, the engine's sampling state): what a checkpoint needs to resume the same samples."""
        return self.sampler.position, self.engine.rng_state()

    def restore(self, position: int, rng: torch.Tensor) -> None:
        self.sampler.position = position
        self.engine.set_rng_state(rng)

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.runner.close()
        if self._ahead is not None:
            self._ahead.shutdown(wait=True, cancel_futures=True)

    def _collect(self, weights_version: int) -> ScoredGroups:
        group_size = self.sampling.n
        kept: list[ScoredGroups] = []
        kept_groups = dropped = errors = 0
        generate_seconds = reward_seconds = 0.0
        for rounds in range(1, self.rounds + 1):
            problems = self.sampler.next(self.prompts_per_step)
            t = time.perf_counter()
            rollout, completions, episodes = self._generate(problems, self.sampling)
            generate_seconds += time.perf_counter() - t

            t = time.perf_counter()
            per_response = [p for p in problems for _ in range(group_size)]
            scores = _with_env_rewards(self.score(per_response, completions, rollout.response_lengths.tolist()),
                                       episodes)
            errors += scores.errors
            rewards = scores.total
            if self.overlong is not None:
                rewards = rewards + overlong_penalty(rollout.response_lengths, self.overlong.max_len,
                                                     self.overlong.buffer, self.overlong.penalty)
            reward_seconds += time.perf_counter() - t

            keep = torch.ones(len(problems), dtype=torch.bool)
            if self.dynamic_sampling:  # on the task reward: length shaping does not make a group mixed
                keep = mixed_groups(scores.total, group_size)
            dropped += int((~keep).sum())
            rows = keep.repeat_interleave(group_size)
            kept.append(ScoredGroups([p for p, k in zip(problems, keep) if k], rollout.select(rows),
                                     _select(scores, rows), rewards[rows],
                                     episodes=None if episodes is None else episodes.select(rows)))
            kept_groups += int(keep.sum())
            if kept_groups >= self.prompts_per_step:
                break

        problems = [p for part in kept for p in part.problems][:self.prompts_per_step]
        n = len(problems) * group_size
        scores = Scores(total=torch.cat([part.scores.total for part in kept])[:n],
                        correct=torch.cat([part.scores.correct for part in kept])[:n],
                        parts={k: torch.cat([part.scores.parts[k] for part in kept])[:n] for k in kept[0].scores.parts},
                        errors=errors)
        rollout = Rollout.concat([part.rollout for part in kept], self.pad_id).select(slice(0, n))
        episodes = None
        if self.episodes is not None:
            episodes = EpisodeStats.concat([part.episodes for part in kept]).select(slice(0, n))
        return ScoredGroups(problems=problems, rollout=rollout, scores=scores,
                            rewards=torch.cat([part.rewards for part in kept])[:n], episodes=episodes, rounds=rounds,
                            dropped_groups=dropped, generate_seconds=generate_seconds, reward_seconds=reward_seconds,
                            weights_version=weights_version)

    def _generate(self, problems: list[Problem], params: SamplingParams
                  ) -> tuple[Rollout, list[str], EpisodeStats | None]:
        """params.n responses (or episodes) per problem: (rollout, the text the reward functions score, the
        episodes' stats when multi-turn)."""
        if self.episodes is None:
            rollout = self.engine.generate([self.encode(p.prompt) for p in problems], params)
            return rollout, self.decode(rollout.response_ids), None
        episodes = self.episodes.run(problems, params)
        return episodes.rollout, episodes.completions, episodes.stats


def _with_env_rewards(scores: Scores, episodes: EpisodeStats | None) -> Scores:
    """The environment's rewards (summed over each episode) added to the reward functions', as part `env`."""
    if episodes is None:
        return scores
    return Scores(scores.total + episodes.env_rewards, scores.correct, scores.parts | {"env": episodes.env_rewards},
                  scores.errors)


def _select(scores: Scores, rows: torch.Tensor) -> Scores:
    return Scores(scores.total[rows], scores.correct[rows], {k: v[rows] for k, v in scores.parts.items()},
                  scores.errors)
