"""`rlft` command line. `rlft train [overrides...]` is a Hydra app over conf/ (see conf/config.yaml).

Config mistakes (unknown key, a key of another option, wrong type, unknown group option, missing model or
data file) end the command with one line naming the problem and what is allowed, before any work starts.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path


USAGE = """usage: rlft train [GROUP=OPTION ...] [KEY=VALUE ...] [RUN CONTROLS] [-m] [--cfg job] [--help [KEY]]
       rlft eval [TARGET | GROUP=OPTION ...] [KEY=VALUE ...] [--samples K] [--show N] [--out FILE]
       rlft compare DIR [DIR ...] [-o PNG]

  rlft train                          the default run (GRPO on the built-in addition task)
  rlft train algo=dapo model.path=... choose a group's option, set any key
  rlft train optim.lr=5e-5 trainer.steps=50
  rlft train --cfg job                print the composed config and exit
  rlft train --help                   the groups and their options
  rlft train --help KEY               a key's (or a group's) type, value, allowed values and help
  rlft train -m seed=0,1,2            a Hydra multirun sweep; a comparison table at the end
  rlft compare DIR [DIR...] [-o PNG]  plot and tabulate runs (a sweep directory or run directories)

run controls (this invocation only, not part of the run's config):
  resume=RUN_DIR                      continue a run from its last checkpoint, in its directory
  trainer.exit_after_step=N           stop after step N (the schedule keeps trainer.steps)
  --profile                           a torch.profiler trace of step 2 in RUN_DIR/profile
  trainer.profile_steps=[2,5]         traces of these steps

evaluate on the task's held-out set (greedy accuracy and reward mean): a table, and a JSON file
  rlft eval RUN_DIR                   the run's final model (else its newest checkpoint) with the run's
                                      config, KEY=VALUE on top (data.eval_size=100); JSON: RUN_DIR/eval.json
  rlft eval RUN_DIR/checkpoints/step_000020
                                      one checkpoint; JSON: RUN_DIR/eval_step_000020.json
  rlft eval model.path=PATH           a model, the config composed as rlft train's (GROUP=OPTION, KEY=VALUE;
                                      none: the built-in model on the default task); JSON: ./eval.json
  --samples K                         also K samples per problem at rollout.temperature: pass@K (default 0)
  --show N                            the first N problems' completions in the table (default 5)
  --out FILE                          where the JSON goes
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_command(rest)
    if command == "eval":
        return eval_command(rest)
    if command == "compare":
        return compare_command(rest)
    print(f"rlft: error: unknown command '{command}'\n{USAGE}", file=sys.stderr)
    return 2


def config_dir() -> str:
    """Where conf/ is (tests and scripts ask here). Imported when asked: importing rlft.cli loads no torch."""
    from rlft.config.compose import config_dir as where
    return where()


def train_command(args: list[str]) -> int:
    malformed = thread_variable_problem()  # before torch loads: its OpenMP runtime would complain first
    if malformed:
        return _fail(malformed)
    from rlft.errors import Interrupted, UserError, WorkerDied

    overrides = args
    signal.signal(signal.SIGTERM, _terminated)  # a scheduler's stop ends like Ctrl-C: one line, checkpoint named
    controls = None
    try:
        controls, overrides = split_controls(args)
        if "--help" in overrides or "-h" in overrides:
            return help_command(overrides)
        from rlft.config.compose import register_schemas
        register_schemas()
        quiet_transformers()
        saved = None
        if controls.resume is not None:
            saved, overrides = resumed_overrides(controls.resume, overrides)
        check_arguments(overrides)
        if multirun(overrides):
            return run_hydra(overrides, controls)
        if cfg_job_requested(overrides):
            return print_config([o for o in overrides if o not in ("--cfg", "job", "-c")], saved)
        return run_one(overrides, controls, saved)
    except Interrupted as err:
        return _fail(str(err), code=130)
    except KeyboardInterrupt:  # before the training loop started (it reports its own)
        resumed = controls.resume if controls is not None else None
        return _fail("interrupted during start-up" + (f"; the run's checkpoints are as they were: rlft train "
                                                      f"resume={resumed}" if resumed else ""), code=130)
    except (UserError, WorkerDied) as err:
        return _fail(str(err))
    except Exception as err:  # Hydra/OmegaConf config errors and the disk's are reworded; anything else is a bug
        message = reworded(err, overrides)
        if message is None:
            raise
        return _fail(message)


