"""Datasets: the train and held-out problem lists a run uses."""

from __future__ import annotations

import random

from rlft.data.arithmetic import split_problems
from rlft.data.countdown import countdown_split
from rlft.data.multistep import multistep_split
from rlft.data.jsonl import load_jsonl
from rlft.data.types import Problem
from rlft.errors import ConfigError


def load_task(cfg) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out) for a DataConfig."""
    if cfg.name == "arithmetic":
        try:
            return split_problems(cfg.min_operand, cfg.max_operand, cfg.eval_size, cfg.split_seed)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if cfg.name == "countdown":
        return countdown_split(cfg.size, cfg.eval_size, cfg.operands, cfg.max_operand, cfg.split_seed)
    if cfg.name == "multistep":
        return multistep_split(cfg.size, cfg.eval_size, cfg.operands - 1, cfg.max_operand, cfg.split_seed)
    if cfg.name == "jsonl":
        train = load_jsonl(cfg.path, cfg.prompt_key, cfg.answer_key)
        if cfg.eval_path:
            return train, load_jsonl(cfg.eval_path, cfg.prompt_key, cfg.answer_key)
        if cfg.eval_size >= len(train):
            raise ConfigError(f"data.eval_size={cfg.eval_size} leaves no training rows of {len(train)} in {cfg.path}")
        rows = list(train)
        random.Random(cfg.split_seed).shuffle(rows)
        return rows[cfg.eval_size:], rows[:cfg.eval_size]
    raise ConfigError(f"data.name='{cfg.name}' is not one of: arithmetic, countdown, multistep, jsonl")
