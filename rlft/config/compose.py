"""Hydra glue: the schemas in Hydra's ConfigStore, two gaps in how overrides apply, the check that refuses
keys no schema has, and composition outside a Hydra job (`--cfg job`, `--help`, resume)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rlft.config import EXPERIMENT, GROUPS, SCHEMAS
from rlft.config.run import RunConfig
from rlft.errors import ConfigError


def config_dir() -> str:
    """conf/ inside an installed wheel (rlft/conf), else the checkout's top-level conf/."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise ConfigError(f"cannot find conf/config.yaml next to {here}")


def register_schemas() -> None:
    """The run's schema as `rlft_schema`, each option's as `schema/<group>/<name>` (what the YAMLs extend)."""
    from hydra.core.config_store import ConfigStore
    store = ConfigStore.instance()
    store.store(name="rlft_schema", node=RunConfig)
    for path, schema in SCHEMAS.items():
        group, _, name = path.rpartition("/")
        store.store(group=group, name=name, node=schema)
    _mend_override_application()
    _mend_mapping_merge()


def _mend_mapping_merge() -> None:
    """A config file that gives a free-form dict key a mapping (an experiment preset's
    `data: {tasks: {products: 1.0}}`) replaces the one composed before it, as a command-line override does
    (see below); Hydra merges the two, so a preset could never drop the default's chain_sum."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    compose_defaults = ConfigLoaderImpl._compose_config_from_defaults_list
    if getattr(compose_defaults, "rlft_mended", False):
        return
    load = ConfigLoaderImpl._load_single_config

    def compose_replacing_mappings(self, defaults, repo) -> DictConfig:
        loaded: list[DictConfig] = []

        def recording_load(default, repo):
            result = load(self, default=default, repo=repo)
            loaded.append(result.config)
            return result

        self._load_single_config = recording_load  # this composition only
        try:
            cfg = compose_defaults(self, defaults, repo)
        finally:
            del self._load_single_config
        for path in free_form_mappings(cfg):
            given = [node for config in loaded
                     if isinstance(node := OmegaConf.select(config, path, default=None), DictConfig)]
            if given:
                OmegaConf.update(cfg, path, given[-1], merge=False)
        return cfg

    compose_replacing_mappings.rlft_mended = True
    ConfigLoaderImpl._compose_config_from_defaults_list = compose_replacing_mappings


def free_form_mappings(node: DictConfig, prefix: str = "") -> list[str]:
    """Dotted paths of the dict-typed keys (data.tasks) under rlft's sections (not Hydra's own)."""
    paths = []
    for key in node:
        child = node._get_node(key)
        if prefix == "" and key == "hydra" or not isinstance(child, DictConfig) or child._is_none():
            continue
        if child._metadata.object_type is dict and is_dataclass(OmegaConf.get_type(node)):
            paths.append(f"{prefix}{key}")
        elif is_dataclass(OmegaConf.get_type(child)):
            paths += free_form_mappings(child, f"{prefix}{key}.")
    return paths


def _mend_override_application() -> None:
    """Two gaps in how Hydra 1.3 applies key=value overrides to a structured config, mended before it
    applies them:
    - a key under an optional section that is null (algo.overlong.buffer=2) stops with an AssertionError
      (omegaconf#1035): the section is first filled with its schema's defaults, so that setting one of its
      keys turns it on;
    - a mapping given to a free-form dict key (data.tasks={countdown: 1.0}) is merged into the default one,
      and its new keys refused: it replaces the default, as the user means.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    apply = ConfigLoaderImpl._apply_overrides_to_config
    if getattr(apply, "rlft_mended", False):
        return

    def apply_overrides(overrides, cfg: DictConfig) -> None:
        for override in overrides:  # one at a time: `algo.overlong=null algo.overlong.buffer=2` turns it back on
            if override.package is None and not override.is_delete() and not override.is_sweep_override():
                _prepare(cfg, override.key_or_group, override.value())
            apply([override], cfg)

    apply_overrides.rlft_mended = True
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply_overrides)


