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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from rlft.data.sampler import PromptSampler
from rlft.rollout.batching import left_pad, right_pad
from rlft.types import Problem, Rollout, RolloutEngine, SamplingParams


@dataclass
class _Sequence:
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per response token: the weights version that sampled it
    done: bool = False
    truncated: bool = False  # reached max_new_tokens without EOS


@dataclass
class _Group:
    problem: Problem
    sequences: list[_Sequence]   # [G]
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
    carried: list[bool]         # per group: begun in an earlier step's collection
    stale_dropped: int          # groups dropped: their oldest token was more than k versions old
    passes: int                 # engine passes this collection ran

    @property
    def carried_groups(self) -> int:
        return sum(self.carried)


class PartialRollouts:
    """The pool of groups in flight between collections. One collection at a time (the producer's thread)."""

    def __init__(self, engine: RolloutEngine, encode: Callable[[str], list[int]], sampling: SamplingParams,
                 chunk_tokens: int, pad_id: int):
        self.engine, self.encode, self.sampling, self.pad_id = engine, encode, sampling, pad_id
        self.chunk_tokens = chunk_tokens
        self.in_flight: list[_Group] = []
        self.finished: list[_Group] = []  # done, beyond an earlier step's share

    def collect(self, sampler: PromptSampler, groups_wanted: int, step: int, version: int, oldest_allowed: int,
                drain: bool) -> PartialBatch:
        """Step `step`'s groups, generated with the engine's weights `version`; groups with a token older
        than `oldest_allowed` are dropped. `drain`: finish every group in flight and return them all."""
        stale = [g for g in self.in_flight + self.finished if g.oldest_version < oldest_allowed]
        self.in_flight = [g for g in self.in_flight if g not in stale]
        self.finished = [g for g in self.finished if g not in stale]
        passes = 0
        while len(self.finished) < groups_wanted or (drain and self.in_flight):
            if len(self.finished) < groups_wanted:  # top up (not when only draining)
                missing = groups_wanted - len(self.in_flight)
                if missing > 0:
                    self.in_flight += [_Group(p, [_Sequence(self.encode(p.prompt)) for _ in range(self.sampling.n)],
                                              step) for p in sampler.next(missing)]
            self._pass(version)
            passes += 1
            self.finished += [g for g in self.in_flight if g.done]
            self.in_flight = [g for g in self.in_flight if not g.done]
        share = len(self.finished) if drain else groups_wanted
        batch, self.finished = self.finished[:share], self.finished[share:]
        return PartialBatch(problems=[g.problem for g in batch], rollout=self._rollout(batch),
                            carried=[g.first_collection < step for g in batch],
                            stale_dropped=len(stale), passes=passes)

    def _pass(self, version: int) -> None:
        """Up to chunk_tokens more tokens for every unfinished sequence in flight, in one engine call."""
        live = [s for g in self.in_flight for s in g.sequences if not s.done]
        limit = self.sampling.max_new_tokens
        budget = min(self.chunk_tokens, max(limit - len(s.response) for s in live))
        params = SamplingParams(n=1, temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                                max_new_tokens=budget)
        out = self.engine.generate([s.prompt + s.response for s in live], params)
        lengths = out.response_mask.sum(-1).tolist()
        for row, seq in enumerate(live):
            room = limit - len(seq.response)
            n = min(lengths[row], room)
            seq.response += out.response_ids[row, :n].tolist()
            seq.logprobs += out.logprobs[row, :n].tolist()
            seq.versions += [version] * n
            if not out.truncated[row] and lengths[row] <= room:  # ended by EOS within its budget
                seq.done = True
            elif len(seq.response) >= limit:
                seq.done = seq.truncated = True

    def _rollout(self, groups: list[_Group]) -> Rollout:
        sequences = [s for g in groups for s in g.sequences]
        prompt_ids, prompt_mask = left_pad([s.prompt for s in sequences], self.pad_id)
        response_ids, response_mask = right_pad([s.response for s in sequences], self.pad_id, torch.long)
        logprobs, _ = right_pad([s.logprobs for s in sequences], 0.0, torch.float32)
        versions, _ = right_pad([s.versions for s in sequences], 0, torch.long)
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                       response_mask=response_mask, logprobs=logprobs,
                       truncated=torch.tensor([s.truncated for s in sequences], dtype=torch.bool), versions=versions)
