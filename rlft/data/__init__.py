"""Datasets: the train and held-out problem lists of a run's `data` option (each schema of rlft.config.data
names its task)."""

from __future__ import annotations

import random

from rlft.data.arithmetic import split_problems
from rlft.data.countdown import countdown_split
from rlft.data.multistep import multistep_split
from rlft.errors import ConfigError
from rlft.types import Problem


def load_task(cfg) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out) for a data option's config."""
    if cfg.name == "arithmetic":
        try:
            return split_problems(cfg.min_operand, cfg.max_operand, cfg.eval_size, cfg.split_seed)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if cfg.name == "countdown":
        return countdown_split(cfg.size, cfg.eval_size, cfg.operands, cfg.max_operand, cfg.split_seed)
    if cfg.name == "multistep":
        return multistep_split(cfg.size, cfg.eval_size, cfg.operands - 1, cfg.max_operand, cfg.split_seed)
    if cfg.name == "reasoning_gym":
        from rlft.data.reasoning_gym import reasoning_gym_split
        return reasoning_gym_split(dict(cfg.tasks), cfg.size, cfg.eval_size, cfg.split_seed)
    if cfg.name == "calculator":
        from rlft.data.calculator import split_problems as calculator_split
        return calculator_split(cfg.eval_size, cfg.split_seed, cfg.size)
    if cfg.name == "humaneval":
        from rlft.data.humaneval import humaneval_problems
        return split_off(humaneval_problems(), cfg.eval_size, cfg.split_seed, "HumanEval")
    if cfg.name != "dataset":
        raise ValueError(f"no loader for data option '{cfg.name}'")
    from rlft.data.files import check_splits, load_problems
    check_splits(cfg.path, cfg.split, cfg.eval_path, cfg.eval_split)
    train = load_problems(cfg.path, cfg.split, cfg.prompt_key, cfg.answer_key, cfg.map_fn)
    if cfg.eval_path or cfg.eval_split:
        return train, load_problems(cfg.eval_path or cfg.path, cfg.eval_split or cfg.split, cfg.prompt_key,
                                    cfg.answer_key, cfg.map_fn)
    return split_off(train, cfg.eval_size, cfg.split_seed, cfg.path)


def split_off(rows: list[Problem], eval_size: int, seed: int, source: str) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): `eval_size` rows held out by a seeded shuffle."""
    if eval_size >= len(rows):
        raise ConfigError(f"data.eval_size={eval_size} leaves no training rows of {len(rows)} in {source}")
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return rows[eval_size:], rows[:eval_size]
