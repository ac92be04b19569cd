"""Multi-turn environments and tools (`env` config group): the model acts over several turns, calls tools
and reads their results; rlft trains on exactly the tokens it sampled (rlft.envs.episodes).

    base       the Environment protocol and the records of a turn (a user environment implements it)
    tools      tools as plain functions, their schemas, the runner that executes a turn's calls
    parsers    tool-call formats (hermes, tiny)
    chat       the ids of prompts and observations, from the chat template, never re-rendering a model turn
    episodes   the runner: all live episodes of a step per engine call, token in, token out
    builtin    calculator, python, code_repair
    openenv    an OpenEnv (openenv-core) environment as an rlft one
"""

from __future__ import annotations

from functools import partial

from rlft.envs.base import Environment, Observation, ToolCall, ToolEnv, ToolResult, Turn
from rlft.envs.chat import EpisodeTokenizer
from rlft.envs.episodes import EpisodeRunner, Episodes
from rlft.envs.parsers import PARSERS, pick_format
from rlft.envs.tools import ToolRunner, resolve_tools
from rlft.errors import ConfigError
from rlft.registry import import_function


def environment_class(name: str) -> type:
    """A built-in environment's name, or `module:Class` (any callable returning an Environment)."""
    if ":" in name:
        return import_function(name, "environment")
    from rlft.envs.builtin import ENVIRONMENTS
    return ENVIRONMENTS.get(name)


class EpisodeSetup:
    """What a run's `env` config resolves to, checked at start-up (preflight) and built into a runner once the
    engine exists."""

    def __init__(self, cfg, tokenizer):
        self.cfg = cfg
        self.env_class = environment_class(cfg.environment)
        check_environment(self.env_class, cfg.environment)
        if getattr(cfg, "system_prompt", None) is not None and not hasattr(self.env_class, "system_prompt"):
            raise ConfigError(f"env.system_prompt: environment {cfg.environment} has no system prompt to set "
                              "(a ToolEnv has one)")
        declared = getattr(self.env_class, "tools", None) or []
        names = list(cfg.tools) + [t for t in _tool_names(declared) if t not in cfg.tools]
        self.tools = resolve_tools([n for n in names if isinstance(n, str)]) + _function_tools(declared)
        named = [t.name for t in self.tools]
        if len(set(named)) != len(named):
            raise ConfigError(f"env.tools: a tool of that name is the environment's own already (tools: {named})")
        self.format = pick_format(str(cfg.tool_format), tokenizer)
        self.chat = EpisodeTokenizer(tokenizer, [t.schema for t in self.tools], self.format)
        self.chat.check()
        self.tokenizer = tokenizer

    def runner(self, engine) -> EpisodeRunner:
        settings = {}
        if hasattr(self.env_class, "timeout_s"):  # environments that run code themselves use the tool deadline
            settings["timeout_s"] = self.cfg.tool_timeout_s
        if getattr(self.cfg, "system_prompt", None) is not None:
            settings["system_prompt"] = self.cfg.system_prompt
        make_env = partial(_configured, self.env_class, settings) if settings else self.env_class
        return EpisodeRunner(engine, make_env, self.chat, PARSERS.get(self.format), self.tools,
                             ToolRunner(self.tools, self.cfg.tool_timeout_s), self.tokenizer,
                             max_turns=self.cfg.max_turns, max_tokens=self.cfg.max_tokens,
                             max_turn_tokens=self.cfg.max_turn_tokens)


def check_environment(env_class, name: str) -> None:
    """At start-up: the class makes an instance with reset and step (an episode makes one each)."""
    try:
        probe = env_class()
    except Exception as err:
        raise ConfigError(f"env.environment={name}: making an instance failed: {type(err).__name__}: {err}") from None
    missing = [method for method in ("reset", "step") if not callable(getattr(probe, method, None))]
    if missing:
        raise ConfigError(f"env.environment={name} is not an environment: it has no {' or '.join(missing)} method "
                          "(README: multi-turn episodes)")


def _configured(env_class, settings: dict):
    env = env_class()
    for key, value in settings.items():
        setattr(env, key, value)
    return env


def _tool_names(declared) -> list[str]:
    return [t for t in declared if isinstance(t, str)]


def _function_tools(declared):
    """Tools an environment lists as functions: rlft's own (trusted) run in this process; a user's run in the
    worker pool by their import path (a function that has none, one defined inside another, runs here)."""
    from rlft.envs.tools import TOOLS, Tool, tool_schema
    builtin = {id(TOOLS.get(name)) for name in TOOLS.names()}
    out = []
    for fn in declared:
        if isinstance(fn, str):
            continue
        if not callable(fn):
            raise ConfigError(f"environment tools must be functions or names (got {fn!r:.80})")
        importable = fn.__module__ not in ("__main__", None) and "<locals>" not in fn.__qualname__
        path = None if id(fn) in builtin or not importable else f"{fn.__module__}:{fn.__qualname__}"
        out.append(Tool(fn.__name__, None if path else fn, path, tool_schema(fn)))
    return out


__all__ = ["Environment", "EpisodeRunner", "EpisodeSetup", "Episodes", "Observation", "ToolCall", "ToolEnv",
           "ToolResult", "Turn", "environment_class"]
