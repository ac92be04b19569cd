"""What one learner rank holds and does in a run: the policy and its optimizer (rlft.learner.policy), the
frozen reference model when kl_coef > 0, full-state checkpoints, and the weights the engines get.

The trainer uses it directly in one process (hardware=cpu, one GPU); on Ray each learner actor wraps one
(rlft.distributed.learner_actors), with the same methods: both are a rlft.types.Learner.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from rlft.checkpoint import first_nonfinite, load_checkpoint, save_checkpoint
from rlft.config import RunConfig
from rlft.config.run import Layout
from rlft.errors import ConfigError
from rlft.learner.logprobs import response_logprobs
from rlft.learner.policy import Policy
from rlft.models.loading import DTYPES, load_causal_lm
from rlft.models.lora import adapter_weights, merged_lora_weights, with_lora
from rlft.types import (HeldWeights, LossSettings, Rollout, RolloutEngine, SyncStats, TrainBatch, TrainerState,
                        UpdateStats)


# Test hook: the update calls numbered in RLFT_FAULT_NAN_LOSS_AT_UPDATES (e.g. "2,3") get NaN advantages, so
# a NaN loss, as a diverging batch would (tests of the non-finite guard).
FAULT_NAN = "RLFT_FAULT_NAN_LOSS_AT_UPDATES"


class LocalLearner:
    def __init__(self, cfg: RunConfig, model_path: str, group: dist.ProcessGroup | None = None):
        device, dtype, compute = cfg.hardware.device, cfg.model.dtype, cfg.compute
        self.device = str(device)
        self.engine_dtype = DTYPES[dtype]
        # master_dtype float32 below dtype bfloat16: mixed precision, the passes in `dtype` under autocast
        policy = load_causal_lm(model_path, cfg.model.master_dtype, self.device, compute.attn_implementation)
        compute_dtype = None if cfg.model.master_dtype == dtype else self.engine_dtype
        if compute.gradient_checkpointing:
            policy.config.use_cache = False
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = cfg.model.lora is not None
        if self.lora:  # only the adapters train (and are checkpointed)
            policy = with_lora(policy, cfg.model.lora)
        # vLLM serves the adapter on top of its base weights; the HF engine gets the merged weights
        self.sends_adapter = self.lora and cfg.rollout.engine == "vllm"
        o = cfg.optim
        self.policy = Policy(policy, weight_decay=o.weight_decay, betas=tuple(o.betas), eps=o.eps,
                             max_grad_norm=o.max_grad_norm, ppo_epochs=cfg.algo.ppo_epochs,
                             micro_batch_size=compute.micro_batch_size, temperature=cfg.rollout.temperature,
                             group=group, fsdp=getattr(cfg.hardware, "fsdp", False),
                             routing_replay=bool(cfg.algo.routing_replay),
                             router_aux_loss_coef=cfg.algo.router_aux_loss_coef,
                             share_prompts=compute.layout in (Layout.auto, Layout.shared_prompts),
                             padding_free=compute.layout in (Layout.auto, Layout.packed), compute_dtype=compute_dtype)
        self.rank = self.policy.rank
        self.updates = 0
        bad = first_nonfinite(dict(policy.named_parameters()))
        if bad:  # the engine would sample from NaN probabilities
            raise ConfigError(f"model.path '{model_path}': its weight {bad} holds NaN or infinite values")
        self.reference = None
        if cfg.algo.kl_coef > 0:  # beta = 0 loads no reference model at all; frozen, so in `dtype` alone
            self.reference = load_causal_lm(model_path, dtype, self.device, compute.attn_implementation)
            self.reference.eval().requires_grad_(False)

    def update(self, batch: TrainBatch, loss: LossSettings, lr: float) -> UpdateStats:
        self.updates += 1
        if str(self.updates) in os.environ.get(FAULT_NAN, "").split(","):
            batch = replace(batch, advantages=torch.full_like(batch.advantages, float("nan")))
        return self.policy.update(batch, loss, lr)

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout, rows: range | None = None) -> torch.Tensor | None:
        """Log-probs of the sampled tokens under the reference model, for `rows` (all by default), in
        passes of compute.micro_batch_size rows like the training passes (the logits of a whole batch at
        once would be the peak of the step's memory)."""
        if self.reference is None:
            return None
        rows = range(rollout.size) if rows is None else rows
        chunk = self.policy.micro_batch_size or len(rows) or 1
        parts = []
        for start in range(rows.start, rows.stop, chunk):
            part = slice(start, min(start + chunk, rows.stop))
            parts.append(response_logprobs(self.reference, rollout.prompt_ids[part], rollout.prompt_mask[part],
                                           rollout.response_ids[part], rollout.response_mask[part],
                                           self.policy.temperature, share_prompts=self.policy.share_prompts,
                                           padding_free=self.policy.padding_free).cpu())
        return torch.cat(parts) if parts else torch.zeros(0, rollout.response_ids.shape[1])

    def push_weights(self, engine: RolloutEngine) -> SyncStats:
        """To an engine in this process, by name; nothing to an engine sampling from the learner's own
        weights (HFEngine.share_weights)."""
        if getattr(engine, "shares_learner_weights", False):
            return SyncStats(seconds=0.0, bytes=0)
        named = list(self.rollout_weights().items())
        start = time.perf_counter()
        engine.update_weights(named)
        return SyncStats(seconds=time.perf_counter() - start, bytes=sum(t.numel() * t.element_size() for _, t in named))

    def snapshot_weights(self) -> HeldWeights:
        """rollout_weights, copied: training goes on while the engine still generates with older weights."""
        return HeldWeights({name: t.detach().clone() for name, t in self.rollout_weights().items()})

    def rollout_weights(self) -> dict[str, torch.Tensor]:
        """What a rollout engine needs, in the engines' dtype (under mixed precision half the bytes of the
        float32 master weights): every weight under its Hugging Face name, the LoRA deltas merged in
        (computed, not merged into the policy, which keeps training on base + adapters); or, for vLLM with
        model.lora, the adapter's tensors alone."""
        weights = adapter_weights(self.policy.model) if self.sends_adapter else self._hf_weights()
        return {name: t.to(self.engine_dtype) if t.is_floating_point() else t for name, t in weights.items()}

    def _hf_weights(self) -> dict[str, torch.Tensor]:
        """Every weight under its Hugging Face name, LoRA merged, in the learner's own dtype."""
        return merged_lora_weights(self.policy.model) if self.lora else self.policy.full_weights()

    def save_checkpoint(self, run_dir: Path, state: TrainerState, keep: int) -> None:
        """Every rank calls it (gathering a sharded state is a collective); rank 0 writes."""
        weights, optimizer_state = self.policy.full_weights(), self.policy.full_optimizer_state()
        if self.rank == 0:
            save_checkpoint(run_dir, weights, optimizer_state, state, keep)

    def load_checkpoint(self, folder: Path) -> TrainerState:
        """Every rank reads the full state and keeps its part (all of it, unsharded)."""
        weights, optimizer_state, state = load_checkpoint(folder, self.policy.param_names)
        self.policy.load_full_state(weights, optimizer_state)
        return state

    def save_model(self, folder: Path) -> None:
        """The final model as a Hugging Face folder in the learner's dtype, whatever the placement (rank 0
        writes)."""
        weights = self._hf_weights() if self.policy.fsdp or self.lora else None  # FSDP: a collective
        if self.rank == 0:
            model = self.policy.model.get_base_model() if self.lora else self.policy.model
            model.save_pretrained(folder, state_dict=weights)

    def peak_memory_mb(self) -> float:
        """This process's peak: torch.cuda.max_memory_allocated on GPU, resident set size on CPU."""
        if self.device == "cuda" and torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2 ** 20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
