"""`rlft` command line. `rlft train [overrides...]` is a Hydra app over conf/ (see conf/config.yaml).

Config mistakes (unknown key, wrong type, unknown group option, missing model or data file) end the
command with one line naming the problem and what is allowed, before any work starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

USAGE = """usage: rlft train [KEY=VALUE ...] [GROUP=OPTION ...] [-m] [--cfg job]

  rlft train                          the default run (GRPO on the built-in addition task)
  rlft train algo.lr=... trainer.steps=50
  rlft train --cfg job                print the composed config and exit
  rlft train --profile                a torch.profiler trace of step 2 in RUN_DIR/profile
  rlft train resume=runs/DIR          continue a run from its last checkpoint
  rlft train -m seed=0,1,2            a Hydra multirun sweep
  rlft compare DIR [DIR...] [-o PNG]  plot and tabulate runs (a sweep directory or run directories)
"""


def config_dir() -> str:
    """conf/ inside an installed wheel (rlft/conf), else the checkout's top-level conf/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise SystemExit(f"rlft: error: cannot find conf/config.yaml next to {here}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_command(rest)
    if command == "compare":
        return compare_command(rest)
    print(f"rlft: error: unknown command '{command}'\n{USAGE}", file=sys.stderr)
    return 2


def train_command(overrides: list[str]) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig, OmegaConf

    from rlft.config import RunConfig, register_schemas
    from rlft.errors import UserError, WorkerDied

    register_schemas()
    quiet_transformers()
    if "--profile" in overrides:  # sugar for the config key: step 1 includes one-time warm-up
        overrides = [o for o in overrides if o != "--profile"] + ["trainer.profile_steps=[2]"]
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    if resume:  # a resumed run continues in its own directory
        if not (Path(resume) / "config.yaml").is_file():
            return _fail(f"resume='{resume}': no config.yaml there (is it an rlft run directory?)")
        overrides = overrides + [f"hydra.run.dir={resume}"]

    swept = swept_keys(overrides)

    @hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")
    def hydra_app(dcfg: DictConfig) -> float | None:
        from rlft.trainer import train
        try:
            if dcfg.resume:
                dcfg = _resumed_config(dcfg, HydraConfig.get().overrides.task)
            cfg: RunConfig = OmegaConf.to_object(dcfg)
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                label_sweep_run(cfg, HydraConfig.get(), swept)
            summary = train(cfg, Path(HydraConfig.get().runtime.output_dir))
        except (UserError, WorkerDied) as err:
            raise _UserFailure(str(err)) from None  # a BaseException: Hydra lets it through unprinted
        return summary.get("accuracy_after")

    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us, and we print them as one line
    sys.argv = ["rlft train", *overrides]
    try:
        hydra_app()
    except _UserFailure as failure:
        return _fail(str(failure))
    except Exception as err:  # only Hydra/OmegaConf config errors are reworded; anything else is a bug
        message = describe_config_error(err)
        if message is None:
            raise
        return _fail(message)
    return 0


def compare_command(args: list[str]) -> int:
    import argparse

    from rlft.compare import compare
    from rlft.errors import UserError

    parser = argparse.ArgumentParser(prog="rlft compare", description="plot and tabulate rlft runs")
    parser.add_argument("paths", nargs="+", type=Path, help="a multirun directory, or run directories")
    parser.add_argument("-o", "--out", type=Path, help="the PNG (default: comparison.png in the sweep "
                                                         "directory, or here)")
    options = parser.parse_args(args)
    try:
        png, table = compare(options.paths, options.out)
    except UserError as err:
        return _fail(str(err))
    print(f"{table}\n\nfigure: {png}")
    return 0


class _UserFailure(BaseException):
    """A UserError raised inside the Hydra job, carried out past Hydra's own error report."""


def swept_keys(overrides: list[str]) -> set[str]:
    """Keys a multirun sweeps over: `key=a,b`, `key=range(...)`, `key=choice(...)`."""
    keys = set()
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if "," in value or value.startswith(("range(", "choice(", "interval(")):
            keys.add(key)
    return keys


def label_sweep_run(cfg, hydra_cfg, swept: set[str]) -> None:
    """One W&B group per sweep (its directory's name) and the run's swept values as tags, so the runs of
    `rlft train -m algo=grpo,dapo seed=0,1` group by algo in the W&B UI."""
    if cfg.logger.group is None:
        cfg.logger.group = f"sweep-{Path(hydra_cfg.sweep.dir).name}"
    for item in hydra_cfg.overrides.task:
        if item.lstrip("+~").split("=", 1)[0] in swept and item not in cfg.logger.tags:
            cfg.logger.tags.append(item)


def _resumed_config(dcfg, task_overrides):
    """The resumed run's saved config, with this command's key=value overrides on top."""
    from omegaconf import OmegaConf

    from rlft.config import GROUPS, RunConfig
    from rlft.errors import ConfigError

    run_dir = Path(dcfg.resume)
    saved = run_dir / "config.yaml"
    dotlist, new_hardware = [], False
    for item in task_overrides:
        key = item.lstrip("+").split("=", 1)[0]
        if key == "hardware":  # where it runs is not what it computes: a checkpoint resumes on any placement
            new_hardware = True
        elif key in GROUPS:
            raise ConfigError(f"resume: '{item}' would change the run's {key}; resume keeps its config groups "
                              "(hardware= excepted)")
        elif key not in ("resume", "hydra.run.dir"):
            dotlist.append(item.lstrip("+"))
    hardware = OmegaConf.create({"hardware": dcfg.hardware}) if new_hardware else OmegaConf.create()
    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(saved), hardware,
                             OmegaConf.from_dotlist(dotlist))
    merged.resume = str(run_dir)
    # Stopping early belongs to one invocation, not to the run.
    merged.trainer.exit_after_step = dcfg.trainer.exit_after_step
    return merged


def quiet_transformers() -> None:
    """No per-file loading bars or advice from transformers; rlft prints what a run needs."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _fail(message: str) -> int:
    print(f"rlft: error: {message}", file=sys.stderr)
    return 2


def describe_config_error(err: BaseException) -> str | None:
    """One line for a Hydra/OmegaConf config error, or None when `err` is not one."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

    from rlft.config import keys_at
    from rlft.errors import UserError

    chain = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    for e in chain:
        if isinstance(e, UserError):
            return str(e)
    for e in chain:
        if isinstance(e, MissingConfigException):
            group = (e.missing_cfg_file or "").rsplit("/", 1)
            if e.options and len(group) == 2:
                return f"unknown {group[0]} '{group[1]}' (available: {', '.join(e.options)})"
            return _first_line(e)
    for e in chain:
        if isinstance(e, (ConfigKeyError, ConfigAttributeError)):
            full_key = getattr(e, "full_key", None) or ""
            parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
            allowed = keys_at(parent)
            where = f" in {parent}" if parent else ""
            hint = f" (allowed{where}: {', '.join(allowed)})" if allowed else ""
            return f"unknown config key '{full_key}'{hint}"
        if isinstance(e, ValidationError):
            full_key = getattr(e, "full_key", None)
            return f"{full_key}: {_first_line(e)}" if full_key else _first_line(e)
    for e in chain:
        if isinstance(e, OverrideParseException):
            return f"cannot parse override '{e.override}': {_first_line(e)}"
    config_errors = [e for e in chain if isinstance(e, (ConfigCompositionException, OmegaConfBaseException))]
    if config_errors:  # Hydra's composition error may say nothing itself; what it wraps does
        return next((_first_line(e) for e in chain if str(e).strip()), _first_line(config_errors[0]))
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