def reworded(err: Exception, overrides: list[str]) -> str | None:
    """One line for a config error (Hydra's, OmegaConf's) or the disk's (full, read-only, gone); None for
    anything else, which is a bug and keeps its traceback."""
    from rlft.config.describe import describe_config_error
    from rlft.errors import first_line
    message = describe_config_error(err, choices_for(overrides))
    if message is None and isinstance(err, OSError) and err.filename:
        message = f"{err.strerror or err}: {err.filename}"
    if message is None and type(err).__name__ == "SafetensorError" and "(os error" in str(err):
        message = f"writing weights: {first_line(err).rpartition('I/O error: ')[2]}"  # the disk's, from Rust
    return message


def run_one(overrides: list[str], controls, saved) -> int:
    """One run, composed here and trained in this process: every check runs before anything is written
    (a sweep goes through Hydra's launcher instead, run_hydra)."""
    from rlft.config.compose import compose_job, to_run_config
    from rlft.trainer import train
    dcfg, choices, run_dir = compose_job(overrides)
    if saved is not None:
        dcfg, choices = with_saved_values(dcfg, choices, saved)
    train(to_run_config(dcfg, choices), run_dir, controls, choices)
    return 0


MAX_EVAL_SAMPLES = 1024


@dataclass(frozen=True)
class EvalOptions:
    """`rlft eval`'s flags."""
    samples: int = 0          # sampled completions per problem for pass@k; 0: greedy only
    show: int = 5             # problems whose completions the table shows
    out: Path | None = None   # the JSON file; None: next to the target (rlft.evaluate.Target.default_out)


def eval_command(args: list[str]) -> int:
    """`rlft eval [TARGET | GROUP=OPTION ...] [KEY=VALUE ...] [--samples K] [--show N] [--out FILE]`."""
    malformed = thread_variable_problem()
    if malformed:
        return _fail(malformed)
    from rlft.errors import UserError

    signal.signal(signal.SIGTERM, _terminated)
    overrides: list[str] = []
    try:
        if "--help" in args or "-h" in args:
            print(USAGE)
            return 0
        target, overrides, options = split_eval_args(args)
        return run_eval(target, overrides, options)
    except KeyboardInterrupt:
        return _fail("interrupted; nothing was written", code=130)
    except UserError as err:
        return _fail(str(err))
    except Exception as err:  # Hydra/OmegaConf config errors and the disk's are reworded; anything else is a bug
        message = reworded(err, overrides)
        if message is None:
            raise
        return _fail(message)


def run_eval(target_path: Path | None, overrides: list[str], options: EvalOptions) -> int:
    """Evaluate the target (a run directory, a checkpoint) with its run's config, or model.path with a
    config composed as rlft train's; print the table and write the JSON."""
    from rlft.config.compose import register_schemas
    from rlft.evaluate import evaluate, find_target, report, write_json
    register_schemas()
    quiet_transformers()
    check_arguments(overrides)
    if target_path is None:
        result = evaluate(eval_config(None, overrides), samples=options.samples)
        out = options.out or Path("eval.json")
    else:
        target = find_target(target_path)
        cfg = target.configured(eval_config(target.run_dir, overrides))
        result = evaluate(cfg, target.checkpoint, options.samples)
        out = options.out or target.default_out()
    write_json(result, out)
    print(report(result, options.show))
    print(f"\njson: {out}")
    return 0


