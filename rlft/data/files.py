"""Prompt/answer rows from JSONL, JSON, CSV or Parquet files, or a Hugging Face dataset (hub id or local folder).

Each row becomes a Problem through `data.prompt_key` / `data.answer_key`, or a user mapping function
(`data.map_fn: mypkg.data:to_problem`, row -> {"prompt", "answer", other fields}); the row's remaining
fields travel with it, as they are, to the reward functions. A bad row stops the run before training with
the file, the line (JSONL, CSV) or row number (JSON array, Parquet, datasets) and the problem.

The prompt and the answer are strict, since a wrong type silently trains on garbage (a null answer read
as "" gives an empty completion full marks under exact_match):
- the prompt is a string with more than whitespace; a number, a list, a dict or null is an error;
- the answer is a string with more than whitespace, or a number: an int as written ("42"), an integral
  float as an int (42.0 -> "42", as pandas writes an int column that had a gap), any other finite float
  in its shortest round-trip form (0.5 -> "0.5"); a bool, NaN, inf, null, a list or a dict is an error;
- with data.map_fn, the same rules apply to the "prompt" and "answer" it returns.
Files are UTF-8, with or without a byte-order mark, with \\n or \\r\\n line ends, and no NUL byte. In a CSV file
every row has as many cells as the header; an empty cell is an error in the prompt and answer columns and ""
elsewhere. A `.json` file is a JSON array of row objects, or JSON Lines (one object pretty-printed over
several lines is refused). A key that appears twice in one JSON object
is an error when it is the prompt or the answer key; for the other fields the last one wins, as in JSON.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
from pathlib import Path
from typing import Any, Iterable, Iterator

from rlft.types import Problem
from rlft.errors import ConfigError, first_line
from rlft.registry import import_function

FILE_FORMATS = (".jsonl", ".json", ".csv", ".parquet")
BOM = "\ufeff"


def load_problems(path: str, split: str, prompt_key: str, answer_key: str, map_fn: str | None) -> list[Problem]:
    mapper = import_function(map_fn, "data.map_fn") if map_fn else None
    # Without a map_fn the file's own prompt and answer keys must be unambiguous (no duplicates).
    strict = () if mapper else (prompt_key, answer_key)
    problems = []
    for where, row in read_rows(path, split, strict):
        if mapper is not None:
            row = _mapped(mapper, map_fn, where, row)
            problems.append(_problem(where, row, "prompt", "answer", f" from data.map_fn '{map_fn}'"))
        else:
            problems.append(_problem(where, row, prompt_key, answer_key))
    if not problems:
        raise ConfigError(f"data '{path}' has no rows")
    return problems


def check_splits(path: str, split: str, eval_path: str | None, eval_split: str | None) -> None:
    """Splits belong to a dataset folder or a hub id: a split named for one file would be ignored (the held-out
    rows read from the training file itself), so it is refused."""
    for key, value, source in (("data.split", split if split != "train" else None, path),
                               ("data.eval_split", eval_split, eval_path or path)):
        if value is not None and Path(source).expanduser().suffix in FILE_FORMATS:
            hint = ("held-out rows from another file: data.eval_path=FILE, or data.eval_size rows are split off"
                    if key == "data.eval_split" else "leave data.split out")
            raise ConfigError(f"{key}={value}: '{source}' is one file, with no splits ({hint})")


def read_rows(path: str, split: str, strict_keys: tuple[str, ...] = ()) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; `where` names the file and line (JSONL, CSV) or row (JSON array, Parquet, datasets).
    `strict_keys`: keys that may not appear twice in one JSON object or CSV header."""
    file = Path(path).expanduser()
    if file.suffix in FILE_FORMATS:
        if file.is_dir():
            raise ConfigError(f"data file '{path}' is a directory, not a {file.suffix} file")
        if not file.is_file():
            raise ConfigError(f"data file '{path}' does not exist")
        reader = {".jsonl": _jsonl, ".json": _json, ".csv": _csv, ".parquet": _parquet}[file.suffix]
        yield from reader(file, path, strict_keys)
        return
    if file.is_file():
        raise ConfigError(f"data file '{path}': unknown format (use {', '.join(FILE_FORMATS)}, a dataset folder "
                          "or a hub id)")
    yield from _datasets(path, split)


