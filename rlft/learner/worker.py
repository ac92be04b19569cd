"""What one learner rank holds and does in a run: the policy and its optimizer (rlft.learner.learner), the
frozen reference model when kl_coef > 0, full-state checkpoints, and sending weights to the rollout side.

The trainer uses it directly on one process (hardware=cpu, one GPU); on Ray each learner actor wraps one
(rlft.learner.remote), with the same methods.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch
import torch.distributed as dist

from rlft.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from rlft.config import RunConfig
from rlft.learner.learner import Learner, TrainBatch
from rlft.learner.logprobs import response_logprobs
from rlft.models.loading import load_causal_lm
from rlft.rollout.base import Rollout, RolloutEngine
from rlft.sync import SyncStats, push_weights


class LearnerWorker:
    def __init__(self, cfg: RunConfig, model_path: str, group: dist.ProcessGroup | None = None):
        device, dtype = cfg.hardware.device, cfg.model.dtype
        self.device = device
        o = cfg.optim
        self.learner = Learner(load_causal_lm(model_path, dtype, device), lr=o.lr, weight_decay=o.weight_decay,
                               betas=tuple(o.betas), eps=o.eps, max_grad_norm=o.max_grad_norm, group=group,
                               fsdp=cfg.hardware.fsdp)
        self.rank = self.learner.rank
        self.reference = None
        if cfg.algo.kl_coef > 0:  # beta = 0 loads no reference model at all
            self.reference = load_causal_lm(model_path, dtype, device).eval().requires_grad_(False)

    def set_lr(self, lr: float) -> None:
        self.learner.set_lr(lr)

    def update(self, batch: TrainBatch, **settings) -> dict[str, float]:
        return self.learner.update(batch, **settings)

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout, temperature: float, rows: range | None = None) -> torch.Tensor | None:
        """Log-probs of the sampled tokens under the reference model, for `rows` (all by default)."""
        if self.reference is None:
            return None
        rows = slice(None) if rows is None else slice(rows.start, rows.stop)
        return response_logprobs(self.reference, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                 rollout.response_ids[rows], rollout.response_mask[rows], temperature).cpu()

    def push_weights(self, engine: RolloutEngine) -> SyncStats:
        """To an engine in this process."""
        return push_weights(self.learner.model, engine)

    def full_weights(self) -> dict[str, torch.Tensor]:
        return self.learner.full_weights()

    def save_checkpoint(self, run_dir: Path, state: TrainerState, keep: int) -> None:
        """Every rank calls it (gathering a sharded state is a collective); rank 0 writes."""
        weights, optimizer_state = self.learner.full_weights(), self.learner.full_optimizer_state()
        if self.rank == 0:
            save_checkpoint(run_dir, weights, optimizer_state, state, keep)

    def load_checkpoint(self, folder: Path) -> TrainerState:
        """Every rank reads the full state and keeps its part (all of it, unsharded)."""
        weights, optimizer_state, state = load_checkpoint(folder, self.learner.param_names)
        self.learner.load_full_state(weights, optimizer_state)
        return state

    def save_model(self, folder: Path) -> None:
        """The final model as a Hugging Face folder (rank 0 writes)."""
        weights = self.learner.full_weights()
        if self.rank == 0:
            self.learner.model.save_pretrained(folder, state_dict=weights if self.learner.fsdp else None)

    def peak_memory_mb(self) -> float:
        """This process's peak: torch.cuda.max_memory_allocated on GPU, resident set size on CPU."""
        if self.device == "cuda" and torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2 ** 20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    @property
    def lr(self) -> float:
        return self.learner.optimizer.param_groups[0]["lr"]