def split_eval_args(args: list[str]) -> tuple[Path | None, list[str], EvalOptions]:
    """(TARGET or None, the KEY=VALUE overrides, the flags)."""
    from rlft.errors import ConfigError
    flags = {"--samples": "samples", "--show": "show", "--out": "out"}
    values: dict[str, str] = {}
    targets, overrides = [], []
    items = iter(args)
    for item in items:
        flag, equals, value = item.partition("=")
        if flag in flags:
            value = value if equals else next(items, None)
            if value is None:
                raise ConfigError(f"{flag} takes a value ({flag} {'FILE' if flag == '--out' else 'N'})")
            values[flags[flag]] = value
        elif item.startswith("-"):
            raise ConfigError(f"rlft eval does not take '{item}' (its flags: --samples K, --show N, --out FILE, "
                              "--help)")
        elif names_a_path(item):
            targets.append(item)
        else:
            overrides.append(item)
    if len(targets) > 1:
        raise ConfigError(f"rlft eval takes one TARGET (a run directory or a checkpoint); got {', '.join(targets)}")
    for name in ("samples", "show"):
        if name in values and not values[name].isdigit():
            raise ConfigError(f"--{name} takes a whole number >= 0 (got '{values[name]}')")
    if int(values.get("samples", 0)) > MAX_EVAL_SAMPLES:  # every problem's K completions are held at once
        raise ConfigError(f"--samples takes at most {MAX_EVAL_SAMPLES} (got {values['samples']}): pass@k beyond it "
                          "is better estimated from fewer samples (Chen et al.'s estimator)")
    options = EvalOptions(samples=int(values.get("samples", 0)), show=int(values.get("show", 5)),
                          out=Path(values["out"]) if "out" in values else None)
    return (Path(targets[0]) if targets else None), overrides, options


def names_a_path(item: str) -> bool:
    """A path rather than an override: no '=' (nor a '~key' deletion), a '/' before the '=' (no key has one),
    or a path that exists (a sweep's run directories are named like 0_algo=dapo,seed=1)."""
    key, equals, _ = item.partition("=")
    return (not equals and not item.startswith("~")) or "/" in key or Path(item).exists()


def eval_config(run_dir: Path | None, overrides: list[str]):
    """The evaluation's config: a run's own (its options and saved values, these overrides on top, as
    resume composes it), or without a run composed from conf/ as rlft train composes it."""
    from rlft.config.compose import compose, to_run_config
    if run_dir is None:
        dcfg, choices = compose(overrides)
    else:
        saved, composed = resumed_overrides(run_dir, overrides, command="rlft eval")
        dcfg, choices = with_saved_values(*compose(composed), saved)
    return to_run_config(dcfg, choices)


def run_hydra(overrides: list[str], controls) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from rlft.config.compose import chosen_options, to_run_config
    from rlft.config.describe import describe_config_error
    from rlft.errors import UserError, WorkerDied

    swept = swept_keys(overrides)

    @hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")
    def hydra_app(dcfg: DictConfig) -> float | None:
        from rlft.trainer import train
        hydra_cfg = HydraConfig.get()
        choices = chosen_options(hydra_cfg.runtime.choices)
        try:
            cfg = to_run_config(dcfg, choices)
            if hydra_cfg.mode == RunMode.MULTIRUN:
                label_sweep_run(cfg, hydra_cfg, swept)
            summary = train(cfg, Path(hydra_cfg.runtime.output_dir), controls, choices)
        except (UserError, WorkerDied) as err:
            raise _UserFailure(str(err)) from None  # a BaseException: Hydra lets it through unprinted
        except Exception as err:
            message = describe_config_error(err, choices)
            if message is None:
                raise
            raise _UserFailure(message) from None
        return summary.get("accuracy_after")

    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us, and we print them as one line
    sys.argv = ["rlft train", *overrides]
    try:
        hydra_app()
    except _UserFailure as failure:
        return _fail(str(failure))
    return 0  # Hydra's own config errors reach train_command, which words them


