"""Prompt/answer rows from a JSONL file, one JSON object per line."""

from __future__ import annotations

import json
from pathlib import Path

from rlft.data.types import Problem
from rlft.errors import ConfigError


def load_jsonl(path: str, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Problem]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"data file '{path}' does not exist")
    problems = []
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            for key in (prompt_key, answer_key):
                if key not in row:
                    raise ConfigError(f"{path}:{number}: missing key '{key}' (keys: {', '.join(row)})")
            if not str(row[prompt_key]).strip():
                raise ConfigError(f"{path}:{number}: empty prompt")
            problems.append(Problem(prompt=str(row[prompt_key]), answer=str(row[answer_key])))
    if not problems:
        raise ConfigError(f"data file '{path}' has no rows")
    return problems
