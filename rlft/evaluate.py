"""`rlft eval`: one set of weights on a task's held-out problems, through the trainer's own evaluation
(rlft.trainer.build_collector, Collector.evaluate, eval_row), so that it gives the numbers a run logs for
the same weights. Greedy: accuracy and the reward's mean; with `samples` k > 0, k sampled completions per
problem as well: pass@k and the sampled accuracy and reward (rlft.tooling.metrics.sampled_row).

What is evaluated (`Target`): a run directory's final_model (else its newest checkpoint), one checkpoint
(RUN/checkpoints/step_N, its weights loaded as resume loads them), or with no target model.path itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from rlft.checkpoint import FILES, checkpoint_problem, latest_checkpoint
from rlft.config import RunConfig
from rlft.errors import ConfigError
from rlft.learner.local import LocalLearner
from rlft.preflight import preflight, torch_threads
from rlft.rollout import engine_for
from rlft.tooling.allocator import reuse_freed_memory
from rlft.tooling.metrics import eval_row, sampled_row
from rlft.trainer import build_collector
from rlft.types import RolloutEngine


@dataclass(frozen=True)
class Target:
    """What `rlft eval TARGET` evaluates, read from a run directory's layout."""
    run_dir: Path              # its config.yaml is the evaluation's config
    checkpoint: Path | None    # RUN/checkpoints/step_N; None: RUN/final_model

    def weights(self) -> Path:
        return self.checkpoint or self.run_dir / "final_model"

    def configured(self, cfg: RunConfig) -> RunConfig:
        """The run's config for these weights. final_model holds the merged weights (LocalLearner.save_model)
        as a Hugging Face folder: it is evaluated as model.path, with LoRA off."""
        if self.checkpoint is not None:
            return cfg
        return replace(cfg, model=replace(cfg.model, path=str(self.weights()), lora=None))

    def default_out(self) -> Path:
        """RUN/eval.json for the final model, RUN/eval_step_N.json for a checkpoint."""
        if self.checkpoint is None:
            return self.run_dir / "eval.json"
        return self.run_dir / f"eval_{self.checkpoint.name}.json"


@dataclass
class EvalResult:
    weights: str                # what was evaluated: a model path, a final_model or a checkpoint folder
    step: int | None            # the checkpoint's training step; None for a model folder
    metrics: dict[str, float]   # eval_row's eval/ numbers, and sampled_row's with samples
    problems: list[dict]        # every held-out problem, greedily: prompt, completion, answer, reward, correct


def find_target(path: Path) -> Target:
    """A run directory (config.yaml: its final_model, else its newest whole checkpoint) or one of its
    checkpoints (RUN/checkpoints/step_N, the run's config two levels up)."""
    if not path.exists():
        raise ConfigError(f"no such run directory or checkpoint: {path}")
    if (path / "config.yaml").is_file():
        if (path / "final_model" / "config.json").is_file():
            return Target(path, None)
        newest = latest_checkpoint(path)
        if newest is None:
            raise ConfigError(f"{path} has no final_model and no checkpoint yet: nothing to evaluate")
        return Target(path, newest)
    if path.is_dir() and (path.parent.name == "checkpoints" or any((path / name).is_file() for name in FILES)):
        run_dir = path.parent.parent
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"checkpoint {path} is not in a run directory ({run_dir}/config.yaml "
                              "missing): its config is needed to evaluate it")
        problem = checkpoint_problem(path)
        if problem:
            raise ConfigError(f"checkpoint {path} is not usable ({problem})")
        return Target(run_dir, path)
    raise ConfigError(f"{path} is neither a run directory (config.yaml) nor a checkpoint "
                      "(RUN/checkpoints/step_N); evaluate a model folder with rlft eval model.path=DIR")


def evaluate(cfg: RunConfig, checkpoint: Path | None = None, samples: int = 0) -> EvalResult:
    """model.path, or `checkpoint`'s weights on top of it, on the held-out problems of cfg's task."""
    prepared = preflight(cfg)  # the trainer's checks, model and held-out set
    if cfg.hardware.ray:
        raise ConfigError("rlft eval runs in this one process: name a one-process placement (hardware=cpu, or "
                          "hardware=1gpu_colocated on a GPU); a checkpoint loads on any placement")
    torch.set_num_threads(torch_threads(default=len(os.sched_getaffinity(0))))  # as the trainer's: same kernels
    reuse_freed_memory()
    torch.manual_seed(cfg.seed)
    try:
        engine = engine_for(cfg, prepared.model_path, cfg.seed)
        step = load_checkpoint_into(engine, cfg, prepared.model_path, checkpoint) if checkpoint else None
        collector = build_collector(cfg, prepared, engine)
        try:
            completions, scores, episodes = collector.evaluate(prepared.held_out, cfg.rollout.max_new_tokens)
            row = eval_row(step or 0, prepared.held_out, completions, scores, episodes)
            metrics = {key: value for key, value in row.items() if key.startswith("eval/") and key != "eval/samples"}
            if samples:
                _, sampled, _ = collector.sample(prepared.held_out, samples)
                metrics |= sampled_row(samples, sampled)
        finally:
            collector.close()
    finally:
        prepared.scorer.close()
    problems = [{"prompt": p.prompt, "completion": c, "answer": p.answer, "reward": r, "correct": bool(ok)}
                for p, c, r, ok in zip(prepared.held_out, completions, scores.total.tolist(), scores.correct.tolist())]
    weights = str(checkpoint) if checkpoint else cfg.model.path
    return EvalResult(weights=weights, step=step, metrics=metrics, problems=problems)


def load_checkpoint_into(engine: RolloutEngine, cfg: RunConfig, model_path: str, folder: Path) -> int:
    """A checkpoint's weights into the engine, as resume loads them: a learner reads the full state and
    pushes what an engine gets (LoRA merged, in the engine's dtype). Its step."""
    no_reference = replace(cfg, algo=replace(cfg.algo, kl_coef=0.0))  # the policy alone is evaluated
    learner = LocalLearner(no_reference, model_path)
    step = learner.load_checkpoint(folder).step
    learner.push_weights(engine)
    return step


def write_json(result: EvalResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=1) + "\n")


def report(result: EvalResult, show: int) -> str:
    """The metrics as a table, then the first `show` held-out problems, each cell on one shortened line."""
    step = f" (step {result.step})" if result.step is not None else ""
    width = max(len(key) for key in ["metric", *result.metrics])
    lines = [f"weights: {result.weights}{step}", "", f"{'metric':{width}}  value"]
    for key, value in result.metrics.items():
        lines.append(f"{key:{width}}  {value:.4f}" if isinstance(value, float) else f"{key:{width}}  {value}")
    rows = [[_cell(p["prompt"], 40), _cell(p["completion"], 40), _cell(p["answer"], 16), f"{p['reward']:.3f}"]
            for p in result.problems[:show]]
    if rows:
        header = ["prompt", "completion", "answer", "reward"]
        widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
        lines += ["", *(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                        for row in [header, *rows])]
    return "\n".join(lines)


def _cell(text: str, width: int) -> str:
    """`text` on one line, its middle cut out past `width` (a prompt's question and a completion's answer
    are at their ends)."""
    flat = " ".join(str(text).split())
    if len(flat) <= width:
        return flat
    half = (width - 1) // 2
    return flat[:half] + "…" + flat[len(flat) - (width - 1 - half):]
