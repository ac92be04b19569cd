"""`data`: prompts and reference answers. Each option has its own schema: generated tasks need no
download; `dataset` reads files or a hub id. `name` (not a key) tells the code which task it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from omegaconf import MISSING

from rlft.config.checks import at_least, positive, within
from rlft.errors import ConfigError


@dataclass
class DataBase:
    eval_size: int = 500
    """Held-out problems: generated apart from the training ones, or split off the training rows."""
    split_seed: int = 0
    """Fixes which problems are held out (and, for generated tasks, which are generated)."""
    shuffle: bool = True
    """A fresh seeded order of the training prompts each epoch; false keeps their order."""


@dataclass
class PromptFormat:
    chat_template: Optional[bool] = None
    """Render prompts with the tokenizer's chat template; null = when the tokenizer has one."""
    system_prompt: Optional[str] = None
    """With the chat template: the system message."""
    max_prompt_tokens: Optional[int] = None
    """Prompts longer than this (rendered) are dropped and counted at start, never truncated; null = only
    those that cannot fit with rollout.max_new_tokens in the model's context."""


@dataclass
class ArithmeticData(DataBase):
    name: ClassVar[str] = "arithmetic"
    min_operand: int = 10
    """Smallest operand of the sums."""
    max_operand: int = 99
    """Largest operand; every pair in the range is a problem."""
    system_prompt: Optional[str] = None
    """For a chat model (its tokenizer has a chat template): the system message before each sum."""


@dataclass
class GeneratedData(PromptFormat, DataBase):
    operands: int = 4
    """Numbers per problem."""
    max_operand: int = 20
    """Numbers are drawn from 1..max_operand."""
    size: int = 10000
    """Training problems generated."""
    eval_size: int = 200


@dataclass
class CountdownData(GeneratedData):
    name: ClassVar[str] = "countdown"


@dataclass
class MultistepData(GeneratedData):
    name: ClassVar[str] = "multistep"


@dataclass
class ReasoningGymData(PromptFormat, DataBase):
    name: ClassVar[str] = "reasoning_gym"
    tasks: dict[str, Any] = field(default_factory=lambda: {"chain_sum": 1.0})
    """reasoning-gym task -> its weight in the mix ({countdown: 0.5, chain_sum: 0.5}), or its weight and
    generator options ({chain_sum: {weight: 1, min_terms: 2, max_terms: 3, max_digits: 1}})."""
    size: int = 10000
    """Training problems generated."""
    eval_size: int = 200


@dataclass
class HumanEvalData(PromptFormat, DataBase):
    name: ClassVar[str] = "humaneval"
    eval_size: int = 64


@dataclass
class CalculatorData(DataBase):
    name: ClassVar[str] = "calculator"
    size: int = 20000
    """Training problems generated: a 4-digit times a 3-digit number (with env=calculator)."""
    eval_size: int = 200


@dataclass
class DatasetData(PromptFormat, DataBase):
    name: ClassVar[str] = "dataset"
    path: str = MISSING
    """A .jsonl/.json/.csv/.parquet file (UTF-8; a BOM and CRLF are read), a folder of data files or one
    saved by `datasets`, or a hub id."""
    split: str = "train"
    """The split of a folder or hub dataset."""
    eval_path: Optional[str] = None
    """Held-out rows from another file; neither this nor eval_split: eval_size rows split off."""
    eval_split: Optional[str] = None
    """Held-out rows from another split of the same dataset."""
    prompt_key: str = "prompt"
    """The row field holding the prompt: a non-empty string (a number, list, object or null stops the run)."""
    answer_key: str = "answer"
    """The row field holding the reference answer: a non-empty string, or a number (an int, or a finite float;
    42.0 is read as "42"). Null, empty, bool, NaN/inf, list or object answers stop the run naming the file and line."""
    map_fn: Optional[str] = None
    """module:function, row -> {"prompt", "answer", other fields}, instead of the two keys."""
    eval_size: int = 100


def check(cfg) -> None:
    d = cfg.data
    at_least("data.eval_size", d.eval_size, 1)
    within("data.split_seed", d.split_seed, 0, 2 ** 63 - 1)
    if isinstance(d, GeneratedData):
        at_least("data.max_operand", d.max_operand, 1)
    if getattr(d, "max_prompt_tokens", None) is not None:
        at_least("data.max_prompt_tokens", d.max_prompt_tokens, 1)
    for key in ("size", "operands", "min_operand"):
        if hasattr(d, key):
            at_least(f"data.{key}", getattr(d, key), 1)
    if isinstance(d, ArithmeticData) and d.max_operand < d.min_operand:
        raise ConfigError(f"data.max_operand={d.max_operand} is below data.min_operand={d.min_operand}")
    if isinstance(d, ReasoningGymData) and not d.tasks:
        raise ConfigError("data=reasoning_gym needs data.tasks, e.g. data.tasks={countdown: 1.0}")
    for task, entry in getattr(d, "tasks", {}).items():  # a weight, or a weight and generator options
        check_task_entry(f"data.tasks.{task}", entry)
    if isinstance(d, DatasetData) and not d.path.strip():
        raise ConfigError("data.path is empty: name a .jsonl/.csv/.parquet file, a folder or a hub id")
    if isinstance(d, DatasetData) and d.map_fn is None and d.prompt_key == d.answer_key:
        raise ConfigError(f"data.prompt_key and data.answer_key are both '{d.prompt_key}': the answer would be "
                          "the prompt itself")


def check_task_entry(key: str, entry) -> tuple[float, dict]:
    """(weight, the generator's options) of a `data.tasks` entry: a weight (> 0), alone or under `weight`
    beside the options (those are checked against the generator where the task is loaded)."""
    options = {}
    if isinstance(entry, dict):
        options = {k: v for k, v in entry.items() if k != "weight"}
        key, entry = f"{key}.weight", entry.get("weight", 1.0)
    if isinstance(entry, bool) or not isinstance(entry, (int, float)):
        raise ConfigError(f"{key} must be a weight (a number > 0), or the task's {{weight: W, option: value, ...}} "
                          f"(got {entry!r})")
    positive(key, entry)
    return float(entry), options
