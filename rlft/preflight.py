"""Every start-up check, before any model is loaded: the config itself, then what it points at (the model's
files, the data, the reward functions, the device, the libraries, the checkpoint to resume from). A problem
ends the run here with one line, before anything is written. What it finds, and the numbers derived from
the config, are computed once here and printed at start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rlft.checkpoint import latest_checkpoint
from rlft.config import RunConfig, validate
from rlft.data import load_task
from rlft.data.prompts import PromptEncoder, drop_long_prompts
from rlft.errors import ConfigError
from rlft.models.loading import load_tokenizer, resolve_model_path
from rlft.rewards.scorer import RewardScorer
from rlft.types import Problem


@dataclass(frozen=True)
class RunControls:
    """Per invocation, not part of the run's config: `rlft train resume=DIR trainer.exit_after_step=N --profile`."""
    resume: Path | None = None            # a run directory to continue from its last checkpoint
    exit_after_step: int | None = None    # stop this invocation after this step (the schedule keeps its steps)
    profile_steps: tuple[int, ...] = ()   # torch.profiler traces of these steps (RUN_DIR/profile)


@dataclass
class Prepared:
    """What preflight found and derived."""
    model_path: str
    tokenizer: object
    encode: PromptEncoder
    train: list[Problem]
    held_out: list[Problem]
    scorer: RewardScorer
    steps: int                              # trainer.steps, or as many as trainer.epochs needs
    resume_from: Path | None = None         # the checkpoint folder to continue from
    dropped: tuple[int, int] = (0, 0)       # training and held-out prompts longer than data.max_prompt_tokens
    notes: list[str] = field(default_factory=list)


def preflight(cfg: RunConfig, controls: RunControls = RunControls()) -> Prepared:
    validate(cfg)
    check_environment(cfg)
    model_path = resolve_model_path(cfg.model.path)
    if cfg.algo.routing_replay:
        check_mixture_of_experts(model_path, cfg.algo.routing_replay)
    tokenizer = load_tokenizer(model_path)
    data = cfg.data
    encode = PromptEncoder(tokenizer, getattr(data, "chat_template", None), getattr(data, "system_prompt", None))
    train, held_out = load_task(data)
    limit = getattr(data, "max_prompt_tokens", None)
    train, dropped_train = drop_long_prompts(train, encode, limit, "training")
    held_out, dropped_eval = drop_long_prompts(held_out, encode, limit, "held-out")
    scorer = RewardScorer(cfg.reward, max_response_tokens=cfg.rollout.max_new_tokens)
    steps = steps_for(cfg.trainer, len(train))
    resume_from = latest_checkpoint(controls.resume) if controls.resume else None
    if controls.exit_after_step is not None and not 1 <= controls.exit_after_step <= steps:
        raise ConfigError(f"trainer.exit_after_step must be in [1, trainer.steps={steps}] "
                          f"(got {controls.exit_after_step})")
    return Prepared(model_path, tokenizer, encode, train, held_out, scorer, steps, resume_from,
                    (dropped_train, dropped_eval))


def check_environment(cfg: RunConfig) -> None:
    """The device and the libraries the config needs, here (Ray actors check their own)."""
    import torch
    if cfg.hardware.device == "cuda" and not cfg.hardware.ray and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but torch sees no GPU here (hardware=cpu runs on the CPU)")
    if cfg.rollout.engine == "vllm":
        from rlft.rollout.vllm_engine import INSTALL_HINT, vllm_available
        if not vllm_available():
            raise ConfigError(INSTALL_HINT)


def check_mixture_of_experts(model_path: str, routing_replay) -> None:
    """Routing replay needs routers: read from the model's config.json, before its weights are loaded."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_path)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        value = str(routing_replay).lower()
        raise ConfigError(f"algo.routing_replay={value} needs a mixture-of-experts model; {model_path} has no MoE "
                          "routers (model=tiny_moe is one)")


def steps_for(trainer_cfg, train_size: int) -> int:
    """trainer.steps, or enough steps for trainer.epochs passes over the training prompts (rounded up)."""
    if trainer_cfg.epochs is None:
        return trainer_cfg.steps
    return math.ceil(trainer_cfg.epochs * train_size / trainer_cfg.prompts_per_step)


def describe_run(cfg: RunConfig, prepared: Prepared, start_step: int) -> str:
    """The derived batch numbers, in rlft's one vocabulary, printed once at start."""
    a, t = cfg.algo, cfg.trainer
    responses = t.prompts_per_step * a.group_size
    micro_batch = min(cfg.compute.micro_batch_size or responses, responses)
    passes = -(-responses // micro_batch)
    steps = prepared.steps
    lines = [
        f"rlft: {t.prompts_per_step} prompts/step x group_size {a.group_size} = {responses} responses/step "
        f"(<= {responses * cfg.rollout.max_new_tokens:,} response tokens)",
        f"      micro_batch_size {micro_batch} -> {passes} forward/backward per optimizer step; "
        f"ppo_epochs {a.ppo_epochs} -> {a.ppo_epochs} optimizer step(s)/step, {a.ppo_epochs * steps} in all",
        f"      {steps} steps over {len(prepared.train)} training prompts "
        f"({steps * t.prompts_per_step / len(prepared.train):.2f} epochs); {len(prepared.held_out)} held-out prompts",
    ]
    if any(prepared.dropped):
        lines.append(f"      dropped {prepared.dropped[0]} training and {prepared.dropped[1]} held-out prompts longer "
                     f"than data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    if prepared.encode.chat:
        lines.append("      prompts rendered with the tokenizer's chat template"
                     + (" and data.system_prompt" if getattr(cfg.data, "system_prompt", None) else ""))
    if start_step:
        lines.append(f"      resuming after step {start_step} from {prepared.resume_from}")
    return "\n".join(lines)
