"""A name -> object registry that refuses duplicates and names the choices when a lookup fails."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable, Generic, TypeVar

from rlft.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = obj
            return obj
        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} '{name}' (available: {', '.join(sorted(self._entries))})")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)


def import_function(path: str, key: str) -> Callable:
    """The function at `module.path:name` (the user's own code, named in the config under `key`); the
    working directory is searched too, as `python -m` would. ConfigError naming what is wrong."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"{key} '{path}': cannot import module '{module_name}' ({err})") from None
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ConfigError(f"{key} '{path}': module '{module_name}' has no function '{attribute}' (use module:function)")
    return fn
