"""Words for the config: each key's help (the attribute docstring under its field), `rlft train --help
[KEY]`, and the one line a config mistake gets (unknown key, a key of another option, a key that moved,
a wrong value)."""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import fields, is_dataclass
from enum import Enum
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlft.config import GROUPS, SCHEMAS
from rlft.config.run import RunConfig
from rlft.errors import first_line

# Keys that moved in the config redesign, and where they went.
MOVED = {
    "algo.micro_batch_size": "compute.micro_batch_size",
    "algo.share_prompt_prefix": "compute.layout (auto, shared_prompts, packed, padded)",
    "algo.padding_free": "compute.layout (auto, shared_prompts, packed, padded)",
    "algo.routing_source": "algo.routing_replay (false, true = learner, rollout)",
    "model.gguf_file": "model.path (FOLDER/FILE.gguf, or ORG/REPO/FILE.gguf on the hub)",
    "model.attn_implementation": "compute.attn_implementation",
    "model.gradient_checkpointing": "compute.gradient_checkpointing",
    "hardware.num_threads": "the OMP_NUM_THREADS environment variable (default: the cores this process may run on)",
    "compute.num_threads": "the OMP_NUM_THREADS environment variable (default: the cores this process may run on)",
    "hardware.ray": "the option: hardware=cpu_ray, 8gpu or multinode",
    "data.name": "the option: data=NAME",
    "rollout.engine": "the option: rollout=hf or rollout=vllm",
    "logger.wandb": "the option: logger=wandb",
    "logger.jsonl": "nothing: metrics.jsonl is always written",
    "reward.workers": "nothing: user reward functions get a worker process per core, up to 4",
    "algo.name": "the option: algo=NAME, which labels the run (the first line of its config.yaml)",
    "trainer.profile_steps": "a run control: rlft train --profile, or trainer.profile_steps=[2,5] on the command line",
    "trainer.exit_after_step": "a run control: trainer.exit_after_step=N on the command line",
    "resume": "a run control: rlft train resume=RUN_DIR",
}


# ---- Help text ----------------------------------------------------------------------------------

@cache
def field_help(schema: type) -> dict[str, str]:
    """Field name -> the docstring written under it in the dataclass (inherited ones included)."""
    docs: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if not is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def schema_fields(schema: type) -> dict[str, object]:
    """Field name -> its resolved type."""
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in fields(schema)}


def type_name(hint) -> str:
    """'int', 'float or null', 'one of: a, b', 'list of str', ..."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return f"{type_name(args[0])} or null"
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(type_name(a) for a in args) + (" or null" if optional else "")
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "one of: " + ", ".join(hint.__members__)
    if typing.get_origin(hint) in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if typing.get_origin(hint) is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if is_dataclass(hint):
        return "section (" + ", ".join(f.name for f in fields(hint)) + ")"
    return getattr(hint, "__name__", str(hint))


def schema_at(key: str, cfg: DictConfig) -> tuple[type, str] | None:
    """(the schema holding `key`, the field's name), with the option schemas `cfg` composed."""
    parent, _, name = key.rpartition(".")
    node = cfg if not parent else OmegaConf.select(cfg, parent, throw_on_missing=False)
    if isinstance(node, DictConfig) and not node._is_none():
        schema = OmegaConf.get_type(node)
    else:  # an optional section that is null: its schema is the field's type
        owner = schema_at(parent, cfg) if parent else None
        if owner is None:
            return None
        hint = schema_fields(owner[0]).get(owner[1])
        schema = next((a for a in typing.get_args(hint) if is_dataclass(a)), hint)
    if not is_dataclass(schema) or name not in {f.name for f in fields(schema)}:
        return None
    return schema, name


def key_help(key: str, cfg: DictConfig, choices: dict[str, str]) -> str:
    """`rlft train --help KEY`: type, value in this composition, allowed values, help; a group or
    section lists its keys instead."""
    node = OmegaConf.select(cfg, key, throw_on_missing=False) if key else cfg
    if isinstance(node, DictConfig) and not node._is_none():
        return section_help(key, node, choices)
    found = schema_at(key, cfg)
    if found is None:
        raise KeyError(key)
    schema, name = found
    hint = schema_fields(schema)[name]
    value = OmegaConf.to_yaml(OmegaConf.create({"v": _plain(node)})).strip()[3:] if node is not None else "null"
    parent = OmegaConf.select(cfg, key.rpartition(".")[0]) if "." in key else cfg
    if isinstance(parent, DictConfig) and OmegaConf.is_missing(parent, name):
        value = "??? (required)"
    elif parent is None:  # a key of an optional section that is off (its schema default is shown below)
        value = f"none: {key.rpartition('.')[0]} is null (setting this key turns it on, defaults for the rest)"
    group = key.split(".")[0]
    where = f" (with {group}={choices[group]})" if group in choices and group not in ("algo", "model") else ""
    lines = [f"{key}: {type_name(hint)}", f"  value{where}: {value}"]
    default = next(f.default for f in fields(schema) if f.name == name)
    if default is not NO_DEFAULT and not isinstance(default, Enum) and _plain(node) != default:
        lines.append(f"  schema default: {default}")
    lines.append("  " + textwrap.fill(field_help(schema).get(name, "(no help)"), 100, subsequent_indent="  "))
    return "\n".join(lines)


def section_help(key: str, node: DictConfig, choices: dict[str, str]) -> str:
    schema = OmegaConf.get_type(node)
    title = key or "rlft train"
    if key in choices:
        others = ", ".join(o for o in group_options(key) if o != choices[key])
        title += f" (option {key}={choices[key]}; others: {others})"
    lines = [title]
    docs = field_help(schema) if is_dataclass(schema) else {}
    for name in node:
        value = node._get_node(name)
        if isinstance(value, DictConfig) and not value._is_none() and is_dataclass(OmegaConf.get_type(value)):
            shown = "{...}"
        else:
            shown = OmegaConf.to_yaml(OmegaConf.create({"v": _plain(value)})).strip()[3:]
            if OmegaConf.is_missing(node, name):
                shown = "???"
        help_text = docs.get(name, "")
        if name in GROUPS and not key:
            help_text = f"group: rlft train {name}=OPTION ({', '.join(group_options(name))})"
        full = f"{key}.{name}" if key else name
        lines.append(f"  {full:34} {shown[:24]:24} {textwrap.shorten(help_text, 90)}")
    return "\n".join(lines)


def _plain(node):
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node)
    return node._value() if hasattr(node, "_value") else node


