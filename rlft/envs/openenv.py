"""An adapter for OpenEnv environments (PyPI `openenv-core`, Meta's Gym-style environment standard): an
OpenEnv `Environment` runs in this process, one instance per episode, as an rlft environment.

    # myenv.py
    from rlft.envs.openenv import from_openenv
    from mypackage.server import EchoEnvironment, EchoAction
    Echo = from_openenv(EchoEnvironment, EchoAction)      # the model's turn text -> EchoAction's text field

    rlft train env=custom env.environment=myenv:Echo ...

The problem's prompt (with the environment's first observation, when it has content) is the user's first
message; each model turn becomes an Action (its one str field, or `to_action(text)`), and the Observation
that comes back is the next user message (its fields other than done, reward and metadata, or `to_text`),
with its reward and done. rlft needs only OpenEnv's reset/step protocol, so `openenv-core` is not a
dependency of rlft; install it to use an OpenEnv environment.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from rlft.envs.base import Observation, ToolResult, Turn
from rlft.types import Problem

SKIPPED = ("done", "reward", "metadata")


def from_openenv(env_class: Callable[[], Any], action_class: type | None = None, *,
                 to_action: Callable[[str], Any] | None = None, to_text: Callable[[Any], str] | None = None) -> type:
    """An rlft environment class around an OpenEnv Environment class (or any factory of one)."""
    if to_action is None:
        if action_class is None:
            raise TypeError("from_openenv needs action_class (with one str field) or to_action(text)")
        to_action = _text_action(action_class)

    class OpenEnvAdapter:
        tools = None

        def reset(self, problem: Problem) -> list[dict]:
            self.env = env_class()
            first = self.env.reset()
            text = (to_text or observation_text)(first)
            return [{"role": "user", "content": f"{problem.prompt}\n\n{text}" if text else problem.prompt}]

        def step(self, turn: Turn, results: list[ToolResult]) -> Observation:
            seen = self.env.step(to_action(turn.text))
            reward = float(seen.reward) if getattr(seen, "reward", None) is not None else 0.0
            done = bool(getattr(seen, "done", False))
            text = (to_text or observation_text)(seen)
            return Observation(messages=[] if done else [{"role": "user", "content": text}], reward=reward, done=done)

    OpenEnvAdapter.__name__ = OpenEnvAdapter.__qualname__ = f"OpenEnv{getattr(env_class, '__name__', 'Env')}"
    return OpenEnvAdapter


def observation_text(observation: Any) -> str:
    """The observation's own fields (not done, reward, metadata): one field's text as it is, else JSON."""
    if hasattr(observation, "model_dump"):  # pydantic, as OpenEnv's types are
        fields = observation.model_dump()
    else:
        fields = dict(vars(observation))
    fields = {k: v for k, v in fields.items() if k not in SKIPPED}
    if len(fields) == 1:
        value = next(iter(fields.values()))
        return value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(fields, default=str)


def _text_action(action_class: type) -> Callable[[str], Any]:
    fields = getattr(action_class, "model_fields", None)
    names = [n for n, f in (fields or {}).items() if n not in SKIPPED and f.annotation is str]
    if len(names) != 1:
        raise TypeError(f"{action_class.__name__} needs exactly one str field for the model's text (it has "
                        f"{names or 'none'}); pass to_action(text) instead")
    return lambda text: action_class(**{names[0]: text})
