"""Partial rollouts (rollout.partial_rollouts): responses that do not finish in one step's generation carry
over to the next step and continue, from their token ids, with the newer weights.

The engine generates in passes of at most `chunk_tokens` tokens per sequence over a pool of groups in flight.
A collection tops the pool up to the step's `prompts_per_step` groups before each pass and ends once that many
groups are finished; the others stay in the pool, and groups finished beyond the step's share wait for the
next one. So one long response no longer holds the whole step's generation: the step ends when enough groups
are done, and the long ones go on under the next weights. Every sampled token keeps the version of the
weights that sampled it and the engine's log-prob (the learner's corrections use both); nothing is decoded
and re-encoded. A group whose oldest token is more than k (rollout.max_staleness) versions old when the
learner would take it is dropped and counted. Before a checkpoint the pool is drained (every group in flight
finishes, and they all go into that step's batch), so a checkpoint never holds half-generated responses and
resume is exact.

Multi-turn episodes (an rlft.envs.EpisodeRunner) go through the same pool: a pass advances each live episode's
current turn by up to `chunk_tokens` tokens; a turn that ends runs its tool calls and takes its observation
within the pass, and the episode's next turn starts in a later one. With routing replay from the engine (R3)
each sequence keeps the routes of its latest pass: that pass routed every earlier token again under the newest
weights that touched the sequence, the routes its last tokens were sampled with and the closest to the
learner's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from rlft.data.sampler import PromptSampler
from rlft.rollout.batching import left_pad, place_routes, right_pad
from rlft.types import EpisodeStats, Problem, Rollout, RolloutEngine, SamplingParams


@dataclass
class _Sequence:
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per response token: the weights version that sampled it
    done: bool = False
    truncated: bool = False  # reached max_new_tokens without EOS
    routes: torch.Tensor | None = None  # [fed tokens, layers, k] R3: the experts of each token fed to the engine


@dataclass
class _Group:
    problem: Problem
    sequences: list  # [G] _Sequence, or rlft.envs.episodes.Episode (multi-turn)
    first_collection: int        # the step whose collection started it

    @property
    def done(self) -> bool:
        return all(s.done for s in self.sequences)

    @property
    def oldest_version(self) -> int:
        return min((v for s in self.sequences for v in s.versions), default=1 << 62)


@dataclass
class PartialBatch:
    """A collection's finished groups, as one rollout with per-token versions."""

    problems: list[Problem]     # one per group
    rollout: Rollout            # [N, ...] with versions [N, R]
    completions: list[str] | None  # [N] multi-turn: each episode's final turn's text; None: decode the responses
    episodes: EpisodeStats | None  # multi-turn: what the episodes did
    carried: list[bool]         # per group: begun in an earlier step's collection
    stale_dropped: int          # groups dropped: their oldest token was more than k versions old
    passes: int                 # engine passes this collection ran

    @property
    def carried_groups(self) -> int:
        return sum(self.carried)


