from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; reward functions compare completions to `answer`, and get
    the row's other fields (`fields`: test code, task metadata, ...) as keyword arguments."""

    prompt: str
    answer: str
    fields: dict[str, Any] = field(default_factory=dict, compare=False)