def thread_variable_problem() -> str | None:
    """A malformed OMP_NUM_THREADS, in rlft.preflight.torch_threads's words, found before anything loads torch
    (libgomp prints its own lines about it as it loads)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value and not (value.isdigit() and int(value) >= 1):
        return f"the OMP_NUM_THREADS environment variable must be a whole number >= 1 (got '{value}')"
    return None


def split_controls(args: list[str]):
    """(the run controls, the rest): resume=, trainer.exit_after_step=, trainer.profile_steps=, --profile."""
    import yaml

    from rlft.errors import ConfigError
    from rlft.preflight import RunControls
    resume = exit_after = None
    profile: tuple[int, ...] = ()
    rest = []
    for item in args:
        key, _, value = item.lstrip("+").partition("=")
        if item == "--profile":  # step 1 includes one-time warm-up
            profile = (2,)
        elif key == "resume" and value:
            resume = Path(value)
            if not (resume / "config.yaml").is_file():
                raise ConfigError(f"resume='{value}': no config.yaml there (is it an rlft run directory?)")
        elif key == "trainer.exit_after_step" and value:
            if not value.lstrip("-").isdigit():
                raise ConfigError(f"trainer.exit_after_step takes one whole step number (got '{value}')")
            exit_after = int(value)
        elif key == "trainer.profile_steps" and value:
            try:
                steps = yaml.safe_load(value) if value.startswith("[") else [value]
            except yaml.YAMLError:
                steps = None
            if not isinstance(steps, list) or not steps or not all(str(s).isdigit() and int(s) > 0 for s in steps):
                raise ConfigError(f"trainer.profile_steps takes a list of step numbers, e.g. [2,5] (got '{value}')")
            profile = tuple(int(s) for s in steps)
        else:
            rest.append(item)
    return RunControls(resume=resume, exit_after_step=exit_after, profile_steps=profile), rest


def check_arguments(overrides: list[str]) -> None:
    """Refuse, with one line, what rlft train does not take: a flag other than -m and --cfg job, a key
    deletion (~key), a group given something other than an option's name."""
    import re

    from rlft.config import EXPERIMENT, GROUPS
    from rlft.config.describe import group_options
    from rlft.errors import ConfigError
    for place, item in enumerate(overrides):
        if item in ("--cfg", "-c"):
            following = overrides[place + 1:place + 2]
            if following != ["job"]:
                raise ConfigError(f"{item} takes 'job' (rlft train --cfg job prints the composed config)"
                                  f"{'; got ' + repr(following[0]) if following else ''}")
            if multirun(overrides):
                raise ConfigError(f"{item} job prints one run's config: it does not combine with -m")
        elif item.startswith("-") and item not in ("-m", "--multirun"):
            raise ConfigError(f"rlft train does not take '{item}' (its flags: -m, --cfg job, --profile, --help [KEY])")
        elif item.startswith("~"):
            raise ConfigError(f"'{item}': rlft keys cannot be deleted; set the key instead ({item[1:].split('=')[0]}=VALUE)")
        key, _, value = item.lstrip("+").partition("=")
        if key in (*GROUPS, EXPERIMENT) and "=" in item:
            names = value.split(",") if multirun(overrides) else [value]
            options = group_options(key)  # an option may be called "none" (env=none): null is refused otherwise
            if not all(re.fullmatch(r"[\w.-]+", name) and (name in options or name.lower() not in ("null", "none"))
                       for name in names):
                raise ConfigError(f"{key}= takes the name of one of its options ({', '.join(options)}); "
                                  f"got '{value}'")


def resumed_overrides(run_dir: Path, overrides: list[str], command: str = "resume") -> tuple[dict, list[str]]:
    """A resumed run keeps its config: it is composed from its own group options alone, and gets its saved
    values, then this command's key=value overrides, and a new `hardware=` option (a checkpoint resumes on
    any placement) in with_saved_values; (what that needs, the overrides to compose). `rlft eval RUN_DIR`
    composes a run's config the same way (`command` words the errors)."""
    from rlft.config import EXPERIMENT, GROUPS
    from rlft.config.compose import saved_config, saved_options
    from rlft.errors import ConfigError
    options = saved_options(run_dir / "config.yaml")
    if not options:
        where = f"resume='{run_dir}'" if command == "resume" else f"{command} {run_dir}"
        raise ConfigError(f"{where}: its config.yaml does not name the options it was composed from "
                          "(written by another version of rlft?)")
    if multirun(overrides):
        raise ConfigError("resume continues one run: it cannot be swept (-m)")
    groups = (*GROUPS, EXPERIMENT)
    chosen = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0] in groups}
    for group in chosen:
        if group != "hardware":
            raise ConfigError(f"{command}: '{group}=...' would change the run's {group}; {command} keeps its "
                              "config groups (hardware= excepted)")
    hydra = [item for item in overrides if item.startswith("hydra.") or item in ("--cfg", "-c", "job")]
    saved = {"config": saved_config(run_dir / "config.yaml"), "hardware": chosen.get("hardware"),
             "keys": [item.lstrip("+") for item in overrides if item not in hydra and "=" in item
                      and item.split("=", 1)[0] not in groups]}
    return saved, [f"{group}={option}" for group, option in options.items()] + hydra + [f"hydra.run.dir={run_dir}"]


