"""Every start-up check, before any model is loaded: the config itself, then what it points at (the model's
files, the data, the reward functions, the device, the libraries, the checkpoint to resume from). A problem
ends the run here with one line, before anything is written. What it finds, and the numbers derived from
the config, are computed once here and printed at start.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlft.checkpoint import latest_checkpoint
from rlft.config import RunConfig, validate
from rlft.config.env import response_budget, response_budget_key
from rlft.data import load_task
from rlft.data.prompts import PromptEncoder, context_limit, describe_limit, drop_long_prompts
from rlft.errors import ConfigError
from rlft.models.checks import (ModelShape, available_memory_bytes, check_attention, check_context,
                                check_lora_targets, check_weight_files, check_weights_match,
                                read_model_config, shape_of, step_bytes)
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
    dropped: tuple[int, int] = (0, 0)       # training and held-out prompts longer than prompt_limit allows
    prompt_limit: str = ""                  # what sets the longest prompt kept (describe_limit's words)
    notes: list[str] = field(default_factory=list)
    episodes: object = None                 # rlft.envs.EpisodeSetup: multi-turn episodes (env), else None


def preflight(cfg: RunConfig, controls: RunControls = RunControls()) -> Prepared:
    validate(cfg)
    check_environment(cfg)
    model_path = resolve_model_path(cfg.model.path)
    shape = check_model(cfg, model_path)
    tokenizer = load_tokenizer(model_path)
    data = cfg.data
    encode = PromptEncoder(tokenizer, getattr(data, "chat_template", None), getattr(data, "system_prompt", None))
    episodes = None
    if cfg.env.multi_turn:  # the environment, its tools and the chat template's observations, checked now
        from rlft.envs import EpisodeSetup
        episodes = EpisodeSetup(cfg.env, tokenizer)
    train, held_out = load_task(data)
    # A prompt that can't fit with a response in the model's context is dropped, max_prompt_tokens or not.
    limits = (shape.context, response_budget(cfg), getattr(data, "max_prompt_tokens", None))
    limit, reason = context_limit(*limits), describe_limit(*limits)
    train, dropped_train = drop_long_prompts(train, encode, limit, "training", reason)
    held_out, dropped_eval = drop_long_prompts(held_out, encode, limit, "held-out", reason)
    scorer = RewardScorer(cfg.reward, max_response_tokens=response_budget(cfg))
    check_reward_functions(scorer, train[0] if train else None)
    steps = steps_for(cfg.trainer, len(train))
    resume_from = latest_checkpoint(controls.resume) if controls.resume else None
    if controls.resume and resume_from is None:
        print(f"rlft: warning: {controls.resume} has no checkpoint yet: the run starts again from step 0",
              file=sys.stderr)
    if controls.exit_after_step is not None and not 1 <= controls.exit_after_step <= steps:
        raise ConfigError(f"trainer.exit_after_step must be in [1, trainer.steps={steps}] "
                          f"(got {controls.exit_after_step})")
    return Prepared(model_path, tokenizer, encode, train, held_out, scorer, steps, resume_from,
                    (dropped_train, dropped_eval), reason, episodes=episodes)


def check_environment(cfg: RunConfig) -> None:
    """The device and the libraries the config needs, here (Ray actors check their own)."""
    import torch
    torch_threads(default=1)  # a malformed OMP_NUM_THREADS
    if cfg.hardware.device == "cuda" and not cfg.hardware.ray and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but torch sees no GPU here (hardware=cpu runs on the CPU)")
    if cfg.rollout.engine == "vllm":
        from rlft.rollout.vllm_engine import INSTALL_HINT, vllm_available
        if not vllm_available():
            raise ConfigError(INSTALL_HINT)


def torch_threads(default: int) -> int:
    """OMP_NUM_THREADS when it is set (the usual way to give torch fewer threads), else `default`."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"the OMP_NUM_THREADS environment variable must be a whole number >= 1 (got '{value}')")
    return int(value)


def check_model(cfg: RunConfig, model_path: str) -> ModelShape:
    """The model's config and weight files, and what the run asks of it (rlft.models.checks), from its
    config.json and the files' headers: no weights are read."""
    config = read_model_config(model_path)
    check_weight_files(model_path)
    check_weights_match(config, model_path)
    shape = shape_of(config)
    check_context(shape, response_budget(cfg), response_budget_key(cfg))
    check_attention(cfg.compute.attn_implementation, cfg.hardware.device)
    if cfg.model.lora is not None:
        check_lora_targets(config, list(cfg.model.lora.target_modules))
    if cfg.algo.routing_replay:
        check_mixture_of_experts(config, model_path, cfg.algo.routing_replay)
    check_memory(cfg, shape)
    return shape  # its context bounds the prompts (preflight)


