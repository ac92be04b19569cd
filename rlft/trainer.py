"""The RL loop, in the order of the algorithm (ALGORITHMS.md):

    sample prompts -> generate a group of responses each -> score -> group advantages
    -> policy update (ppo_epochs x micro-batches) -> push weights to the rollout engine
    -> log, evaluate, checkpoint
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlft.algos.advantages import group_advantages
from rlft.algos.losses import kl_penalty
from rlft.collect import CollectAhead, Overlong, ScoredGroups, collect_groups
from rlft.checkpoint import TrainerState, latest_checkpoint
from rlft.config import RunConfig, validate
from rlft.data import load_task
from rlft.data.prompts import PromptEncoder, drop_long_prompts
from rlft.data.sampler import PromptSampler
from rlft.data.types import Problem
from rlft.errors import ConfigError, RewardError, WorkerDied
from rlft.learner.learner import TrainBatch
from rlft.learner.worker import LearnerWorker
from rlft.models.loading import load_tokenizer, resolve_model_path
from rlft.monitor import Monitor, read_metrics, truncate_metrics
from rlft.profiling import StepProfiler
from rlft.wandb_sink import WandbSink
from rlft.rewards.scorer import RewardScorer
from rlft.rollout import build_engine
from rlft.rollout.base import RolloutEngine, SamplingParams


def train(cfg: RunConfig, run_dir: Path) -> dict:
    # ---- Check everything the user gave before any work.
    validate(cfg)
    model_path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    train_problems, held_out = load_task(cfg.data)
    scorer = RewardScorer(cfg.reward, max_response_tokens=cfg.rollout.max_new_tokens)
    resume_from = latest_checkpoint(Path(cfg.resume)) if cfg.resume else None
    if cfg.hardware.device == "cuda" and not cfg.hardware.ray and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but torch sees no GPU here (hardware=cpu runs on the CPU)")

    # ---- Build the parts: learner and rollout engine in this process, or as Ray actors (hardware.ray).
    torch.set_num_threads(cfg.hardware.num_threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(cfg.seed)
    device = cfg.hardware.device
    tokenizer = load_tokenizer(model_path)
    encode = PromptEncoder(tokenizer, cfg.data.chat_template, cfg.data.system_prompt)
    train_problems, dropped_train = drop_long_prompts(train_problems, encode, cfg.data.max_prompt_tokens, "training")
    held_out, dropped_eval = drop_long_prompts(held_out, encode, cfg.data.max_prompt_tokens, "held-out")
    cfg.trainer.steps = steps_for(cfg.trainer, len(train_problems))  # the schedule, checkpoints and logs count steps
    run_dir.mkdir(parents=True, exist_ok=True)
    cluster = None
    if cfg.hardware.ray:
        from rlft.cluster import RayCluster
        cluster = RayCluster(cfg, model_path, run_dir)
        learner, engine = cluster.learner, cluster.engine
    else:
        learner = LearnerWorker(cfg, model_path)
        engine = build_engine(cfg.rollout, model_path, cfg.model.dtype, device, tokenizer, seed=cfg.seed,
                              return_routes=cfg.algo.routing_source == "rollout")
    try:
        return _run(cfg, run_dir, learner, engine, tokenizer, encode, train_problems, held_out, scorer, resume_from,
                    dropped=(dropped_train, dropped_eval))
    finally:
        scorer.close()
        if cluster is not None:
            cluster.shutdown()


def _run(cfg: RunConfig, run_dir: Path, learner, engine: RolloutEngine, tokenizer, encode: PromptEncoder,
         train_problems, held_out, scorer: RewardScorer, resume_from, dropped: tuple[int, int]) -> dict:
    algo, rollout_cfg, trainer_cfg = cfg.algo, cfg.rollout, cfg.trainer
    sampler = PromptSampler(train_problems, seed=cfg.seed, shuffle=cfg.data.shuffle)
    sampling = SamplingParams(n=algo.group_size, temperature=rollout_cfg.temperature,
                              top_p=rollout_cfg.top_p, max_new_tokens=rollout_cfg.max_new_tokens)
    batch_size = trainer_cfg.prompts_per_step * algo.group_size
    micro_batch = min(algo.micro_batch_size or batch_size, batch_size)
    overlong = None
    if algo.overlong.enabled:
        overlong = Overlong(max_len=rollout_cfg.max_new_tokens, penalty=algo.overlong.penalty,
                            buffer=algo.overlong.buffer or max(1, rollout_cfg.max_new_tokens // 4))

    def decode(ids: torch.Tensor) -> list[str]:
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    start_step = 0
    if resume_from is not None:
        state = learner.load_checkpoint(resume_from)
        sampler.position = state.sampler_position
        rollout_rng = state.rollout_rng  # [workers, S] from a run with several rollout workers
        engine.set_rng_state(rollout_rng if cfg.hardware.ray or rollout_rng.dim() == 1 else rollout_rng[0])
        torch.set_rng_state(state.torch_rng)
        start_step = state.step
        truncate_metrics(run_dir / "metrics.jsonl", start_step)
        learner.push_weights(engine)
    monitor = Monitor(run_dir, trainer_cfg.steps, start_step, cfg.logger.console, cfg.logger.jsonl,
                      wandb=WandbSink(cfg, run_dir) if cfg.logger.wandb else None)
    monitor.print(describe_batch(cfg, len(train_problems), len(held_out), micro_batch, start_step, dropped,
                                 chat=encode.chat))
    if start_step == 0:
        monitor.log(evaluate(engine, tokenizer, encode, held_out, rollout_cfg.max_new_tokens, scorer, step=0))

    saved = [start_step]  # steps checkpointed by this invocation, newest last

    def collect() -> ScoredGroups:
        return collect_groups(
            sampler, engine, encode, decode, scorer.score, sampling, tokenizer.pad_token_id,
            prompts_per_step=trainer_cfg.prompts_per_step, dynamic_sampling=algo.dynamic_sampling,
            max_sampling_rounds=algo.max_sampling_rounds, overlong=overlong)

    # Learner updates in the learner's weights and in the engine's (they differ while a batch is collected ahead).
    learner_version = engine_version = start_step
    ahead = CollectAhead(collect) if rollout_cfg.async_steps else None

    def checkpoint_due(step: int) -> bool:
        return step % trainer_cfg.save_every == 0 or step in (trainer_cfg.steps, trainer_cfg.exit_after_step)

    def evaluate_and_checkpoint(step: int) -> bool:
        """The end of every step: held-out eval and checkpoint when due. True when this invocation stops."""
        if step % trainer_cfg.eval_every == 0 or step == trainer_cfg.steps:
            if ahead is not None:
                ahead.wait()  # the engine may still be collecting the next batch
            monitor.log(evaluate(engine, tokenizer, encode, held_out, rollout_cfg.max_new_tokens, scorer, step))
        if checkpoint_due(step):
            state = TrainerState(step=step, sampler_position=sampler.position,
                                 rollout_rng=engine.rng_state(), torch_rng=torch.get_rng_state())
            learner.save_checkpoint(run_dir, state, trainer_cfg.keep_checkpoints)
            saved.append(step)
        return step == trainer_cfg.exit_after_step

    step = start_step
    profiler = StepProfiler(run_dir, trainer_cfg.profile_steps)
    try:
        for step in range(start_step + 1, trainer_cfg.steps + 1):
            profiler.start(step)
            step_start = time.perf_counter()
            learner.set_lr(lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps))

            # ---- 1-3. Sample prompts, generate a group of responses each, score them
            #           (with dynamic sampling: only groups with mixed rewards, sampling again to fill).
            #           async_steps=1: this batch was collected during the last update, and the next one
            #           is collected during this update, both one version behind the learner. Not across a
            #           checkpoint, so that resume starts from the same state as the run went on with.
            if ahead is not None and ahead.pending:
                scored = ahead.take()
            else:
                scored = collect()
                scored.weights_version = engine_version
            if ahead is not None and not checkpoint_due(step):
                ahead.start(engine_version)
            rollout, rewards = scored.rollout, scored.rewards
            if rollout_cfg.enable_sleep_mode:  # colocated: give the GPU memory to the learner until the sync
                engine.sleep()
            row = {"step": step, "rollout/sampling_rounds": scored.rounds,
                   "rollout/dropped_groups": scored.dropped_groups, "rollout/groups": scored.num_groups,
                   "rollout/staleness": learner_version - scored.weights_version,
                   "perf/generate_seconds": scored.seconds["generate"],
                   "perf/reward_seconds": scored.seconds["reward"]}
            if scored.num_groups == 0:  # every group was all-equal: nothing to learn from this step
                monitor.log(row | {"perf/step_seconds": time.perf_counter() - step_start})
                if evaluate_and_checkpoint(step):
                    break
                continue

            # ---- 4. Reference log-probs for the KL penalty (in the loss, or in the reward).
            t = time.perf_counter()
            ref_logp = learner.reference_logprobs(rollout, rollout_cfg.temperature)  # None when kl_coef = 0
            if ref_logp is not None:
                if algo.kl_in_reward:
                    kl = kl_penalty(rollout.logprobs, ref_logp, algo.kl_estimator) * rollout.response_mask
                    rewards = rewards - algo.kl_coef * kl.sum(-1)
            ref_seconds = time.perf_counter() - t

            # ---- 5. Group-relative advantages.
            advantages = group_advantages(rewards, algo.group_size, algo.scale_rewards)

            # ---- 6. Update the policy: ppo_epochs optimizer steps over micro-batches.
            t = time.perf_counter()
            loss_mask = rollout.response_mask
            if algo.mask_truncated:  # overlong filtering: cut-off responses teach nothing
                loss_mask = loss_mask * (~rollout.truncated)[:, None]
            batch = TrainBatch(prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask,
                               response_ids=rollout.response_ids, response_mask=rollout.response_mask,
                               loss_mask=loss_mask, advantages=advantages, rollout_logprobs=rollout.logprobs,
                               ref_logprobs=ref_logp, routes=rollout.routes)
            train_metrics = learner.update(
                batch, ppo_epochs=algo.ppo_epochs, micro_batch_size=micro_batch,
                temperature=rollout_cfg.temperature, max_response_len=rollout_cfg.max_new_tokens,
                loss_settings=loss_settings(algo, step))
            train_seconds = time.perf_counter() - t
            learner_version += 1

            # ---- 7. Push the new weights to the rollout engine (once it has collected the next batch).
            collect_wait_seconds = ahead.wait() if ahead is not None else 0.0
            sync = learner.push_weights(engine)
            engine_version = learner_version

            # ---- 8. Log, evaluate, checkpoint.
            lengths = rollout.response_lengths.float()
            row |= {"train/reward_mean": rewards.mean().item(), "train/reward_std": rewards.std().item(),
                   "train/accuracy": scored.correct.mean().item(),
                   **{f"reward/{k}": v.mean().item() for k, v in scored.reward_parts.items()},
                   "reward/errors": scored.reward_errors,
                   "train/clip_frac": train_metrics.get("clip_frac_low", 0.0) + train_metrics.get("clip_frac_high", 0.0),
                   **{k if "/" in k else f"train/{k}": v for k, v in train_metrics.items()  # moe/...: as named
                      if not k.startswith("logprob_diff")},
                   "train/lr": learner.lr,
                   "rollout/response_len_mean": lengths.mean().item(),
                   "rollout/response_len_max": lengths.max().item(),
                   "rollout/truncated_frac": rollout.truncated.float().mean().item(),
                   "rollout/logprob_diff_mean": train_metrics["logprob_diff_mean"],
                   "rollout/logprob_diff_max": train_metrics["logprob_diff_max"],
                   "rollout/tokens": int(rollout.response_mask.sum()),
                   "sync/seconds": sync.seconds, "sync/bytes": sync.bytes,
                   "perf/ref_seconds": ref_seconds, "perf/train_seconds": train_seconds,
                   "perf/collect_wait_seconds": collect_wait_seconds,  # async_steps: the next batch's lag
                   # old log-probs come from the first epoch's forward passes: no time of their own
                   "perf/generate_tokens_per_s": lengths.sum().item() / max(scored.seconds["generate"], 1e-9),
                   "perf/train_tokens_per_s": train_metrics["tokens"] / max(train_seconds, 1e-9),
                   "perf/step_seconds": time.perf_counter() - step_start,
                   "perf/peak_rss_mb": learner.peak_memory_mb()}  # the learner's (largest rank's)
            monitor.log(row)
            if evaluate_and_checkpoint(step):
                break
        profiler.stop()
    except KeyboardInterrupt:
        monitor.close()
        raise SystemExit(f"\ninterrupted during step {step}; {_resume_hint(run_dir, saved[-1])}") from None
    except (RewardError, WorkerDied) as err:
        monitor.close()
        raise type(err)(f"{err} [step {step}; {_resume_hint(run_dir, saved[-1])}]") from err
    finally:
        if ahead is not None:
            ahead.close()

    if step == trainer_cfg.steps:
        learner.save_model(run_dir / "final_model")
        tokenizer.save_pretrained(run_dir / "final_model")
        monitor.log_model(run_dir / "final_model")
    monitor.close()
    summary = summarize(run_dir, step)
    monitor.print(format_summary(summary))
    return summary


def _resume_hint(run_dir: Path, last_saved: int) -> str:
    if last_saved == 0:
        return "no checkpoint was written yet"
    return f"the checkpoint of step {last_saved} is intact: rlft train resume={run_dir}"


def steps_for(trainer_cfg, train_size: int) -> int:
    """trainer.steps, or enough steps for trainer.epochs passes over the training prompts (rounded up)."""
    if trainer_cfg.epochs is None:
        return trainer_cfg.steps
    return math.ceil(trainer_cfg.epochs * train_size / trainer_cfg.prompts_per_step)


def lr_at(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over the first `warmup_steps` steps (1-based), constant after."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps > 0 else lr


def loss_settings(algo, step: int) -> dict:
    """The keyword arguments of rlft.algos.losses.policy_loss for this step, from the algo config."""
    return dict(ratio_level=algo.ratio_level, eps_low=algo.eps_low, eps_high=eps_high_at(step, algo),
                clip_ratio_c=algo.clip_ratio_c, loss_agg=algo.loss_agg,
                kl_coef=0.0 if algo.kl_in_reward else algo.kl_coef, kl_estimator=algo.kl_estimator,
                tis_cap=algo.tis_cap)


def eps_high_at(step: int, algo) -> float:
    """eps_high at this step: constant, or moving to schedule.end over schedule.steps (clip-higher)."""
    schedule = algo.eps_high_schedule
    if schedule is None:
        return algo.eps_high
    progress = min(1.0, step / max(1, schedule.steps))
    if schedule.kind == "cosine":
        progress = 0.5 * (1 - torch.cos(torch.tensor(progress * torch.pi)).item())
    return algo.eps_high + (schedule.end - algo.eps_high) * progress


@torch.no_grad()
def evaluate(engine: RolloutEngine, tokenizer, encode, problems: list[Problem], max_new_tokens: int,
             scorer: RewardScorer, step: int) -> dict:
    """Greedy decoding on the held-out problems: accuracy (reward.accuracy) and the configured reward."""
    rollout = engine.generate([encode(p.prompt) for p in problems],
                              SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens))
    completions = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    scores = scorer.score(problems, completions, rollout.response_lengths.tolist())
    rewards = scores.total.tolist()
    return {"step": step, "kind": "eval", "eval/accuracy": scores.correct.mean().item(),
            "eval/reward_mean": scores.total.mean().item(), "eval/size": len(problems),
            "eval/samples": [{"prompt": p.prompt, "completion": c, "answer": p.answer, "reward": r}
                             for p, c, r in list(zip(problems, completions, rewards))[:4]]}


def describe_batch(cfg: RunConfig, train_size: int, eval_size: int, micro_batch: int, start_step: int,
                   dropped: tuple[int, int] = (0, 0), chat: bool = False) -> str:
    """The derived batch numbers, in rlft's one vocabulary, printed once at start."""
    a, t = cfg.algo, cfg.trainer
    responses = t.prompts_per_step * a.group_size
    passes = -(-responses // micro_batch)
    lines = [
        f"rlft: {t.prompts_per_step} prompts/step x group_size {a.group_size} = {responses} responses/step "
        f"(<= {responses * cfg.rollout.max_new_tokens:,} response tokens)",
        f"      micro_batch_size {micro_batch} -> {passes} forward/backward per optimizer step; "
        f"ppo_epochs {a.ppo_epochs} -> {a.ppo_epochs} optimizer step(s)/step, {a.ppo_epochs * t.steps} in all",
        f"      {t.steps} steps over {train_size} training prompts "
        f"({t.steps * t.prompts_per_step / train_size:.2f} epochs); {eval_size} held-out prompts",
    ]
    if any(dropped):
        lines.append(f"      dropped {dropped[0]} training and {dropped[1]} held-out prompts longer than "
                     f"data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    if chat:
        lines.append("      prompts rendered with the tokenizer's chat template"
                     + (" and data.system_prompt" if cfg.data.system_prompt else ""))
    if start_step:
        lines.append(f"      resuming after step {start_step} from {cfg.resume}")
    return "\n".join(lines)


def summarize(run_dir: Path, last_step: int) -> dict:
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"] \
        if (run_dir / "metrics.jsonl").is_file() else []
    summary = {"run_dir": str(run_dir), "last_step": last_step}
    if evals:
        summary |= {"accuracy_before": evals[0]["eval/accuracy"], "accuracy_after": evals[-1]["eval/accuracy"],
                    "eval_step_after": evals[-1]["step"]}
    return summary


def format_summary(summary: dict) -> str:
    lines = []
    if "accuracy_before" in summary:
        gain = 100 * (summary["accuracy_after"] - summary["accuracy_before"])
        lines.append(f"held-out accuracy: {summary['accuracy_before']:.3f} (step 0) -> "
                     f"{summary['accuracy_after']:.3f} (step {summary['eval_step_after']}), {gain:+.1f} points")
    lines.append(f"run directory: {summary['run_dir']}")
    return "\n".join(lines)