def _prepare(cfg: DictConfig, key: str, value) -> None:
    node, parts = cfg, key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig) or node._is_none() or part not in node:
            return
        child = node._get_node(part)
        last = depth == len(parts) - 1
        if isinstance(child, DictConfig):
            schema = child._metadata.ref_type
            if child._is_none() and is_dataclass(schema) and (not last or isinstance(value, dict)):
                node[part] = schema()
            elif last and isinstance(value, dict) and child._metadata.object_type is dict:
                node[part] = value
        node = node[part]


def check_known_keys(cfg: DictConfig, choices: dict[str, str]) -> None:
    """`+key` and `++key` add keys no schema has (Hydra lets them through): refuse them with one line."""
    from rlft.config.describe import unknown_key_message

    def walk(node: DictConfig, prefix: str) -> None:
        schema = OmegaConf.get_type(node)
        if not is_dataclass(schema):
            return
        known = {f.name for f in fields(schema)}
        for key in node:
            full = f"{prefix}{key}"
            if key not in known:
                raise ConfigError(unknown_key_message(full, choices))
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none():
                walk(child, f"{full}.")

    walk(cfg, "")


def to_run_config(cfg: DictConfig, choices: dict[str, str]) -> RunConfig:
    """The typed config of a composed one, every key known (an added one refused)."""
    check_known_keys(cfg, choices)
    return OmegaConf.to_object(cfg)


def compose(overrides: list[str]) -> tuple[DictConfig, dict[str, str]]:
    """(the job config, the option chosen in each group) for these overrides, outside a Hydra job."""
    cfg, choices, _ = compose_job(overrides)
    return cfg, choices


def compose_job(overrides: list[str]) -> tuple[DictConfig, dict[str, str], Path]:
    """compose(), and the run directory Hydra's settings (hydra.run.dir) give the job."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)
    choices = chosen_options(cfg.hydra.runtime.choices)
    run_dir = Path(str(cfg.hydra.run.dir))
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices, run_dir


def chosen_options(hydra_choices) -> dict[str, str]:
    """The group options of a composition, and its experiment preset if any (Hydra also lists its own groups
    and the schema entries)."""
    chosen = {group: str(hydra_choices[group]) for group in GROUPS if group in hydra_choices}
    if hydra_choices.get(EXPERIMENT) is not None:
        chosen[EXPERIMENT] = str(hydra_choices[EXPERIMENT])
    return chosen


def options_line(choices: dict[str, str]) -> str:
    """The first line of a run's config.yaml: the options it was composed from (resume and `rlft compare`
    read it back with saved_options)."""
    return "# options: " + " ".join(f"{group}={option}" for group, option in choices.items())


def saved_options(config_yaml: Path) -> dict[str, str]:
    """The group options named on a saved config.yaml's first line; {} when it has none."""
    try:
        first = config_yaml.read_text(encoding="utf-8").split("\n", 1)[0]
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{config_yaml}: cannot be read ({err})") from None
    if not first.startswith("# options: "):
        return {}
    items = first.removeprefix("# options: ").split()
    if not all("=" in item for item in items):
        raise ConfigError(f"{config_yaml}:1: the options line is damaged (GROUP=OPTION ... expected): {first}")
    return dict(item.split("=", 1) for item in items)


def saved_config(config_yaml: Path) -> DictConfig:
    """A run's saved config.yaml (its values; its options line is a comment)."""
    try:
        values = OmegaConf.create(config_yaml.read_text(encoding="utf-8"))
    except Exception as err:  # YAML syntax
        raise ConfigError(f"{config_yaml}: not a readable rlft config ({str(err).splitlines()[0]})") from None
    if not isinstance(values, DictConfig):
        raise ConfigError(f"{config_yaml}: not an rlft config (a mapping of groups expected)")
    for group in GROUPS:
        if group in values and not isinstance(values._get_node(group), DictConfig):
            raise ConfigError(f"{config_yaml}: '{group}' is not a section (damaged?)")
    return values


# Any process that imports this module composes with rlft's schemas (a sweep launcher's workers too).
register_schemas()
