"""The run config: one section per group of conf/ (each group's options have their own schemas), plus
the trainer's schedule, the optimizer, and `compute`: the execution knobs, which change how fast a run
goes and how much memory it takes, never what it computes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from omegaconf import MISSING

from rlft.config.algo import AlgoConfig
from rlft.config.checks import at_least, positive, within
from rlft.config.model import ModelConfig
from rlft.errors import ConfigError


SEED_MAX = 2 ** 63 - 1  # what every generator rlft seeds accepts


class Layout(StrEnum):
    auto = "auto"
    shared_prompts = "shared_prompts"
    packed = "packed"
    padded = "padded"


class AttnImplementation(StrEnum):
    eager = "eager"
    sdpa = "sdpa"
    flash_attention_2 = "flash_attention_2"


@dataclass
class TrainerConfig:
    steps: int = 100
    """RL steps, one batch of responses each (the learning-rate and eps_high schedules count them)."""
    epochs: Optional[float] = None
    """Instead of steps: passes over the training prompts (rounded up to whole steps)."""
    prompts_per_step: int = 32
    """Prompts sampled per step; each gets algo.group_size responses."""
    eval_every: int = 10
    """Steps between greedy held-out evaluations (also at the start and the end)."""
    save_every: int = 20
    """Steps between checkpoints (also at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept in the run directory, newest first."""
    max_nonfinite_steps: int = 3
    """Steps in a row whose loss or gradient norm is not finite (their update is not applied) before the run
    stops; the last checkpoint, which never holds non-finite weights, is intact."""
    stop_on_collapse: bool = False
    """Stop the run when the collapse rule fires: the task reward's mean over 5 steps has fallen
    collapse_drop below its best so far (docs/stability.md). false: a warning, and the run goes on. A
    stopped run writes no checkpoint of that step and no final model: its last checkpoint stays."""
    collapse_drop: float = 0.5
    """The collapse rule's drop from the best 5-step mean of the task reward, in (0, 1]: 0.5 = below half."""


@dataclass
class OptimConfig:
    lr: float = 1e-4
    """AdamW learning rate after warm-up."""
    warmup_steps: int = 5
    """Steps of linear learning-rate warm-up from 0."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW's moment decay rates [beta1, beta2], each in [0, 1)."""
    eps: float = 1e-8
    """AdamW's denominator epsilon."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm (> 0)."""


@dataclass
class ComputeConfig:
    micro_batch_size: Optional[int] = None
    """Responses per forward/backward; gradients accumulate to the same optimizer step (the loss is
    exactly the same). null = the whole step's responses at once."""
    layout: Layout = Layout.auto
    """How a learner pass lays out its tokens: shared_prompts (each distinct prompt once for its group),
    packed (sequences end to end, no padding), padded, or auto (per pass the cheaper of the first two)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about 30% more time."""
    attn_implementation: Optional[AttnImplementation] = None
    """The learner's attention kernel: eager, sdpa or flash_attention_2; null = transformers' default."""


@dataclass
class RunConfig:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    # each of these is the schema of the option chosen (rlft.config.SCHEMAS)
    data: Any = MISSING
    reward: Any = MISSING
    env: Any = MISSING
    rollout: Any = MISSING
    hardware: Any = MISSING
    logger: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    seed: int = 0
    """Seeds the sampling, the data order and the learner; the held-out split has its own (data.split_seed)."""


def check(cfg: RunConfig) -> None:
    t, o, c = cfg.trainer, cfg.optim, cfg.compute
    at_least("trainer.steps", t.steps, 1)
    at_least("trainer.prompts_per_step", t.prompts_per_step, 1)
    at_least("trainer.eval_every", t.eval_every, 1)
    at_least("trainer.save_every", t.save_every, 1)
    at_least("trainer.keep_checkpoints", t.keep_checkpoints, 1)
    at_least("trainer.max_nonfinite_steps", t.max_nonfinite_steps, 1)
    within("trainer.collapse_drop", t.collapse_drop, 0, 1, low_open=True)
    if t.epochs is not None:
        positive("trainer.epochs", t.epochs)
        if t.steps != TrainerConfig.steps:
            raise ConfigError(f"trainer.epochs={t.epochs} decides the number of steps: it does not combine with "
                              f"trainer.steps={t.steps} (set one)")
    positive("optim.lr", o.lr)
    at_least("optim.warmup_steps", o.warmup_steps, 0)
    at_least("optim.weight_decay", o.weight_decay, 0)
    positive("optim.eps", o.eps)
    positive("optim.max_grad_norm", o.max_grad_norm)
    if len(o.betas) != 2:
        raise ConfigError(f"optim.betas must be two numbers [beta1, beta2] (got {list(o.betas)})")
    for index, beta in enumerate(o.betas):
        within(f"optim.betas[{index}]", beta, 0, 1, high_open=True)
    if c.micro_batch_size is not None:
        at_least("compute.micro_batch_size", c.micro_batch_size, 1)
    within("seed", cfg.seed, 0, SEED_MAX)
