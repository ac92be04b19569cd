"""Every YAML composes onto the typed schema, and each kind of config mistake is one clear line."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import ROOT
from rlft.cli import config_dir
from rlft.config import GROUPS, RunConfig, register_schemas, validate
from rlft.errors import ConfigError
from rlft.rollout.vllm_engine import vllm_available

CONF = ROOT / "conf"


def group_options():
    return [(group, path.stem) for group in GROUPS for path in sorted((CONF / group).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", group_options())
def test_every_yaml_composes_onto_the_schema(group, option):
    register_schemas()
    overrides = [f"{group}={option}"] + (["data.path=x.jsonl"] if (group, option) == ("data", "jsonl") else [])
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, RunConfig)
    if (group, option) == ("rollout", "vllm") and not vllm_available():
        with pytest.raises(ConfigError, match="rollout=vllm needs vLLM installed: `make setup-vllm`"):
            validate(run)
        return
    validate(run)


def test_config_dir_is_the_checkout_conf():
    assert Path(config_dir()) == CONF


ERRORS = [
    (["algo.eps_hgih=0.3"], "unknown config key 'algo.eps_hgih' (allowed in algo: name, group_size"),
    (["model=nope"], "unknown model 'nope' (available: tiny_adder)"),
    (["algo.group_size=abc"], "algo.group_size: Value 'abc' of type 'str' could not be converted to Integer"),
    (["model.path=/no/such/model"], "model.path '/no/such/model' does not exist"),
    (["model.path=builtin:nope"], "no such built-in model (available: builtin:tiny-adder)"),
    (["algo.loss_agg=mean"], "algo.loss_agg='mean' is not one of: token_mean, seq_mean_token_mean"),
    (["algo.group_size=1"], "algo.group_size must be >= 2 (got 1)"),
    (["data=jsonl", "data.path=/no/such.jsonl"], "data file '/no/such.jsonl' does not exist"),
    (["reward.name=nope"], "unknown reward 'nope' (available: exact_match)"),
    (["resume=/no/such/run"], "resume='/no/such/run': no config.yaml there"),
    (["rollout.enable_sleep_mode=true"], "rollout.enable_sleep_mode, rollout.in_process=false and "
                                         "rollout.tensor_parallel_size need rollout=vllm"),
    (["rollout.weight_sync=nccl"], "rollout.weight_sync='nccl' is not one of: rpc, broadcast"),
    (["rollout.weight_sync=broadcast"], "rollout.weight_sync=broadcast needs rollout=vllm with "
                                        "rollout.in_process=false"),
    (["rollout=vllm", "rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization must be in (0, 1]"),
]


@pytest.mark.parametrize("overrides,message", ERRORS)
def test_config_errors_are_one_line_before_any_work(rlft, tmp_path, overrides, message):
    proc = rlft("train", f"hydra.run.dir={tmp_path / 'run'}", *overrides, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("rlft: error: "), proc.stderr
    assert message in lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_cfg_job_prints_the_composed_config(rlft):
    proc = rlft("train", "--cfg", "job", "algo.kl_coef=0.5")
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.algo.kl_coef == 0.5 and cfg.algo.name == "grpo" and cfg.model.path == "builtin:tiny-adder"
