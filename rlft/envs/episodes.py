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
class _Episode:
    env: Environment
    prompt: list[int]
    ids: list[int] = field(default_factory=list)        # after the prompt: sampled and observation ids
    sampled: list[int] = field(default_factory=list)    # 1 where the engine sampled the id
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0
    final_text: str = ""                                # the last model turn's text: what reward functions score
    transcript: list[str] = field(default_factory=list)
    tool_outputs: list[str] = field(default_factory=list)  # of the calls that succeeded
    cut: str | None = None                              # None while live; then done | turns | tokens | tool_timeout


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
        episodes = []
        for problem in problems:
            for _ in range(params.n):
                env = self.make_env()
                episodes.append(_Episode(env, self.chat.prompt_ids(env.reset(problem))))
        tool_seconds = 0.0
        live = list(episodes)
        while live:
            turns = self._generate(live, params)
            calls = [(episode, call) for episode, turn in zip(live, turns) for call in turn.tool_calls]
            started = time.perf_counter()
            results = self.runner.run([call for _, call in calls]) if calls else []
            tool_seconds += time.perf_counter() - started if calls else 0.0
            for episode, turn in zip(live, turns):
                mine = [r for (owner, _), r in zip(calls, results) if owner is episode]
                self._observe(episode, turn, mine)
            live = [episode for episode in live if episode.cut is None]
        return self._assemble(episodes, tool_seconds)

    def _generate(self, live: list[_Episode], params: SamplingParams) -> list[Turn]:
        """One turn of every live episode, in one engine call."""
        room = max(self.max_tokens - len(e.ids) for e in live)
        rollout = self.engine.generate([e.prompt + e.ids for e in live],
                                       SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p,
                                                      max_new_tokens=min(room, self.max_turn_tokens or room)))
        turns = []
        for row, episode in enumerate(live):
            length = int(rollout.response_mask[row].sum())
            ids = rollout.response_ids[row, :length].tolist()
            logprobs = rollout.logprobs[row, :length].tolist()
            room = self.max_tokens - len(episode.ids)
            ended = not bool(rollout.truncated[row]) and length <= room  # the model closed its turn itself
            ids, logprobs = ids[:room], logprobs[:room]
            episode.ids += ids
            episode.sampled += [1] * len(ids)
            episode.logprobs += logprobs
            episode.turns += 1
            raw = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            episode.final_text = text
            episode.transcript.append(self.tokenizer.decode(ids, skip_special_tokens=False))
            if not ended:
                episode.cut = "tokens"  # out of room for this turn (or the turn's own max_new_tokens)
                turns.append(Turn(text, index=episode.turns - 1))
                continue
            calls, errors = self.parse(raw, self.tools)
            episode.tool_calls += len(calls)
            episode.tool_errors += len(errors)
            turns.append(Turn(text, calls, errors, index=episode.turns - 1))
        return turns

    def _observe(self, episode: _Episode, turn: Turn, results) -> None:
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
        episode.transcript.append(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _assemble(self, episodes: list[_Episode], tool_seconds: float) -> Episodes:
        prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], self.pad_id)
        response_ids, response_mask = right_pad([e.ids for e in episodes], self.pad_id, torch.long)
        sampled, _ = right_pad([e.sampled for e in episodes], 0, torch.long)
        logprobs, _ = right_pad([e.logprobs for e in episodes], 0.0, torch.float32)
        rollout = Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                          response_mask=response_mask, logprobs=logprobs,
                          truncated=torch.tensor([e.cut != "done" for e in episodes]), sampled_mask=sampled)
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
