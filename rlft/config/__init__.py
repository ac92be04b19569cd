"""The typed run config. Each group of conf/ has a module here with its options' schemas (dataclasses, a
docstring per field: `rlft train --help KEY` prints it) and its `check`, the validation types cannot
express. Hydra composes the YAML onto these schemas, registered in its ConfigStore (rlft.config.compose).

    algo      one schema, presets in conf/algo/ (GRPO's defaults; dapo.yaml, gspo.yaml list the rest)
    model     one schema, presets in conf/model/
    data, reward, env, rollout, hardware, logger: a schema per option (a key of another option is refused)
    trainer, optim, compute: sections of conf/config.yaml
"""

from __future__ import annotations

from rlft.config import algo, data, env, hardware, logger, model, reward, rollout, run
from rlft.config.checks import every_number_finite
from rlft.config.run import RunConfig

GROUPS = ("algo", "model", "data", "reward", "env", "rollout", "hardware", "logger")
# Whole-run presets (conf/experiment/NAME.yaml, `experiment=NAME`): chosen like a group's option, they set
# the options and keys of every group. Not a section of the config.
EXPERIMENT = "experiment"

# ConfigStore entries "schema/<group>/<name>" that the option YAMLs extend (`defaults: [/schema/...@_here_]`)
SCHEMAS = {
    "schema/algo": algo.AlgoConfig,
    "schema/model": model.ModelConfig,
    "schema/data/arithmetic": data.ArithmeticData,
    "schema/data/countdown": data.CountdownData,
    "schema/data/multistep": data.MultistepData,
    "schema/data/reasoning_gym": data.ReasoningGymData,
    "schema/data/humaneval": data.HumanEvalData,
    "schema/data/dataset": data.DatasetData,
    "schema/data/calculator": data.CalculatorData,
    "schema/env/none": env.NoEnv,
    "schema/env/tools": env.EnvConfig,
    "schema/reward/basic": reward.RewardConfig,
    "schema/reward/formatted": reward.FormattedReward,
    "schema/reward/code_tests": reward.CodeTestsReward,
    "schema/rollout/hf": rollout.HFRollout,
    "schema/rollout/vllm": rollout.VLLMRollout,
    "schema/hardware/local": hardware.LocalHardware,
    "schema/hardware/ray": hardware.RayHardware,
    "schema/logger/console": logger.ConsoleLogger,
    "schema/logger/wandb": logger.WandbLogger,
}

CHECKS = (algo.check, model.check, data.check, reward.check, env.check, rollout.check, hardware.check,
          run.check)


def validate(cfg: RunConfig) -> None:
    """Every check of the config alone (no files, no devices: rlft.preflight does those); raises
    ConfigError naming the key and what is allowed."""
    for check in CHECKS:  # their messages give the allowed range
        check(cfg)
    every_number_finite(cfg)  # NaN and infinities in the keys no range bounds


__all__ = ["EXPERIMENT", "GROUPS", "SCHEMAS", "RunConfig", "validate"]
