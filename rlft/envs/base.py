"""What an environment is to rlft: the records of a turn and the small protocol a user implements.

    env = Env(**settings)                        one instance per episode (it may keep state)
    messages = env.reset(problem)                the first chat messages (usually the user's prompt)
    observation = env.step(turn, results)        after each model turn: messages to append, reward, done

A turn is what the model sampled, decoded (`text`), with the tool calls parsed from it; `results` are those
calls' outcomes, already run by rlft (concurrently across the batch, with timeouts: rlft.envs.tools), so
`step` stays cheap and never blocks the batch. The episode's tokens are never rebuilt from these messages:
rlft appends the sampled ids and the tokenised observations (rlft.envs.episodes), token in, token out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rlft.types import Problem

Message = dict[str, Any]  # a chat message: {"role": "user" | "tool" | "system" | ..., "content": str, ...}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    output: str                 # what the model reads back (an error's text when `error`)
    error: bool = False         # unknown tool, bad arguments, raised, or timed out
    timed_out: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Turn:
    text: str                                 # the model's turn, decoded (special tokens dropped)
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)  # tool calls it wrote that do not parse
    index: int = 0                            # 0 for the first turn


@dataclass(frozen=True)
class Observation:
    messages: list[Message] = field(default_factory=list)  # appended to the conversation (not trained on)
    reward: float = 0.0        # this turn's reward; an episode's rewards are summed (undiscounted)
    done: bool = False


class Environment(Protocol):
    """A user environment: `tools` are plain Python functions (their signature and Google-style docstring
    become the schema the chat template shows the model); rlft runs the calls the model makes."""

    tools: list[Callable] | None

    def reset(self, problem: Problem) -> list[Message]: ...

    def step(self, turn: Turn, results: list[ToolResult]) -> Observation: ...


class ToolEnv:
    """The usual tool-use episode: the user asks `problem.prompt`; each turn with tool calls gets their
    results back as `tool` messages; the first turn without one is the final answer (the reward functions
    score its text). Subclass it and set `tools` (and `system_prompt`) for a tool environment."""

    tools: list[Callable] | None = None
    system_prompt: str | None = None

    def reset(self, problem: Problem) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": problem.prompt}]

    def step(self, turn: Turn, results: list[ToolResult]) -> Observation:
        if not turn.tool_calls and not turn.parse_errors:
            return Observation(done=True)
        messages = [{"role": "tool", "name": r.call.name, "content": r.output} for r in results]
        messages += [{"role": "tool", "content": f"error: {e}"} for e in turn.parse_errors]
        return Observation(messages=messages)
