"""`logger`: where metrics go besides metrics.jsonl in the run directory (always written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Optional


class WandbMode(StrEnum):
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class ConsoleLogger:
    wandb: ClassVar[bool] = False
    console: bool = True
    """A progress bar and one line per step on the console; false: only errors and the summary file."""


@dataclass
class WandbLogger(ConsoleLogger):
    wandb: ClassVar[bool] = True
    project: str = "rlft"
    """The W&B project."""
    entity: Optional[str] = None
    """The W&B team or user; null = your default."""
    group: Optional[str] = None
    """The W&B group; null: the runs of one multirun (-m) share the sweep's name."""
    tags: list[str] = field(default_factory=list)
    """W&B tags; a multirun adds each run's swept key=value."""
    name: Optional[str] = None
    """The W&B run name; null = the run directory's name."""
    mode: Optional[WandbMode] = None
    """online, offline (sync later) or disabled; null = the WANDB_MODE variable, else online."""
    log_model: bool = False
    """Upload the final model as a W&B artifact."""
