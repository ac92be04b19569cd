"""Range checks shared by the groups' validation: each raises one ConfigError naming the key. Written as
`not (value >= low)` so that NaN, which passes every `value < low`, fails them too."""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass

from rlft.errors import ConfigError


def at_least(key: str, value: int | float, low: int | float) -> None:
    if not value >= low or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{key} must be >= {low} (got {value})")


def positive(key: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key} must be a finite number > 0 (got {value})")


def within(key: str, value: float, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):
        raise ConfigError(f"{key} must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'} "
                          f"(got {value})")


def finite(key: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number (got {value})")


def every_number_finite(cfg, prefix: str = "") -> None:
    """No key anywhere in the config holds NaN or an infinity (lists and mappings included): a range check
    alone lets NaN through, and no rlft key means anything by an infinite value (null is "off")."""
    items = ([(f.name, getattr(cfg, f.name)) for f in fields(cfg)] if is_dataclass(cfg)
             else cfg.items() if isinstance(cfg, dict) else enumerate(cfg))
    for name, value in items:
        key = f"{prefix}[{name}]" if isinstance(name, int) else f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number (got {value})")
        if is_dataclass(value) or isinstance(value, (dict, list, tuple)):
            every_number_finite(value, key)