# ---- text: UTF-8 with line numbers in its errors

def _decode(raw: bytes, where: str) -> str:
    """One line's bytes as text; a leading byte-order mark goes (files joined with `cat` keep theirs)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # The bytes before the first bad one are valid; the column counts characters, as editors do.
        column = len(raw[:err.start].decode("utf-8").removeprefix(BOM)) + 1
        raise ConfigError(f"{where}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {column}); "
                          "save the file as UTF-8") from None
    text = text[1:] if text.startswith(BOM) else text
    if "\0" in text:  # no text file holds one; a binary or damaged file would train on it silently
        raise ConfigError(f"{where}: a NUL byte at column {text.index(chr(0)) + 1} (a binary or damaged file?)")
    return text


def _decode_file(raw: bytes, path: str) -> str:
    """A whole file as text; a decoding error names the line it is on."""
    try:
        return raw.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        start, end = raw.rfind(b"\n", 0, err.start) + 1, raw.find(b"\n", err.start)
        _decode(raw[start:] if end < 0 else raw[start:end], f"{path}:{line}")
        raise  # not reached: that line holds the bad byte


def _text_lines(handle: Iterable[bytes], path: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(handle, start=1):
        yield number, _decode(raw, f"{path}:{number}")


# ---- JSON Lines and JSON

def _jsonl(file: Path, path: str, strict: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    with file.open("rb") as handle:  # bytes, so that a decoding error can name its line
        yield from _json_lines(_text_lines(handle, path), path, strict)


def _json_lines(lines: Iterable[tuple[int, str]], path: str, strict: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row, duplicated = _loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: not valid JSON ({err.msg})") from None
        yield where, _json_row(where, row, duplicated, strict)


def _json(file: Path, path: str, strict: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    """A JSON array of row objects (rows numbered from 0), or else JSON Lines in a .json file."""
    raw = file.read_bytes()
    if not raw.lstrip(BOM.encode() + b" \t\r\n").startswith(b"["):
        _not_one_object(raw, path)
        yield from _json_lines(_text_lines(raw.split(b"\n"), path), path, strict)
        return
    text = _decode_file(raw, path)
    try:
        rows, duplicated = _loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    for index, row in enumerate(rows):
        where = f"{path} row {index}"
        yield where, _json_row(where, row, duplicated, strict)


def _not_one_object(raw: bytes, path: str) -> None:
    """A .json file that is one JSON object pretty-printed over several lines (`{"data": [{...}, ...]}`, say)
    is refused by name, rather than read as JSON Lines and failing on its first line. (On one line it is
    JSON Lines of one row.)"""
    if sum(1 for line in raw.splitlines() if line.strip()) < 2:
        return
    try:
        whole = json.loads(raw.decode("utf-8").removeprefix(BOM))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return  # JSON Lines (or broken): read line by line, errors named by line
    if isinstance(whole, dict):
        rows = [key for key, value in whole.items() if isinstance(value, list) and value and isinstance(value[0], dict)]
        inside = f"; are the rows its '{rows[0]}' list?" if rows else ""
        raise ConfigError(f"{path}: one JSON object (keys: {', '.join(map(_shown, whole))}), not an array of row "
                          f"objects or JSON Lines{inside}")


def _loads(text: str) -> tuple[Any, dict[int, set[str]]]:
    """The parsed value, and the keys that appear twice in an object, by id() of that object."""
    duplicated: dict[int, set[str]] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict:
        obj = dict(items)
        if len(obj) < len(items):
            keys = [key for key, _ in items]
            duplicated[id(obj)] = {key for key in obj if keys.count(key) > 1}
        return obj

    return json.loads(text, object_pairs_hook=pairs), duplicated


def _json_row(where: str, row: Any, duplicated: dict[int, set[str]], strict: tuple[str, ...]) -> dict:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {_kind(row)}")
    for key in strict:
        if key in duplicated.get(id(row), ()):
            raise ConfigError(f"{where}: key '{key}' appears more than once")
    return row


# ---- CSV

def _csv(file: Path, path: str, strict: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    with file.open("rb") as handle:
        # The csv module reads decoded lines with their own line ends (as with newline=""), so \r\n
        # and quoted multi-line cells work, and reader.line_num stays the file's line number.
        reader = csv.reader(line for _, line in _text_lines(handle, path))
        try:
            header = next((cells for cells in reader if not _blank(cells)), None)
            if header is None:
                return  # an empty file: "has no rows"
            for key in strict:
                if header.count(key) > 1:
                    raise ConfigError(f"{path}:{reader.line_num}: column '{key}' appears more than once in the header")
            for cells in reader:
                if _blank(cells):
                    continue
                where = f"{path}:{reader.line_num}"
                if len(cells) != len(header):
                    raise ConfigError(f"{where}: {len(cells)} cells, but the header has {len(header)} columns")
                yield where, dict(zip(header, cells))
        except csv.Error as err:
            raise ConfigError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None


def _blank(cells: list[str]) -> bool:
    """A line with nothing but whitespace (csv gives [] for an empty line, [' '] for spaces)."""
    return len(cells) <= 1 and not "".join(cells).strip()


# ---- Parquet and datasets

def _parquet(file: Path, path: str, strict: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
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
        first = first_line(err)
        raise ConfigError(f"data.path '{path}' (split '{split}'): cannot load it as a dataset ({first})") from None
    for index, row in enumerate(data):
        yield f"{path} [{split}] row {index}", dict(row)


# ---- rows -> problems

def _mapped(mapper, map_fn: str, where: str, row: dict) -> dict:
    try:
        mapped = mapper(row)
    except (Exception, SystemExit) as err:  # sys.exit() in a map_fn would end rlft without a word
        raise ConfigError(f"{where}: data.map_fn '{map_fn}' raised {type(err).__name__}: {err}") from None
    if not isinstance(mapped, dict):
        raise ConfigError(f"{where}: data.map_fn '{map_fn}' returned {type(mapped).__name__}, not a dict")
    return mapped


def _problem(where: str, row: dict, prompt_key: str, answer_key: str, source: str = "") -> Problem:
    """`source` says where the keys come from in messages (a map_fn's result, or the row itself)."""
    for key in (prompt_key, answer_key):
        if key not in row:
            raise ConfigError(f"{where}: missing key '{key}'{source} (keys: {', '.join(map(_shown, row))})")
    prompt = _prompt_text(where, row[prompt_key], f"prompt '{prompt_key}'{source}")
    answer = _answer_text(where, row[answer_key], f"answer '{answer_key}'{source}")
    fields = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
    return Problem(prompt=prompt, answer=answer, fields=fields)


def _prompt_text(where: str, value: Any, what: str) -> str:
    # A number is refused too: a numeric "prompt" is almost always the wrong column.
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {what} is {_kind(value)}, not a string")
    if not value.strip():
        raise ConfigError(f"{where}: empty prompt ({what} holds {'only whitespace' if value else 'nothing'})")
    return value


def _answer_text(where: str, value: Any, what: str) -> str:
    if isinstance(value, str):
        if not value.strip():  # an empty reference gives an empty completion full marks
            raise ConfigError(f"{where}: empty answer ({what} holds {'only whitespace' if value else 'nothing'})")
        return value
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):  # bool is an int; numpy's is not
        raise ConfigError(f"{where}: {what} is a bool ({value}), not a string or number")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, float):  # also numpy.float64
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {what} is {value}, not a finite number")
        exact_int = value.is_integer() and abs(value) < 2 ** 53  # beyond, 1e300 -> "1e+300", not 301 digits
        return str(int(value)) if exact_int else repr(float(value))
    raise ConfigError(f"{where}: {what} is {_kind(value)}, not a string or number")


def _shown(key: Any) -> str:
    """A key in a message, quoted when spaces around it would hide (a CSV header "prompt, answer")."""
    return key if isinstance(key, str) and key == key.strip() and key else repr(key)


def _kind(value: Any) -> str:
    """A value's type in a message, in JSON's words where it has them."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a dict"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