def with_saved_values(dcfg, choices: dict[str, str], saved: dict):
    """The resumed run's config: its saved values, a new hardware option's section when one was chosen
    (where it runs is not what it computes), this command's key=value overrides on top; and its options."""
    from omegaconf import OmegaConf, open_dict

    from rlft.config.compose import compose, free_form_mappings
    values = saved["config"].copy()
    for path in free_form_mappings(dcfg):  # a saved mapping (data.tasks) replaces the option's default one
        saved_mapping = OmegaConf.select(values, path, default=None)
        if saved_mapping is not None:
            OmegaConf.update(dcfg, path, saved_mapping, merge=False)
    if saved["hardware"] is not None:
        placement, _ = compose([f"hardware={saved['hardware']}"])
        with open_dict(dcfg), open_dict(values):
            dcfg.hardware = placement.hardware
            del values["hardware"]
        choices = choices | {"hardware": saved["hardware"]}
    return OmegaConf.merge(dcfg, values, OmegaConf.from_dotlist(saved["keys"])), choices


def cfg_job_requested(overrides: list[str]) -> bool:
    return any(a in ("--cfg", "-c") and b == "job" for a, b in zip(overrides, overrides[1:]))


def multirun(overrides: list[str]) -> bool:
    return "-m" in overrides or "--multirun" in overrides


def print_config(overrides: list[str], saved: dict | None) -> int:
    """`rlft train --cfg job`: the composed config, every key checked, the group options on top."""
    from omegaconf import OmegaConf

    from rlft.config import validate
    from rlft.config.compose import compose, options_line, to_run_config
    dcfg, choices = compose(overrides)
    if saved is not None:
        dcfg, choices = with_saved_values(dcfg, choices, saved)
    validate(to_run_config(dcfg, choices))
    print(options_line(choices))
    print(OmegaConf.to_yaml(dcfg), end="")
    return 0


def help_command(args: list[str]) -> int:
    """`rlft train --help [KEY] [overrides]`: the groups, or one key's type, value, choices and help."""
    from rlft.config import EXPERIMENT, GROUPS
    from rlft.config.compose import compose
    from rlft.config.describe import group_options, key_help, options_with_key, unknown_key_message
    rest = [a for a in args if a not in ("--help", "-h")]
    key = next((a for a in rest if "=" not in a and not a.startswith("-")), None)
    overrides = [a for a in rest if a != key]
    dcfg, choices = compose(overrides)
    if key is None:
        print(USAGE)
        print("groups (rlft train GROUP=OPTION):")
        for group in GROUPS:
            print(f"  {group:10} {', '.join(group_options(group))}  (now: {choices.get(group)})")
        print(f"  {EXPERIMENT:10} {', '.join(group_options(EXPERIMENT))}  (a whole run's preset: its file's first lines "
              "give its command)")
        print("\nrlft train --help GROUP lists a group's keys; rlft train --help KEY explains one.")
        return 0
    try:
        print(key_help(key, dcfg, choices))
        return 0
    except KeyError:
        pass
    group, _, name = key.partition(".")
    others = options_with_key(group, name) if group in GROUPS and name and "." not in name else []
    if others:  # a key of another option: show it there
        dcfg, choices = compose(overrides + [f"{group}={others[0]}"])
        print(f"({key} is a key of {group}={', '.join(others)})")
        print(key_help(key, dcfg, choices))
        return 0
    return _fail(unknown_key_message(key, choices))


def choices_for(overrides: list[str]) -> dict[str, str]:
    """The group options a command chooses, for an error message (composed from its group overrides)."""
    from rlft.config import GROUPS
    from rlft.config.compose import compose
    groups = [o for o in overrides if o.split("=", 1)[0] in GROUPS]
    try:
        return compose(groups)[1]
    except Exception:
        return {}


def compare_command(args: list[str]) -> int:
    import argparse

    from rlft.errors import UserError
    from rlft.tooling.compare import compare

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
    if not cfg.logger.wandb:
        return
    if cfg.logger.group is None:
        cfg.logger.group = f"sweep-{Path(hydra_cfg.sweep.dir).name}"
    for item in hydra_cfg.overrides.task:
        if item.lstrip("+~").split("=", 1)[0] in swept and item not in cfg.logger.tags:
            cfg.logger.tags.append(item)


def quiet_transformers() -> None:
    """No per-file loading bars or advice from transformers, datasets or the hub client (a folder's README
    without a dataset card is no problem of the run); rlft prints what a run needs."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()


def _fail(message: str, code: int = 2) -> int:
    print(f"rlft: error: {message}", file=sys.stderr)
    return code


def _terminated(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
