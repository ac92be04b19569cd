"""Multi-turn episodes, token in, token out: every live episode of the batch generates its next turn in one
engine call, the turns' tool calls run at once (rlft.envs.tools), and each episode's sequence grows by the
ids the engine sampled (trained on: sampled_mask 1, the engine's log-probs kept) and the ids of the
environment's observation (context only: sampled_mask 0). Nothing the model generated is decoded and
encoded again; its text is decoded only to parse tool calls and to score the final answer.

An episode ends when the environment says done, or is cut: after env.max_turns turns ("turns"), when its
tokens after the prompt would pass env.max_tokens ("tokens"; a turn that reaches it is cut there, exactly
as the engine sampled it), or when one of its tool calls times out ("tool_timeout").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from rlft.envs.base import Environment, Observation, Turn
from rlft.envs.chat import EpisodeTokenizer
from rlft.envs.parsers import Parser
from rlft.envs.tools import Tool, ToolRunner
from rlft.rollout.batching import left_pad, right_pad
from rlft.types import EpisodeStats, Problem, Rollout, RolloutEngine, SamplingParams


@dataclass
class Episode:
    env: Environment
    prompt: list[int]
    ids: list[int] = field(default_factory=list)        # after the prompt: sampled and observation ids
    sampled: list[int] = field(default_factory=list)    # 1 where the engine sampled the id
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)   # per id: the weights version of the pass that added it
    turn_start: int = 0                                 # where the current model turn begins in ids
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0
    final_text: str = ""                                # the last model turn's text: what reward functions score
    transcript: list[str] = field(default_factory=list)
    tool_outputs: list[str] = field(default_factory=list)  # of the calls that succeeded
    cut: str | None = None                              # None while live; then done | turns | tokens | tool_timeout

    @property
    def done(self) -> bool:
        return self.cut is not None


@dataclass
class Episodes:
    rollout: Rollout            # [N, ...] one row per episode, the n episodes of a problem adjacent
    completions: list[str]      # [N] the final turn's text
    stats: EpisodeStats


class EpisodeRunner:
    def __init__(self, engine: RolloutEngine, make_env: Callable[[], Environment], chat: EpisodeTokenizer,
                 parse: Parser, tools: list[Tool], runner: ToolRunner, tokenizer, *, max_turns: int,
                 max_tokens: int, max_turn_tokens: int | None = None):
        self.engine, self.make_env, self.chat, self.parse = engine, make_env, chat, parse
        self.tools, self.runner, self.tokenizer = tools, runner, tokenizer
        self.max_turns, self.max_tokens, self.max_turn_tokens = max_turns, max_tokens, max_turn_tokens
        self.pad_id = tokenizer.pad_token_id

    def run(self, problems: list[Problem], params: SamplingParams) -> Episodes:
        """params.n episodes per problem (params.max_new_tokens is not used: each turn may take what its
        episode has left of max_tokens, up to max_turn_tokens)."""
        episodes = [episode for problem in problems for episode in self.start(problem, params.n)]
        tool_seconds = 0.0
        live = list(episodes)
        while live:
            tool_seconds += self.advance(live, params)
            live = [episode for episode in live if not episode.done]
        return self.assemble(episodes, tool_seconds)

    def start(self, problem: Problem, n: int) -> list[Episode]:
        """n new episodes of `problem`, before their first turn."""
        episodes = []
        for _ in range(n):
            env = self.make_env()
            episodes.append(Episode(env, self.chat.prompt_ids(env.reset(problem))))
        return episodes

    def advance(self, live: list[Episode], params: SamplingParams, version: int = 0,
                chunk_tokens: int | None = None) -> float:
        """One engine call for every live episode: its current turn goes on by up to `chunk_tokens` tokens
        (None: to the turn's end). Turns that end run their tool calls, all at once, and take their
        observations; episodes that end are cut. Partial rollouts (rlft.rollout.partial) call it with a chunk
        and the engine's weights version, which every id it adds keeps. Seconds spent waiting for tools."""
        turns = self._generate(live, params, version, chunk_tokens)
        ended = [(episode, turn) for episode, turn in zip(live, turns) if turn is not None]
        calls = [(episode, call) for episode, turn in ended for call in turn.tool_calls]
        started = time.perf_counter()
        results = self.runner.run([call for _, call in calls]) if calls else []
        tool_seconds = time.perf_counter() - started if calls else 0.0
        for episode, turn in ended:
            mine = [r for (owner, _), r in zip(calls, results) if owner is episode]
            self._observe(episode, turn, mine, version)
        return tool_seconds

    def _turn_room(self, episode: Episode) -> int:
        """Tokens the episode's current turn may still take: what is left of max_tokens and of max_turn_tokens."""
        room = self.max_tokens - len(episode.ids)
        if self.max_turn_tokens is not None:
            room = min(room, self.max_turn_tokens - (len(episode.ids) - episode.turn_start))
        return room

    def _generate(self, live: list[Episode], params: SamplingParams, version: int,
                  chunk_tokens: int | None) -> list[Turn | None]:
        """The next tokens of every live episode's turn, in one engine call: per episode its Turn once the
        turn has ended (closed by the model or cut at its budget), None while it goes on."""
        rooms = [self._turn_room(e) for e in live]
        budget = max(rooms) if chunk_tokens is None else min(chunk_tokens, max(rooms))
        rollout = self.engine.generate([e.prompt + e.ids for e in live],
                                       SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p,
                                                      max_new_tokens=budget))
        turns: list[Turn | None] = []
        for row, (episode, room) in enumerate(zip(live, rooms)):
            length = int(rollout.response_mask[row].sum())
            ids = rollout.response_ids[row, :length].tolist()[:room]
            episode.ids += ids
            episode.sampled += [1] * len(ids)
            episode.logprobs += rollout.logprobs[row, :length].tolist()[:room]
            episode.versions += [version] * len(ids)
            closed = not bool(rollout.truncated[row]) and length <= room  # the model closed its turn itself
            # stopped by the chunk with room left: the turn goes on in the next pass. Anything else that stops
            # a turn short (the engine's own context limit) cuts it, as the whole turn's budget does.
            if not closed and chunk_tokens is not None and length >= budget and len(ids) < room:
                turns.append(None)
                continue
            turns.append(self._end_turn(episode, closed))
        return turns

    def _end_turn(self, episode: Episode, closed: bool) -> Turn:
        """The turn that ends here, whole: its text and, when the model closed it, its parsed tool calls."""
        ids = episode.ids[episode.turn_start:]
        episode.turns += 1
        raw = self.tokenizer.decode(ids[:-1] if closed else ids, skip_special_tokens=False)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        episode.final_text = text
        episode.transcript.append(self.tokenizer.decode(ids, skip_special_tokens=False))
        if not closed:
            episode.cut = "tokens"  # out of room for this turn (max_tokens or max_turn_tokens)
            return Turn(text, index=episode.turns - 1)
        calls, errors = self.parse(raw, self.tools)
        episode.tool_calls += len(calls)
        episode.tool_errors += len(errors)
        return Turn(text, calls, errors, index=episode.turns - 1)

    def _observe(self, episode: Episode, turn: Turn, results, version: int) -> None:
        if episode.cut is not None:  # cut while generating: no observation
            return
        episode.tool_errors += sum(r.error for r in results)
        episode.tool_outputs += [r.output.strip() for r in results if not r.error]
        if any(r.timed_out for r in results):
            episode.cut = "tool_timeout"
            return
        observation: Observation = episode.env.step(turn, results)
        episode.reward += float(observation.reward)
        if observation.done:
            episode.cut = "done"
            return
        if episode.turns >= self.max_turns:
            episode.cut = "turns"
            return
        stop_text = self.tokenizer.decode(episode.ids[-1:], skip_special_tokens=False)
        ids = self.chat.observation_ids(observation.messages, stop_text)
        if len(episode.ids) + len(ids) >= self.max_tokens:  # no room left for the model to answer
            episode.cut = "tokens"
            return
        episode.ids += ids
        episode.sampled += [0] * len(ids)
        episode.logprobs += [0.0] * len(ids)
        episode.versions += [version] * len(ids)
        episode.turn_start = len(episode.ids)
        episode.transcript.append(self.tokenizer.decode(ids, skip_special_tokens=False))

    def assemble(self, episodes: list[Episode], tool_seconds: float, versions: bool = False) -> Episodes:
        """The finished episodes as one rollout (with each id's weights version when `versions`), their final
        texts and stats."""
        prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], self.pad_id)
        response_ids, response_mask = right_pad([e.ids for e in episodes], self.pad_id, torch.long)
        sampled, _ = right_pad([e.sampled for e in episodes], 0, torch.long)
        logprobs, _ = right_pad([e.logprobs for e in episodes], 0.0, torch.float32)
        rollout = Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                          response_mask=response_mask, logprobs=logprobs,
                          truncated=torch.tensor([e.cut != "done" for e in episodes]), sampled_mask=sampled,
                          versions=right_pad([e.versions for e in episodes], 0, torch.long)[0] if versions else None)
        long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
        stats = EpisodeStats(
            turns=long([e.turns for e in episodes]), tool_calls=long([e.tool_calls for e in episodes]),
            tool_errors=long([e.tool_errors for e in episodes]),
            observation_tokens=long([len(e.sampled) - sum(e.sampled) for e in episodes]),
            cut=[e.cut for e in episodes], env_rewards=torch.tensor([e.reward for e in episodes]),
            answer_from_tool=torch.tensor([bool(e.final_text.strip()) and e.final_text.strip() in e.tool_outputs
                                           for e in episodes]),
            tool_seconds=tool_seconds, transcripts=["".join(e.transcript) for e in episodes])
        return Episodes(rollout, [e.final_text for e in episodes], stats)