class PartialRollouts:
    """The pool of groups in flight between collections. One collection at a time (the producer's thread)."""

    def __init__(self, engine: RolloutEngine, encode: Callable[[str], list[int]], sampling: SamplingParams,
                 chunk_tokens: int, pad_id: int, episodes=None):
        self.engine, self.encode, self.sampling, self.pad_id = engine, encode, sampling, pad_id
        self.chunk_tokens = chunk_tokens
        self.episodes = episodes  # an rlft.envs.EpisodeRunner: multi-turn episodes instead of one response each
        self.tool_seconds = 0.0  # waiting for tools, this collection
        self.in_flight: list[_Group] = []
        self.finished: list[_Group] = []  # done, beyond an earlier step's share

    def collect(self, sampler: PromptSampler, groups_wanted: int, step: int, version: int, oldest_allowed: int,
                drain: bool) -> PartialBatch:
        """Step `step`'s groups, generated with the engine's weights `version`; groups with a token older
        than `oldest_allowed` are dropped. `drain`: finish every group in flight and return them all."""
        stale = [g for g in self.in_flight + self.finished if g.oldest_version < oldest_allowed]
        self.in_flight = [g for g in self.in_flight if g not in stale]
        self.finished = [g for g in self.finished if g not in stale]
        passes, self.tool_seconds = 0, 0.0
        while len(self.finished) < groups_wanted or (drain and self.in_flight):
            if len(self.finished) < groups_wanted:  # top up (not when only draining)
                missing = groups_wanted - len(self.in_flight)
                if missing > 0:
                    self.in_flight += [self._start(problem, step) for problem in sampler.next(missing)]
            self._pass(version)
            passes += 1
            self.finished += [g for g in self.in_flight if g.done]
            self.in_flight = [g for g in self.in_flight if not g.done]
        share = len(self.finished) if drain else groups_wanted
        batch, self.finished = self.finished[:share], self.finished[share:]
        rollout, completions, episodes = self._assemble(batch)
        return PartialBatch(problems=[g.problem for g in batch], rollout=rollout, completions=completions,
                            episodes=episodes, carried=[g.first_collection < step for g in batch],
                            stale_dropped=len(stale), passes=passes)

    def _start(self, problem: Problem, step: int) -> _Group:
        n = self.sampling.n
        if self.episodes is not None:
            return _Group(problem, self.episodes.start(problem, n), step)
        return _Group(problem, [_Sequence(self.encode(problem.prompt)) for _ in range(n)], step)

    def _pass(self, version: int) -> None:
        """Up to chunk_tokens more tokens for every unfinished sequence (or episode's turn) in flight, in one
        engine call."""
        live = [s for g in self.in_flight for s in g.sequences if not s.done]
        if self.episodes is not None:
            self.tool_seconds += self.episodes.advance(live, self.sampling, version, self.chunk_tokens)
            return
        limit = self.sampling.max_new_tokens
        budget = min(self.chunk_tokens, max(limit - len(s.response) for s in live))
        params = SamplingParams(n=1, temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                                max_new_tokens=budget)
        out = self.engine.generate([s.prompt + s.response for s in live], params)
        lengths = out.response_mask.sum(-1).tolist()
        width = out.prompt_ids.shape[1]
        for row, seq in enumerate(live):
            room = limit - len(seq.response)
            n = min(lengths[row], room)
            if out.routes is not None:  # this pass's routes of the whole sequence; the last new token was not fed
                fed = len(seq.prompt) + len(seq.response)
                seq.routes = out.routes[row, width - fed:width + n - 1].clone()
            seq.response += out.response_ids[row, :n].tolist()
            seq.logprobs += out.logprobs[row, :n].tolist()
            seq.versions += [version] * n
            if not out.truncated[row] and lengths[row] <= room:  # ended by EOS within its budget
                seq.done = True
            elif len(seq.response) >= limit or lengths[row] < budget:  # out of room, or cut short by the engine
                seq.done = seq.truncated = True

    def _assemble(self, groups: list[_Group]) -> tuple[Rollout, list[str] | None, EpisodeStats | None]:
        """The groups' rollout; with episodes also their final texts and stats."""
        if self.episodes is not None:
            done = self.episodes.assemble([e for g in groups for e in g.sequences], self.tool_seconds, versions=True)
            return done.rollout, done.completions, done.stats
        return self._rollout(groups), None, None

    def _rollout(self, groups: list[_Group]) -> Rollout:
        sequences = [s for g in groups for s in g.sequences]
        prompt_ids, prompt_mask = left_pad([s.prompt for s in sequences], self.pad_id)
        response_ids, response_mask = right_pad([s.response for s in sequences], self.pad_id, torch.long)
        logprobs, _ = right_pad([s.logprobs for s in sequences], 0.0, torch.float32)
        versions, _ = right_pad([s.versions for s in sequences], 0, torch.long)
        routes = None
        if sequences[0].routes is not None:
            routes = place_routes([s.routes for s in sequences], [len(s.prompt) for s in sequences],
                                  prompt_ids.shape[1], response_ids.shape[1])
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                       response_mask=response_mask, logprobs=logprobs,
                       truncated=torch.tensor([s.truncated for s in sequences], dtype=torch.bool), versions=versions,
                       routes=routes)
