"""The RL loop, in the order of the algorithm (ALGORITHMS.md):

    1-3  sample prompts, generate a group of responses each, score them      rlft.rollout.collect
    4    reference log-probs for the KL penalty (in the loss, or the reward)  the learner
    5    group-relative advantages                                            rlft.algos.advantages
    6    policy update: ppo_epochs optimizer steps over micro-batches         the learner
    7    push the new weights to the rollout engine
    8    log; evaluate and checkpoint when due

`train` checks everything first (rlft.preflight), builds the learner and the engine (in this process, or
as Ray actors: rlft.distributed) and runs the steps. `Loop.step` is one step, top to bottom as above.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf

from rlft.algos.advantages import group_advantages
from rlft.algos.settings import loss_settings, lr_at
from rlft.algos.shaping import kl_in_reward
from rlft.config import RunConfig
from rlft.config.compose import options_line
from rlft.config.env import response_budget
from rlft.config.rollout import partial_chunk
from rlft.data.sampler import PromptSampler
from rlft.errors import Interrupted, NonFiniteUpdates, NonFiniteWeights, RewardError, UserError, WorkerDied
from rlft.learner.local import LocalLearner
from rlft.models.loading import DTYPES, empty_causal_lm
from rlft.preflight import Prepared, RunControls, describe_run, preflight, torch_threads
from rlft.rollout import engine_for
from rlft.run_dir import RunLock, check_unused
from rlft.rollout.collect import Collector, Overlong
from rlft.tooling.allocator import reuse_freed_memory
from rlft.tooling.collapse import COLLAPSE_WINDOW, CollapseReading, CollapseWatch
from rlft.tooling.flops import model_shape, rollout_tokens, step_work
from rlft.tooling.metrics import EVAL_ACCURACY, Stopwatch, collected_row, eval_row, step_row
from rlft.tooling.monitor import Monitor, read_metrics, truncate_metrics
from rlft.tooling.peaks import run_roofs
from rlft.tooling.profiling import StepProfiler
from rlft.types import Learner, RolloutEngine, SamplingParams, TrainBatch, TrainerState, UpdateStats


def train(cfg: RunConfig, run_dir: Path, controls: RunControls = RunControls(),
          options: dict[str, str] | None = None) -> dict:
    """One run into `run_dir`; `options`: the group options it was composed from (kept with its config,
    for resume). Returns the summary (held-out accuracy before and after)."""
    if controls.resume is None:
        check_unused(run_dir)  # a fresh run never writes over (or appends to) another
    prepared = preflight(cfg, controls)  # every check, before any model is loaded
    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir):  # one run at a time in a directory
        if controls.resume is None:
            check_unused(run_dir)  # again, now that no other run can start here
        header = options_line(options) + "\n" if options else ""
        (run_dir / "config.yaml").write_text(header + OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        return _train(cfg, run_dir, controls, prepared)


def _train(cfg: RunConfig, run_dir: Path, controls: RunControls, prepared: Prepared) -> dict:
    torch.set_num_threads(torch_threads(default=len(os.sched_getaffinity(0))))
    reuse_freed_memory()
    torch.manual_seed(cfg.seed)
    cluster = None
    try:
        if cfg.hardware.ray:  # learner ranks and rollout workers as Ray actors
            from rlft.distributed.placement import ActorSetup, RayCluster
            setup = ActorSetup(cfg.hardware, threads=torch_threads(default=cfg.hardware.cpus_per_actor),
                               seed=cfg.seed, bucket_bytes=getattr(cfg.rollout, "sync_bucket_mb", 256) * 2 ** 20)
            cluster = RayCluster(setup, run_dir, partial(LocalLearner, cfg, prepared.model_path),
                                 partial(engine_for, cfg, prepared.model_path), prepared.tokenizer.pad_token_id)
            learner, engine = cluster.learner, cluster.engine
        else:
            learner, engine = LocalLearner(cfg, prepared.model_path), engine_for(cfg, prepared.model_path, cfg.seed)
            if engine_shares_weights(cfg):
                engine.share_weights(learner.policy.model)
        return Loop(cfg, run_dir, prepared, controls, learner, engine).run()
    finally:
        prepared.scorer.close()
        if cluster is not None:
            cluster.shutdown()


def engine_shares_weights(cfg: RunConfig) -> bool:
    """Whether the engine samples from the learner's own weights: a Hugging Face engine in the learner's
    process that only serves the newest weights (no batch generated ahead) in the learner's dtype, with
    no LoRA (it gets merged weights). vLLM, Ray actors and asynchronous runs keep their own copy."""
    return (cfg.rollout.engine == "hf" and not cfg.hardware.ray and cfg.rollout.staleness == 0
            and cfg.model.lora is None and cfg.model.dtype == cfg.model.master_dtype)


class Loop:
    def __init__(self, cfg: RunConfig, run_dir: Path, prepared: Prepared, controls: RunControls, learner: Learner,
                 engine):
        self.cfg, self.run_dir, self.prepared, self.controls, self.learner = cfg, run_dir, prepared, controls, learner
        self.start_step = 0
        state = learner.load_checkpoint(prepared.resume_from) if prepared.resume_from else None
        if state is not None:
            self.start_step = state.step
            torch.set_rng_state(state.torch_rng)
        if controls.resume is not None:  # rows after the checkpoint (all, without one) are logged again
            truncate_metrics(run_dir / "metrics.jsonl", state.step if state is not None else -1)
        self.collector = build_collector(cfg, prepared, engine, sync_point=self.checkpoint_due,
                                         weights_version=self.start_step)
        if state is not None:
            rng = state.rollout_rng  # [workers, S] from a run with several rollout workers
            self.collector.restore(state.sampler_position, rng if cfg.hardware.ray or rng.dim() == 1 else rng[0])
            learner.push_weights(engine)
        self.monitor = Monitor(run_dir, prepared.steps, self.start_step, cfg.logger.console, wandb=self._wandb())
        # perf/: each phase's floor work, and this machine's cached peaks (None: FLOPs only, no fractions)
        self.shape = model_shape(empty_causal_lm(prepared.model_path), DTYPES[cfg.model.dtype].itemsize)
        self.roofs = run_roofs(cfg)
        self.saved = [self.start_step]  # steps checkpointed by this invocation, newest last
        self.nonfinite_streak = 0       # steps in a row whose update was not applied (not finite)
        self.collapse = CollapseWatch(COLLAPSE_WINDOW, cfg.trainer.collapse_drop)
        if self.start_step and (run_dir / "metrics.jsonl").is_file():  # the watch's state is its logged rows:
            self.collapse.replay(read_metrics(run_dir / "metrics.jsonl"))  # resumed, it warns as a straight run
        self.collapsed_at: int | None = None  # the step trainer.stop_on_collapse stopped the run at

    def step(self, step: int) -> bool:
        """One step of the algorithm; True when this invocation stops after it."""
        algo, clock = self.cfg.algo, Stopwatch()

        # ---- 1-3. Sample prompts, generate a group of responses each, score them. Dynamic sampling keeps
        #           only mixed groups; with max_staleness k > 0 this batch was collected during earlier updates.
        groups = self.collector.collect(step)
        collapse = self.collapse.observe(groups.generated_reward_mean)
        if groups.num_groups == 0:  # every group was all-equal: nothing to learn from this step
            self.collector.skip_update(self.learner)
            self.monitor.log(collected_row(step, groups) | collapse.row() | {"perf/step_seconds": clock.total()})
            return self.end_of_step(step, collapse)
        rollout, rewards = groups.rollout, groups.rewards

        # ---- 4. Reference log-probs for the KL penalty: in the loss, or (kl_in_reward) in the reward.
        with clock("ref"):
            ref_logp = self.learner.reference_logprobs(rollout)  # None when kl_coef = 0
        if ref_logp is not None and algo.kl_in_reward:
            rewards = kl_in_reward(rewards, rollout.logprobs, ref_logp, rollout.model_mask, algo.kl_coef,
                                   algo.kl_estimator)
            ref_logp = None

        # ---- 5. Group-relative advantages.
        advantages = group_advantages(rewards, algo.group_size, algo.scale_rewards)

        # ---- 6. Update the policy: ppo_epochs optimizer steps over micro-batches.
        loss_mask = rollout.model_mask  # the tokens the policy sampled: never an observation's
        if algo.mask_truncated:  # overlong filtering: cut-off responses teach nothing
            loss_mask = loss_mask * (~rollout.truncated)[:, None]
        settings = loss_settings(algo, step, max_response_len=response_budget(self.cfg))
        lr = lr_at(step, self.cfg.optim.lr, self.cfg.optim.warmup_steps)
        with clock("train"):
            stats = self.learner.update(TrainBatch(rollout, advantages, loss_mask, ref_logp), settings, lr)
        self.count_nonfinite(step, stats)  # a non-finite update was not applied; too many in a row stop the run
        if warning := self.collapse.observe_update(stats.approx_kl):  # the early old-new KL warning, once
            self.monitor.warn(f"step {step}: {warning}")

        # ---- 7. Push the new weights to the rollout engine (once it has collected the next batch).
        sync, waited = self.collector.push_weights(self.learner)

        # ---- 8. Log; evaluate and checkpoint when due.
        work = step_work(self.shape, rollout_tokens(rollout, groups.num_groups), ppo_epochs=algo.ppo_epochs,
                         reference=algo.kl_coef > 0, weight_grads=self.cfg.model.lora is None)
        self.monitor.log(step_row(step, groups, rewards, stats, sync, waited, settings, lr, clock,
                                  self.learner.peak_memory_mb(), work, self.roofs) | collapse.row())
        return self.end_of_step(step, collapse)

    def run(self) -> dict:
        step = self.start_step
        self.monitor.print(describe_run(self.cfg, self.prepared, self.start_step))
        if self.start_step == 0:
            self.evaluate(0)
        profiler = StepProfiler(self.run_dir, self.controls.profile_steps)
        try:
            for step in range(self.start_step + 1, self.prepared.steps + 1):
                profiler.start(step)
                if self.step(step):
                    break
            profiler.stop()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (rlft.cli turns it into one)
            self.monitor.close()
            raise Interrupted(f"interrupted during step {step}; {self.resume_hint()}") from None
        except OSError as err:  # a full disk, a run directory gone
            self.monitor.close()
            raise UserError(f"{err.strerror or err} ({err.filename or 'writing the run'}) during step {step}; "
                            f"{self.resume_hint()}") from None
        except (RewardError, WorkerDied, NonFiniteWeights, NonFiniteUpdates) as err:
            self.monitor.close()
            raise type(err)(f"{err} [step {step}; {self.resume_hint()}]") from err
        finally:
            self.collector.close()
        if step == self.prepared.steps and self.collapsed_at is None:
            final = self.run_dir / "final_model"
            self.learner.save_model(final)
            self.prepared.tokenizer.save_pretrained(final)
            self.monitor.log_model(final)
        self.monitor.close()
        summary = summarize(self.run_dir, step)
        if self.collapsed_at is not None:
            summary["stopped_on_collapse"] = self.collapsed_at
        self.monitor.print(format_summary(summary))
        return summary

    def count_nonfinite(self, step: int, stats: UpdateStats) -> None:
        if not stats.skipped_updates:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        limit = self.cfg.trainer.max_nonfinite_steps
        message = (f"{stats.nonfinite}: {stats.skipped_updates} of {self.cfg.algo.ppo_epochs} updates not applied "
                   f"({self.nonfinite_streak} such step(s) in a row; trainer.max_nonfinite_steps={limit})")
        if self.nonfinite_streak >= limit:
            raise NonFiniteUpdates(message)  # run() adds the step and the checkpoint to resume from
        self.monitor.warn(f"step {step}: {message}")

    def warn_collapse(self, step: int, collapse: CollapseReading, stop: bool) -> None:
        t = self.cfg.trainer
        what = (f"step {step}: collapse: the task reward's mean over {COLLAPSE_WINDOW} steps, "
                f"{collapse.window_mean:.3f}, is {collapse.drop:.0%} below its best, {collapse.best_window:.3f} "
                f"(trainer.collapse_drop={t.collapse_drop})")
        if stop:
            kept = self.saved[-1]
            where = (f"the checkpoint of step {kept}, the last before the rule fired, is kept (the reward may have "
                     f"begun falling before it)" if kept else "no checkpoint was written")
            self.monitor.warn(f"{what}; stopping (trainer.stop_on_collapse=true): {where}; no final model")
        else:
            self.monitor.warn(f"{what}; going on (trainer.stop_on_collapse=true stops here)")

    def checkpoint_due(self, step: int) -> bool:
        return step % self.cfg.trainer.save_every == 0 or step in (self.prepared.steps, self.controls.exit_after_step)

    def end_of_step(self, step: int, collapse: CollapseReading) -> bool:
        """Held-out evaluation and checkpoint when due; True when this invocation stops here. A step where the
        collapse rule starts firing warns; with trainer.stop_on_collapse it is evaluated and the run stops there,
        without a checkpoint (the last one, from before the collapse, is kept)."""
        stop = collapse.fired and self.cfg.trainer.stop_on_collapse
        if collapse.onset or stop:
            self.warn_collapse(step, collapse, stop)
        if step % self.cfg.trainer.eval_every == 0 or step == self.prepared.steps or stop:
            self.evaluate(step)
        if stop:
            self.collapsed_at = step
            return True
        if self.checkpoint_due(step):
            position, rollout_rng = self.collector.state()
            state = TrainerState(step=step, sampler_position=position, rollout_rng=rollout_rng,
                                 torch_rng=torch.get_rng_state())
            self.learner.save_checkpoint(self.run_dir, state, self.cfg.trainer.keep_checkpoints)
            self.saved.append(step)
        return step == self.controls.exit_after_step

    def evaluate(self, step: int) -> None:
        """Greedy decoding on the held-out problems."""
        self.collector.catch_up(self.learner)  # the learner's current weights, whatever k
        completions, scores, episodes = self.collector.evaluate(self.prepared.held_out, self.cfg.rollout.max_new_tokens)
        self.monitor.log(eval_row(step, self.prepared.held_out, completions, scores, episodes))

    def resume_hint(self) -> str:
        if self.saved[-1] == 0:
            return f"no checkpoint was written yet (rlft train resume={self.run_dir} starts the run again)"
        return f"the checkpoint of step {self.saved[-1]} is intact: rlft train resume={self.run_dir}"

    def _wandb(self):
        if not self.cfg.logger.wandb:
            return None
        from rlft.tooling.wandb_sink import WandbSink
        return WandbSink(self.cfg, self.run_dir)


def build_collector(cfg: RunConfig, prepared: Prepared, engine: RolloutEngine, *,
                    sync_point: Callable[[int], bool] = lambda step: False, weights_version: int = 0) -> Collector:
    """The collector of a run's config, driving `engine`: the trainer's, and `rlft eval`'s (rlft.evaluate),
    so that both evaluate through the same code. `sync_point(step)`: a checkpoint follows that step;
    `weights_version`: the step whose weights the engine holds."""
    algo, rollout, tokenizer = cfg.algo, cfg.rollout, prepared.tokenizer
    overlong = None
    if algo.overlong is not None and algo.overlong.enabled:
        budget = response_budget(cfg)  # an episode's tokens (the model's turns only are counted)
        overlong = Overlong(max_len=budget, penalty=algo.overlong.penalty,
                            buffer=algo.overlong.buffer or max(1, budget // 4))
    return Collector(
        engine, PromptSampler(prepared.train, seed=cfg.seed, shuffle=cfg.data.shuffle), prepared.encode,
        partial(tokenizer.batch_decode, skip_special_tokens=True), prepared.scorer.score,
        SamplingParams(n=algo.group_size, temperature=rollout.temperature, top_p=rollout.top_p,
                       max_new_tokens=rollout.max_new_tokens),
        tokenizer.pad_token_id, prompts_per_step=cfg.trainer.prompts_per_step,
        dynamic_sampling=algo.dynamic_sampling, max_sampling_rounds=algo.max_sampling_rounds, overlong=overlong,
        max_staleness=rollout.staleness, sync_point=sync_point, sleep=getattr(rollout, "enable_sleep_mode", False),
        weights_version=weights_version, chunk_tokens=partial_chunk(cfg),
        episodes=prepared.episodes.runner(engine) if prepared.episodes is not None else None)


def summarize(run_dir: Path, last_step: int) -> dict:
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"] \
        if (run_dir / "metrics.jsonl").is_file() else []
    summary = {"run_dir": str(run_dir), "last_step": last_step}
    if evals:
        summary |= {"accuracy_before": evals[0][EVAL_ACCURACY], "accuracy_after": evals[-1][EVAL_ACCURACY],
                    "eval_step_after": evals[-1]["step"]}
    return summary


def format_summary(summary: dict) -> str:
    lines = []
    if "accuracy_before" in summary:
        gain = 100 * (summary["accuracy_after"] - summary["accuracy_before"])
        lines.append(f"held-out accuracy: {summary['accuracy_before']:.3f} (step 0) -> "
                     f"{summary['accuracy_after']:.3f} (step {summary['eval_step_after']}), {gain:+.1f} points")
    if "stopped_on_collapse" in summary:
        lines.append(f"stopped at step {summary['stopped_on_collapse']}: collapse (trainer.stop_on_collapse)")
    lines.append(f"run directory: {summary['run_dir']}")
    return "\n".join(lines)
