"""Weights & Biases for a run (logger=wandb): the resolved config and the group options (`options.algo`),
every metrics.jsonl row under the same names and step, eval samples as a table, the final model as an artifact when asked.

The W&B run id is kept in the run directory, so `resume=` continues the same W&B run. WANDB_MODE=offline
(or logger.mode=offline) writes it under runs/DIR/wandb/ with no network; `wandb sync` uploads it later.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from omegaconf import OmegaConf

from rlft.config.compose import saved_options

SAMPLE_COLUMNS = ["prompt", "completion", "answer", "reward"]


class WandbSink:
    def __init__(self, cfg, run_dir: Path):
        import wandb
        self._wandb = wandb
        self.upload_model = cfg.logger.log_model
        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        logger = cfg.logger
        self.run = wandb.init(
            project=logger.project, entity=logger.entity, group=logger.group, tags=list(logger.tags) or None,
            name=logger.name or run_dir.name, mode=logger.mode, dir=str(run_dir), id=run_id, resume="allow",
            config=OmegaConf.to_container(OmegaConf.structured(cfg))
            | {"options": saved_options(run_dir / "config.yaml")},
            settings=wandb.Settings(silent=True))
        # Every metric is plotted against rlft's step (W&B's own step counter is not the RL step).
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, row: dict) -> None:
        metrics = {k: v for k, v in row.items() if k != "kind" and not isinstance(v, (list, dict))}
        if "eval/samples" in row:
            table = self._wandb.Table(columns=SAMPLE_COLUMNS)
            for sample in row["eval/samples"]:
                table.add_data(*(sample.get(c) for c in SAMPLE_COLUMNS))
            metrics["eval/samples"] = table
        self.run.log(metrics)

    def log_model(self, path: Path) -> None:
        if self.upload_model:
            artifact = self._wandb.Artifact(f"model-{self.run.id}", type="model")
            artifact.add_dir(str(path))
            self.run.log_artifact(artifact)

    def finish(self) -> None:
        self.run.finish()
