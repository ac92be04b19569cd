"""Prompt/answer rows from JSONL, CSV or Parquet files, or a Hugging Face dataset (hub id or local folder).

Each row becomes a Problem through `data.prompt_key` / `data.answer_key`, or a user mapping function
(`data.map_fn: mypkg.data:to_problem`, row -> {"prompt", "answer", other fields}); the row's remaining
fields travel with it to the reward functions. A bad row stops the run before training with the file,
the line or row number and the problem.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator

from rlft.types import Problem
from rlft.errors import ConfigError
from rlft.registry import import_function

FILE_FORMATS = (".jsonl", ".json", ".csv", ".parquet")


def load_problems(path: str, split: str, prompt_key: str, answer_key: str, map_fn: str | None) -> list[Problem]:
    mapper = import_function(map_fn, "data.map_fn") if map_fn else None
    problems = []
    for where, row in read_rows(path, split):
        if mapper is not None:
            try:
                row = mapper(row)
            except Exception as err:
                raise ConfigError(f"{where}: data.map_fn '{map_fn}' raised {type(err).__name__}: {err}") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: data.map_fn '{map_fn}' returned {type(row).__name__}, not a dict")
            keys = ("prompt", "answer")
        else:
            keys = (prompt_key, answer_key)
        problems.append(_problem(where, row, *keys))
    if not problems:
        raise ConfigError(f"data '{path}' has no rows")
    return problems


def read_rows(path: str, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; `where` names the file and line (JSONL, CSV) or row (Parquet, datasets)."""
    file = Path(path).expanduser()
    if file.suffix in FILE_FORMATS:
        if not file.is_file():
            raise ConfigError(f"data file '{path}' does not exist")
        yield from {".jsonl": _jsonl, ".json": _jsonl, ".csv": _csv, ".parquet": _parquet}[file.suffix](file, path)
        return
    if file.is_file():
        raise ConfigError(f"data file '{path}': unknown format (use {', '.join(FILE_FORMATS)}, a dataset folder "
                          "or a hub id)")
    yield from _datasets(path, split)


def _jsonl(file: Path, path: str) -> Iterator[tuple[str, dict]]:
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
            yield f"{path}:{number}", row


def _csv(file: Path, path: str) -> Iterator[tuple[str, dict]]:
    with file.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            if None in row:  # more cells than the header has columns
                raise ConfigError(f"{path}:{reader.line_num}: {len(row) - 1 + len(row[None])} cells, "
                                  f"but the header has {len(row) - 1} columns")
            yield f"{path}:{reader.line_num}", row


def _parquet(file: Path, path: str) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet
    try:
        table = pyarrow.parquet.read_table(file)
    except Exception as err:
        raise ConfigError(f"data file '{path}': not a readable Parquet file ({err})") from None
    for index, row in enumerate(table.to_pylist()):
        yield f"{path} row {index}", row


def _datasets(path: str, split: str) -> Iterator[tuple[str, dict]]:
    """A Hugging Face dataset: a hub id, or a local folder of data files (or one saved with save_to_disk)."""
    import datasets
    folder = Path(path).expanduser()
    try:
        if (folder / "dataset_info.json").is_file() or (folder / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(folder))
            data = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            data = datasets.load_dataset(str(folder) if folder.is_dir() else path, split=split)
    except Exception as err:  # datasets raises many kinds: not found, no such split, offline, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"data.path '{path}' (split '{split}'): cannot load it as a dataset ({first})") from None
    for index, row in enumerate(data):
        yield f"{path} [{split}] row {index}", dict(row)


def _problem(where: str, row: dict, prompt_key: str, answer_key: str) -> Problem:
    for key in (prompt_key, answer_key):
        if key not in row:
            raise ConfigError(f"{where}: missing key '{key}' (keys: {', '.join(map(str, row))})")
    if row[prompt_key] is None or not str(row[prompt_key]).strip():
        raise ConfigError(f"{where}: empty prompt")
    fields = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
    answer = row[answer_key]
    return Problem(prompt=str(row[prompt_key]), answer="" if answer is None else str(answer), fields=fields)
