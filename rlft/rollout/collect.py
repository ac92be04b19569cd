"""Phases 1-3 of the loop, and the rest of the engine's time: sample prompts, generate a group of responses
each, score them; take the learner's new weights; generate greedily for the held-out evaluation.

With DAPO's dynamic sampling, groups whose task rewards are all equal (all right or all wrong: no gradient)
are dropped and more prompts are sampled, until the batch holds `prompts_per_step` groups or
`max_sampling_rounds` rounds have run; the batch then holds what was kept.

With rollout.max_staleness=k > 0 a producer thread collects up to k batches ahead while the learner
trains. Which weights generate which batch is fixed, not left to timing: step b's batch comes from weights
version max(v, b - 1 - k), v being the version the engine held when that collection began, so a run is
reproducible and staleness (learner updates since the batch's weights) never exceeds k. k = 1 pushes the
weights once the batch ahead is done (the engine is idle then: no copy); k >= 2 hands the producer a copy of
each version's weights (k copies at most), which it loads between batches. Nothing is collected across a
checkpoint, and before a held-out evaluation the engine takes the learner's weights, so resume starts from
the state the run went on with and an evaluation scores the current policy. With partial rollouts
(rlft.rollout.partial) carried tokens are a version older than a batch's new ones, so the producer runs
k - 1 batches ahead; dynamic sampling then filters the groups as they finish and tops the pool up again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import torch

from rlft.algos.shaping import mixed_groups, overlong_penalty
from rlft.data.sampler import PromptSampler
from rlft.rollout.partial import PartialRollouts
from rlft.types import (EpisodeStats, Learner, Problem, Rollout, RolloutEngine, SamplingParams, ScoredGroups,
                        Scores, SyncStats, WeightsCopy)

# (the problem of each response, completions, response lengths in tokens) -> Scores (RewardScorer.score)
ScoreFn = Callable[[list[Problem], list[str], list[int]], Scores]


@dataclass(frozen=True)
class Overlong:
    max_len: int      # L_max = rollout.max_new_tokens
    buffer: int       # L_cache
    penalty: float


class Collector:
    """Owns the engine's use: one collection at a time, weights changed only between collections.

    `learner_version` counts learner updates; `engine_version` the update whose weights the engine holds."""

    def __init__(self, engine: RolloutEngine, sampler: PromptSampler, encode: Callable[[str], list[int]],
                 decode: Callable[[torch.Tensor], list[str]], score: ScoreFn, sampling: SamplingParams,
                 pad_id: int, *, prompts_per_step: int, dynamic_sampling: bool = False, max_sampling_rounds: int = 1,
                 overlong: Overlong | None = None, max_staleness: int = 0,
                 sync_point: Callable[[int], bool] = lambda step: False, sleep: bool = False,
                 weights_version: int = 0, episodes=None, chunk_tokens: int | None = None):
        self.engine, self.sampler, self.encode, self.decode, self.score = engine, sampler, encode, decode, score
        self.episodes = episodes  # an rlft.envs.EpisodeRunner: multi-turn episodes instead of one response each
        self.sampling, self.pad_id, self.prompts_per_step = sampling, pad_id, prompts_per_step
        self.rounds = max_sampling_rounds if dynamic_sampling else 1
        self.dynamic_sampling, self.overlong, self.sleep = dynamic_sampling, overlong, sleep
        self.max_staleness, self.sync_point = max_staleness, sync_point  # sync_point(step): a checkpoint follows
        # chunk_tokens: partial rollouts. Their carried tokens are a version older than the step's new ones, so
        # new tokens come from weights at most k - 1 versions behind: the producer runs k - 1 batches ahead.
        self.partial = None if chunk_tokens is None else PartialRollouts(engine, encode, sampling, chunk_tokens, pad_id,
                                                                         episodes=episodes)
        self.ahead = max_staleness - 1 if self.partial is not None else max_staleness
        self._producer = ThreadPoolExecutor(1, thread_name_prefix="rlft-collect-ahead") if self.ahead else None
        self._queue: deque[Future] = deque()  # batches collected or being collected ahead, oldest first
        self._next_batch = weights_version + 1  # the step whose batch is collected next
        self._snapshots: dict[int, WeightsCopy] = {}  # version -> its weights, for the producer (k >= 2)
        self._snapshot_ready = threading.Condition()
        self._closing = False
        self.learner_version = self.engine_version = weights_version

    def collect(self, step: int) -> ScoredGroups:
        """This step's groups: collected ahead during earlier updates, or now. Then batches up to step + k are
        queued, none past a checkpoint."""
        if self._producer is None:
            groups = self._collect(self._next_batch, self.engine_version)
            self._next_batch += 1
        else:
            if not self._queue:
                self._submit()
            groups = self._queue.popleft().result()
        groups.staleness = self.learner_version - groups.weights_version
        groups.staleness_histogram = self._staleness_histogram(groups)
        while self._producer is not None and self._next_batch <= step + self.ahead \
                and not any(self.sync_point(s) for s in range(step, self._next_batch)):
            self._submit()
        if self.sleep:  # colocated: the GPU's memory is the learner's until the next weight push
            self.engine.sleep()
        return groups

    def push_weights(self, learner: Learner) -> tuple[SyncStats, float]:
        """After an update: (the sync's stats, seconds spent waiting for batches collected ahead). With
        batches queued and k >= 2 the weights are copied for the producer instead of waiting for the engine."""
        self.learner_version += 1
        if self._queue and self.ahead >= 2:
            start = time.perf_counter()
            snapshot = learner.snapshot_weights()
            with self._snapshot_ready:
                self._snapshots[self.learner_version] = snapshot
                self._snapshot_ready.notify_all()
            return SyncStats(seconds=time.perf_counter() - start, bytes=snapshot.bytes), 0.0
        waited = self.wait()
        sync = learner.push_weights(self.engine)
        self._engine_holds(self.learner_version)
        return sync, waited

    def skip_update(self, learner: Learner) -> None:
        """A step whose batch was empty (dynamic sampling kept no group): with batches scheduled ahead, its
        unchanged weights still count as this step's version, since the schedule counts steps; without, nothing."""
        if self.max_staleness:
            self.push_weights(learner)

    def catch_up(self, learner: Learner) -> float:
        """Before an evaluation: the batches queued are finished (they keep their weights) and the engine takes
        the learner's current weights. Seconds spent waiting."""
        waited = self.wait()
        if self.engine_version != self.learner_version:
            learner.push_weights(self.engine)
            self._engine_holds(self.learner_version)
        return waited

    def wait(self) -> float:
        """Block until the batches collected ahead are done (an error is raised by the collect that takes it)."""
        start = time.perf_counter()
        for pending in self._queue:
            pending.exception()
        return time.perf_counter() - start

    def evaluate(self, problems: list[Problem], max_new_tokens: int
                 ) -> tuple[list[str], Scores, EpisodeStats | None]:
        """Greedy completions of the held-out problems (multi-turn: whole episodes), their scores, and the
        episodes' stats."""
        return self._scored(problems, SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens))

    def sample(self, problems: list[Problem], n: int) -> tuple[list[str], Scores, EpisodeStats | None]:
        """n completions of each problem sampled at the run's temperature and top_p (`rlft eval --samples`'s
        pass@k), each problem's n adjacent, scored as `evaluate` scores them (no length shaping)."""
        return self._scored(problems, replace(self.sampling, n=n))

    def _scored(self, problems: list[Problem], params: SamplingParams
                ) -> tuple[list[str], Scores, EpisodeStats | None]:
        self.wait()
        rollout, completions, episodes = self._generate(problems, params)
        per_response = [p for p in problems for _ in range(params.n)]
        scores = _with_env_rewards(self.score(per_response, completions, rollout.response_lengths.tolist()),
                                   episodes)
        return (episodes.transcripts if episodes is not None else completions), scores, episodes

    def state(self) -> tuple[int, torch.Tensor]:
        """(problems dealt, the engine's sampling state): what a checkpoint needs to resume the same samples."""
        return self.sampler.position, self.engine.rng_state()

    def restore(self, position: int, rng: torch.Tensor) -> None:
        self.sampler.position = position
        self.engine.set_rng_state(rng)

    def close(self) -> None:
        with self._snapshot_ready:  # a producer waiting for weights that will not come gives up
            self._closing = True
            self._snapshot_ready.notify_all()
        if self._producer is not None:
            self._producer.shutdown(wait=True, cancel_futures=True)
        for copy in self._snapshots.values():  # after an error: copies the engine never took
            copy.release()
        self._snapshots.clear()
        if self.episodes is not None:
            self.episodes.runner.close()

    def _submit(self) -> None:
        self._queue.append(self._producer.submit(self._collect_batch, self._next_batch))
        self._next_batch += 1

    def _collect_batch(self, step: int) -> ScoredGroups:
        """In the producer thread: the weights this step's batch is due (loaded first when newer), then the batch."""
        due = step - 1 - self.ahead
        if due > self.engine_version:
            with self._snapshot_ready:
                self._snapshot_ready.wait_for(lambda: due in self._snapshots or self._closing)
                if self._closing:
                    raise RuntimeError("the run is closing")
                snapshot = self._snapshots[due]
            snapshot.load_into(self.engine)
            self._engine_holds(due)
        return self._collect(step, self.engine_version)

    def _staleness_histogram(self, groups: ScoredGroups) -> list[float]:
        """[k + 1] share of the batch's sampled tokens 0..k versions old now (more is dropped before)."""
        if not self.max_staleness or groups.num_groups == 0:
            return []
        sampled = groups.rollout.model_mask.bool()
        if groups.rollout.versions is None:
            ages = torch.full((int(sampled.sum()),), groups.staleness)
        else:
            ages = self.learner_version - groups.rollout.versions[sampled]
        counts = torch.bincount(ages.clamp(0, self.max_staleness), minlength=self.max_staleness + 1)
        return (counts.float() / max(1, ages.numel())).tolist()

    def _engine_holds(self, version: int) -> None:
        self.engine_version = version
        with self._snapshot_ready:  # copies the engine is past are dropped
            for old in [v for v in self._snapshots if v <= version]:
                self._snapshots.pop(old).release()

    def _collect(self, step: int, weights_version: int) -> ScoredGroups:
        if self.partial is not None:
            return self._collect_partial(step, weights_version)
        group_size = self.sampling.n
        kept: list[ScoredGroups] = []
        kept_groups = dropped = errors = 0
        generate_seconds = reward_seconds = 0.0
        generated: list[torch.Tensor] = []  # every response's task reward, kept or not
        for rounds in range(1, self.rounds + 1):
            problems = self.sampler.next(self.prompts_per_step)
            t = time.perf_counter()
            rollout, completions, episodes = self._generate(problems, self.sampling)
            generate_seconds += time.perf_counter() - t

            t = time.perf_counter()
            scores, rewards = self._score(problems, completions, rollout, episodes)
            errors += scores.errors
            generated.append(scores.total)
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
                            weights_version=weights_version, generated_reward_mean=torch.cat(generated).mean().item())

    def _collect_partial(self, step: int, weights_version: int) -> ScoredGroups:
        """Step `step`'s batch from the pool of partial rollouts (drained when a checkpoint follows the step).
        With dynamic sampling, finished groups whose task rewards are all equal are dropped and the pool is
        topped up again, for up to max_sampling_rounds collections."""
        drain = self.sync_point(step)
        kept: list[ScoredGroups] = []
        kept_groups = dropped = stale = carried = passes = errors = 0
        generate_seconds = reward_seconds = 0.0
        generated: list[torch.Tensor] = []  # every finished response's task reward, kept or not
        for rounds in range(1, self.rounds + 1):
            t = time.perf_counter()
            part = self.partial.collect(self.sampler, self.prompts_per_step - kept_groups, step, weights_version,
                                        oldest_allowed=step - 1 - self.max_staleness, drain=drain)
            generate_seconds += time.perf_counter() - t
            stale, passes = stale + part.stale_dropped, passes + part.passes
            t = time.perf_counter()
            rollout = part.rollout
            completions = part.completions if part.completions is not None else self.decode(rollout.response_ids)
            scores, rewards = self._score(part.problems, completions, rollout, part.episodes)
            reward_seconds += time.perf_counter() - t
            errors += scores.errors
            generated.append(scores.total)
            keep = torch.ones(len(part.problems), dtype=torch.bool)
            if self.dynamic_sampling:
                keep = mixed_groups(scores.total, self.sampling.n)
            dropped += int((~keep).sum())
            carried += sum(c for c, k in zip(part.carried, keep) if k)
            rows = keep.repeat_interleave(self.sampling.n)
            kept.append(ScoredGroups([p for p, k in zip(part.problems, keep) if k], rollout.select(rows),
                                     _select(scores, rows), rewards[rows],
                                     episodes=None if part.episodes is None else part.episodes.select(rows)))
            kept_groups += int(keep.sum())
            if kept_groups >= self.prompts_per_step:
                break
        rollout = Rollout.concat([part.rollout for part in kept], self.pad_id)
        sampled = rollout.model_mask.bool()
        scores = Scores(total=torch.cat([part.scores.total for part in kept]),
                        correct=torch.cat([part.scores.correct for part in kept]),
                        parts={k: torch.cat([part.scores.parts[k] for part in kept]) for k in kept[0].scores.parts},
                        errors=errors)
        episodes = None
        if self.episodes is not None:
            episodes = EpisodeStats.concat([part.episodes for part in kept])
        return ScoredGroups(problems=[p for part in kept for p in part.problems], rollout=rollout, scores=scores,
                            rewards=torch.cat([part.rewards for part in kept]), episodes=episodes, rounds=rounds,
                            dropped_groups=dropped,
                            generate_seconds=generate_seconds, reward_seconds=reward_seconds,
                            weights_version=int(rollout.versions[sampled].min()) if sampled.any() else weights_version,
                            stale_dropped=stale, carried_groups=carried, passes=passes,
                            generated_reward_mean=torch.cat(generated).mean().item())

    def _score(self, problems: list[Problem], completions: list[str], rollout: Rollout,
               episodes: EpisodeStats | None) -> tuple[Scores, torch.Tensor]:
        """(the reward functions' and environment's scores, [N] the rewards advantages come from: the scores'
        total plus overlong shaping) for the group_size responses to each problem."""
        per_response = [p for p in problems for _ in range(self.sampling.n)]
        scores = _with_env_rewards(self.score(per_response, completions, rollout.response_lengths.tolist()), episodes)
        rewards = scores.total
        if self.overlong is not None:
            rewards = rewards + overlong_penalty(rollout.response_lengths, self.overlong.max_len,
                                                 self.overlong.buffer, self.overlong.penalty)
        return scores, rewards

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
