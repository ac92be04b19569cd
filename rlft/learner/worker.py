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
from rlft.errors import ConfigError
from rlft.learner.learner import Learner, TrainBatch
from rlft.learner.logprobs import response_logprobs
from rlft.learner.routing import find_routers
from rlft.models.loading import DTYPES, load_causal_lm
from rlft.rollout.base import Rollout, RolloutEngine
from rlft.sync import SyncStats, push_tensors


class LearnerWorker:
    def __init__(self, cfg: RunConfig, model_path: str, group: dist.ProcessGroup | None = None):
        device, dtype = cfg.hardware.device, cfg.model.dtype
        self.device = device
        self.engine_dtype = DTYPES[dtype]
        o = cfg.optim
        # master_dtype float32 below dtype bfloat16: mixed precision, the passes in `dtype` under autocast
        policy = load_causal_lm(model_path, cfg.model.master_dtype, device, cfg.model.attn_implementation)
        compute_dtype = None if cfg.model.master_dtype == dtype else self.engine_dtype
        if cfg.model.gradient_checkpointing:
            policy.config.use_cache = False
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = cfg.model.lora.r > 0
        if self.lora:  # only the adapters train (and are checkpointed); engines get the merged weights
            policy = with_lora(policy, cfg.model.lora)
        if cfg.algo.routing_replay and not find_routers(policy):
            raise ConfigError(f"algo.routing_replay=true needs a mixture-of-experts model; {model_path} has no "
                              "MoE routers (model=tiny_moe is one)")
        self.learner = Learner(policy, lr=o.lr, weight_decay=o.weight_decay,
                               betas=tuple(o.betas), eps=o.eps, max_grad_norm=o.max_grad_norm, group=group,
                               fsdp=cfg.hardware.fsdp, routing_replay=cfg.algo.routing_replay,
                               router_aux_loss_coef=cfg.algo.router_aux_loss_coef,
                               share_prompts=cfg.algo.share_prompt_prefix, padding_free=cfg.algo.padding_free,
                               compute_dtype=compute_dtype)
        self.rank = self.learner.rank
        self.micro_batch_size = cfg.algo.micro_batch_size
        self.reference = None
        if cfg.algo.kl_coef > 0:  # beta = 0 loads no reference model at all; frozen, so in `dtype` alone
            self.reference = load_causal_lm(model_path, dtype, device, cfg.model.attn_implementation)
            self.reference.eval().requires_grad_(False)

    def set_lr(self, lr: float) -> None:
        self.learner.set_lr(lr)

    def update(self, batch: TrainBatch, **settings) -> dict[str, float]:
        return self.learner.update(batch, **settings)

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout, temperature: float, rows: range | None = None) -> torch.Tensor | None:
        """Log-probs of the sampled tokens under the reference model, for `rows` (all by default), in
        passes of algo.micro_batch_size rows like the training passes (the logits of a whole batch at once
        would be the peak of the step's memory)."""
        if self.reference is None:
            return None
        rows = range(rollout.response_ids.shape[0]) if rows is None else rows
        chunk = self.micro_batch_size or len(rows) or 1
        parts = []
        for start in range(rows.start, rows.stop, chunk):
            part = slice(start, min(start + chunk, rows.stop))
            parts.append(response_logprobs(self.reference, rollout.prompt_ids[part], rollout.prompt_mask[part],
                                           rollout.response_ids[part], rollout.response_mask[part], temperature,
                                           share_prompts=self.learner.share_prompts,
                                           padding_free=self.learner.padding_free).cpu())
        return torch.cat(parts) if parts else torch.zeros(0, rollout.response_ids.shape[1])

    def push_weights(self, engine: RolloutEngine) -> SyncStats:
        """To an engine in this process."""
        return push_tensors(list(self.rollout_weights().items()), engine)

    def rollout_weights(self) -> dict[str, torch.Tensor]:
        """What a rollout engine needs: every weight under its Hugging Face name, the LoRA deltas merged in
        (computed, not merged into the policy, which keeps training on base + adapters), in the engines'
        dtype (under mixed precision half the bytes of the float32 master weights)."""
        return {name: t.to(self.engine_dtype) if t.is_floating_point() else t
                for name, t in self._hf_weights().items()}

    def _hf_weights(self) -> dict[str, torch.Tensor]:
        """Every weight under its Hugging Face name, LoRA merged, in the learner's own dtype."""
        return merged_lora_weights(self.learner.model) if self.lora else self.learner.full_weights()

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
        """The final model as a Hugging Face folder in the learner's dtype, whatever the placement (rank 0
        writes)."""
        weights = self._hf_weights() if self.learner.fsdp or self.lora else None  # FSDP: a collective
        if self.rank == 0:
            model = self.learner.model.get_base_model() if self.lora else self.learner.model
            model.save_pretrained(folder, state_dict=weights)

    def peak_memory_mb(self) -> float:
        """This process's peak: torch.cuda.max_memory_allocated on GPU, resident set size on CPU."""
        if self.device == "cuda" and torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2 ** 20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    @property
    def lr(self) -> float:
        return self.learner.optimizer.param_groups[0]["lr"]


def with_lora(model, settings):
    """The policy with LoRA adapters (peft) on `settings.target_modules`; their dropout is 0, as every
    dropout of the policy (RL ratios compare passes of one function)."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=0.0,
                                            target_modules=list(settings.target_modules), bias="none"))


@torch.no_grad()
def merged_lora_weights(model) -> dict[str, torch.Tensor]:
    """Hugging Face name -> base weight + LoRA delta, for a peft model (its own weights untouched)."""
    from peft.tuners.lora import LoraLayer
    deltas = {f"{name}.base_layer.weight": module.get_delta_weight(module.active_adapters[0])
              for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    prefix = "base_model.model."
    merged = {}
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        tensor = param.detach() + deltas[name] if name in deltas else param.detach()
        merged[name.removeprefix(prefix).replace(".base_layer.", ".")] = tensor
    return merged
