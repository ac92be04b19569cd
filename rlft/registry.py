"""A name -> object registry that refuses duplicates and names the choices when a lookup fails."""

from __future__ import annotations

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