# ---- Options and their schemas ---------------------------------------------------------------------

def group_options(group: str) -> list[str]:
    from rlft.config.compose import config_dir
    return sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml"))


@cache
def option_schema(group: str, option: str) -> type | None:
    """The schema an option's YAML extends (its `/schema/...` defaults entry)."""
    from rlft.config.compose import config_dir
    yaml = OmegaConf.load(Path(config_dir()) / group / f"{option}.yaml")
    for entry in yaml.get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/schema/"):
            return SCHEMAS.get(entry[1:].split("@")[0])
    return None


def options_with_key(group: str, key: str) -> list[str]:
    """The options of `group` whose schema has the (first-level) `key`."""
    return [option for option in group_options(group)
            if (schema := option_schema(group, option)) is not None and key in {f.name for f in fields(schema)}]


def unknown_key_message(full_key: str, choices: dict[str, str]) -> str:
    """One line for a key no schema of this composition has: where it moved, which option has it, or
    what is allowed where it was given."""
    if full_key in MOVED:
        return f"unknown config key '{full_key}': it moved to {MOVED[full_key]}"
    group, _, rest = full_key.partition(".")
    if group in GROUPS and rest and "." not in rest:
        others = [o for o in options_with_key(group, rest) if o != choices.get(group)]
        if others:
            current = f", not of {group}={choices[group]}" if group in choices else ""
            return f"{full_key} is a key of {group}={' or '.join(others)}{current} (choose one: {group}=OPTION)"
    parent = full_key.rpartition(".")[0]
    allowed = allowed_keys(parent, choices)
    where = f" in {parent}" if parent else ""
    return f"unknown config key '{full_key}'" + (f" (allowed{where}: {', '.join(allowed)})" if allowed else "")


def allowed_keys(dotted: str, choices: dict[str, str]) -> list[str]:
    """The keys under a dotted path ('' = top level) of this composition's schemas."""
    schema: type | None = RunConfig
    for depth, part in enumerate(filter(None, dotted.split("."))):
        if depth == 0 and part in choices and part not in ("algo", "model"):
            schema = option_schema(part, choices[part])
        elif schema is not None and is_dataclass(schema):
            hint = schema_fields(schema).get(part)
            schema = next((a for a in typing.get_args(hint) if is_dataclass(a)), hint)
        if schema is None or not is_dataclass(schema):
            return []
    return [f.name for f in fields(schema)]


# ---- Errors from Hydra and OmegaConf -----------------------------------------------------------------

def describe_config_error(err: BaseException, choices: dict[str, str] | None = None) -> str | None:
    """One line for a Hydra/OmegaConf config error, or None when `err` is not one."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, MissingMandatoryValue,
                                  OmegaConfBaseException, ValidationError)

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
            return first_line(e)
    for e in chain:
        full_key = getattr(e, "full_key", None) or ""
        if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and not isinstance(e, MissingMandatoryValue):
            return unknown_key_message(full_key, choices or {})
        if isinstance(e, MissingMandatoryValue):
            return _required_message(full_key, choices or {})
        if isinstance(e, ValidationError):
            message = first_line(e)
            if message.startswith("Invalid value") and "expected one of [" in message:
                value = message.split("'")[1]
                allowed = message.split("expected one of [")[1].rstrip("]")
                return f"{full_key}='{value}' is not one of: {allowed}"
            return f"{full_key}: {message}" if full_key else message
    for e in chain:
        if isinstance(e, OverrideParseException):
            return f"cannot parse override '{e.override}': {first_line(e)}"
    config_errors = [e for e in chain if isinstance(e, (ConfigCompositionException, OmegaConfBaseException))]
    if config_errors:  # Hydra's composition error may say nothing itself; what it wraps does
        return next((first_line(e) for e in chain if str(e).strip()), first_line(config_errors[0]))
    return None


def _required_message(full_key: str, choices: dict[str, str]) -> str:
    """'data.path is required with data=dataset (its help)'."""
    group, _, name = full_key.rpartition(".")
    option = choices.get(group)
    schema = option_schema(group, option) if option and group not in ("algo", "model") else None
    help_text = field_help(schema).get(name, "") if schema is not None else ""
    where = f" with {group}={option}" if option else ""
    explained = f" ({help_text[0].lower()}{help_text[1:].rstrip('.')})" if help_text else ""
    return f"{full_key} is required{where}{explained}"
