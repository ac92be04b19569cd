"""A name -> object registry that refuses duplicates and names the choices when a lookup fails.

Losses, KL estimators, aggregations and advantage estimators (rlft.algos) and reward functions
(rlft.rewards) are registered by name; the config's choices for them are the registered names
(`Registry.choices()`), so validation and `rlft train --help KEY` read them from one place.
"""

from __future__ import annotations

import importlib
import os
import sys
from enum import StrEnum
from typing import Callable, Generic, TypeVar

from rlft.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, **attributes) -> Callable[[T], T]:
        """Decorator; `attributes` are set on the registered object (what callers need to know of it)."""
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            for key, value in attributes.items():
                setattr(obj, key, value)
            self._entries[name] = obj
            return obj
        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} '{name}' (available: {', '.join(sorted(self._entries))})")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        """In registration order (the order a reader meets them in the code)."""
        return list(self._entries)

    def choices(self, enum_name: str, module: str) -> type[StrEnum]:
        """A str Enum of the names registered so far: the type of the config key that picks one (defined in
        `module`, under which its members pickle)."""
        return StrEnum(enum_name, {name: name for name in self._entries}, module=module)


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
    except SyntaxError as err:  # the user's file and line, as Python would point at them
        raise ConfigError(f"{key} '{path}': {err.filename}:{err.lineno}: {type(err).__name__}: {err.msg}") from None
    except (Exception, SystemExit) as err:  # the module raised (or called sys.exit) while it was imported
        where = _innermost_frame(err)
        raise ConfigError(f"{key} '{path}': importing '{module_name}' raised {type(err).__name__}: {err}"
                          f"{f' ({where})' if where else ''}") from None
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ConfigError(f"{key} '{path}': module '{module_name}' has no function '{attribute}' (use module:function)")
    return fn


def _innermost_frame(err: BaseException) -> str:
    """file:line where an exception was raised."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