def check_memory(cfg: RunConfig, shape) -> None:
    """Sizes so large that a step cannot fit here fail now, not at an out-of-memory kill mid-step."""
    responses = cfg.trainer.prompts_per_step * cfg.algo.group_size
    micro_batch = min(cfg.compute.micro_batch_size or responses, responses)
    engine_batch = min(getattr(cfg.rollout, "max_batch_size", 0), responses)  # vLLM bounds its own cache
    needed = step_bytes(shape, responses, micro_batch, response_budget(cfg) + 1, engine_batch)
    available = available_memory_bytes(cfg.hardware.device)
    if available is not None and needed > available:
        raise ConfigError(
            f"a step needs at least {needed / 2 ** 30:.1f} GiB ({responses} responses of up to "
            f"{cfg.rollout.max_new_tokens} tokens, {micro_batch} per training pass, {engine_batch} generated at "
            f"once) but this machine has {available / 2 ** 30:.1f} GiB: lower trainer.prompts_per_step, "
            "algo.group_size or rollout.max_new_tokens, or set compute.micro_batch_size and rollout.max_batch_size")


def check_mixture_of_experts(config, model_path: str, routing_replay) -> None:
    """Routing replay needs routers: read from the model's config.json, before its weights are loaded."""
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        value = str(routing_replay).lower()
        raise ConfigError(f"algo.routing_replay={value} needs a mixture-of-experts model; {model_path} has no MoE "
                          "routers (model=tiny_moe is one)")


def check_reward_functions(scorer: RewardScorer, example: Problem | None) -> None:
    """The user's reward functions can be called as rlft calls them, by keyword, with a training row's
    arguments: an async or generator function, or one that requires an argument rlft does not pass, fails
    here instead of on the first batch."""
    import inspect

    from rlft.rewards import is_import_path
    fields = example.fields if example is not None else {}
    passed = {"prompt", "completion", "answer", "response_tokens", *scorer.settings, *fields}
    for name, fn in [(name, fn) for name, fn, _ in scorer.fns] + [(scorer.accuracy, scorer.accuracy_fn)]:
        if not is_import_path(name):
            continue  # built-ins
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            kind = "a generator function" if inspect.isgeneratorfunction(fn) else "an async function"
            raise ConfigError(f"reward '{name}' is {kind}: a reward function returns its float or dict (a plain def)")
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C function without a signature: called as it is
            continue
        required = [p for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        unknown = [p.name for p in required if p.name not in passed or p.kind is p.POSITIONAL_ONLY]
        if unknown:
            raise ConfigError(f"reward '{name}' requires {', '.join(unknown)}, which rlft does not pass (it passes by "
                              f"name: {', '.join(sorted(passed))})")


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
        f"(<= {responses * response_budget(cfg):,} response tokens)",
        f"      micro_batch_size {micro_batch} -> {passes} forward/backward per optimizer step; "
        f"ppo_epochs {a.ppo_epochs} -> {a.ppo_epochs} optimizer step(s)/step, {a.ppo_epochs * steps} in all",
        f"      {steps} steps over {len(prepared.train)} training prompts "
        f"({steps * t.prompts_per_step / len(prepared.train):.2f} epochs); {len(prepared.held_out)} held-out prompts",
    ]
    if any(prepared.dropped):
        lines.append(f"      dropped {prepared.dropped[0]} training and {prepared.dropped[1]} held-out prompts longer "
                     f"than {prepared.prompt_limit}")
    if prepared.encode.chat:
        lines.append("      prompts rendered with the tokenizer's chat template"
                     + (" and data.system_prompt" if getattr(cfg.data, "system_prompt", None) else ""))
    if cfg.env.multi_turn:
        e = cfg.env
        tools = ", ".join(t.name for t in prepared.episodes.tools) or "none"
        per_turn = f" of <= {e.max_turn_tokens} tokens" if e.max_turn_tokens else ""
        lines.append(f"      episodes: env {e.environment}, up to {e.max_turns} turns{per_turn}, {e.max_tokens} tokens "
                     f"after the prompt; tools: {tools} ({prepared.episodes.format} format, {e.tool_timeout_s:g} s "
                     f"per call)")
    if start_step:
        lines.append(f"      resuming after step {start_step} from {prepared.resume_from}")
    return "\n".join(lines)
