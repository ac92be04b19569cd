"""`env`: multi-turn episodes with tools (rlft.envs). `none` (the default) is one response per prompt;
every other option is an environment with its tools, budgets and the tool-call format."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Optional

from omegaconf import MISSING

from rlft.config.checks import at_least, positive
from rlft.errors import ConfigError


class ToolFormat(StrEnum):
    auto = "auto"
    hermes = "hermes"
    tiny = "tiny"


@dataclass
class NoEnv:
    multi_turn: ClassVar[bool] = False


@dataclass
class EnvConfig:
    multi_turn: ClassVar[bool] = True
    environment: str = MISSING
    """A built-in environment (calculator, python, code_repair) or module:Class, a user's (README: environments)."""
    tools: list[str] = field(default_factory=list)
    """Tools besides the environment's own: built-in names (calculator, python) or module:function."""
    max_turns: int = 4
    """Model turns per episode; an episode still calling tools after them is cut."""
    max_tokens: int = 256
    """Tokens after the prompt per episode, the model's and the observations'; an episode is cut at it."""
    max_turn_tokens: Optional[int] = None
    """Tokens per model turn; null = as many as the episode has left (rollout.max_new_tokens is not used)."""
    tool_timeout_s: float = 10.0
    """Seconds per tool call; an episode whose call takes longer is cut there, the rest of the batch goes on."""
    system_prompt: Optional[str] = None
    """A system message before the problem (a ToolEnv's own, e.g. how to call the tools); null = the env's."""
    tool_format: ToolFormat = ToolFormat.auto
    """How the model writes tool calls: hermes (<tool_call>{json}</tool_call>), tiny (<call>...</call>, the
    built-in tool model), or auto (from the tokenizer)."""


def check(cfg) -> None:
    e = cfg.env
    if not e.multi_turn:
        return
    at_least("env.max_turns", e.max_turns, 1)
    at_least("env.max_tokens", e.max_tokens, 2)
    positive("env.tool_timeout_s", e.tool_timeout_s)
    if e.max_turn_tokens is not None:
        at_least("env.max_turn_tokens", e.max_turn_tokens, 1)
    if not str(e.environment).strip():
        raise ConfigError("env.environment is empty: name a built-in environment or module:Class")
    if cfg.algo.routing_source == "rollout":
        raise ConfigError("algo.routing_replay=rollout (R3, the engine's routes) does not take multi-turn episodes "
                          "(env): use algo.routing_replay=learner (R2)")


def response_budget(cfg) -> int:
    """The most tokens after a prompt: an episode's env.max_tokens, else rollout.max_new_tokens."""
    return cfg.env.max_tokens if cfg.env.multi_turn else cfg.rollout.max_new_tokens


def response_budget_key(cfg) -> str:
    return "env.max_tokens" if cfg.env.multi_turn else "rollout.max_new_tokens"
