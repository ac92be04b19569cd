"""Weight transfer from the learner to the rollout engine."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rlft.rollout.base import RolloutEngine


@dataclass
class SyncStats:
    seconds: float
    bytes: int


@torch.no_grad()
def push_weights(model: torch.nn.Module, engine: RolloutEngine) -> SyncStats:
    """Send every learner parameter to the engine by name (tied weights travel once)."""
    return push_tensors([(name, p.detach()) for name, p in model.named_parameters()], engine)


def push_tensors(named: list[tuple[str, torch.Tensor]], engine: RolloutEngine) -> SyncStats:
    start = time.perf_counter()
    engine.update_weights(named)
    return SyncStats(seconds=time.perf_counter() - start,
                     bytes=sum(t.numel() * t.element_size() for _, t in named))
