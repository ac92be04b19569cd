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
    overrides = [f"{group}={option}"] + (["data.path=x.jsonl"] if (group, option) == ("data", "dataset") else [])
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, RunConfig)
    if run.rollout.engine == "vllm" and not vllm_available():
        with pytest.raises(ConfigError, match="rollout=vllm needs vLLM installed: `make setup-vllm`"):
            validate(run)
        return
    validate(run)


def test_config_dir_is_the_checkout_conf():
    assert Path(config_dir()) == CONF


ERRORS = [
    (["algo.eps_hgih=0.3"], "unknown config key 'algo.eps_hgih' (allowed in algo: name, group_size"),
    (["model=nope"], "unknown model 'nope' (available: smollm2_135m, tiny_adder, tiny_moe)"),
    (["algo.group_size=abc"], "algo.group_size: Value 'abc' of type 'str' could not be converted to Integer"),
    (["model.path=/no/such/model"], "model.path '/no/such/model' does not exist"),
    (["model.path=builtin:nope"], "no such built-in model (available: builtin:tiny-adder, builtin:tiny-moe)"),
    (["algo.loss_agg=mean"], "algo.loss_agg='mean' is not one of: token_mean, seq_mean_token_mean"),
    (["algo.group_size=1"], "algo.group_size must be >= 2 (got 1)"),
    (["data=dataset", "data.path=/no/such.jsonl"], "data file '/no/such.jsonl' does not exist"),
    (["model.path=/tmp", "model.gguf_file=nope.gguf"], "model.gguf_file 'nope.gguf' is not in /tmp"),
    (["model.attn_implementation=fast"], "model.attn_implementation='fast' is not one of: eager, sdpa"),
    (["model.path=/no/cache/models/smollm2-135m-instruct"], "does not exist (make it with scripts/fetch_smollm2.py"),
    (["reward.fns=[nope]"], "unknown reward 'nope' (available: answer_match, code_tests, countdown, exact_match"),
    (["reward.fns=[exact_match,format]", "reward.weights=[1.0]"], "reward.weights has 1 values for 2 reward.fns"),
    (["reward.on_error=ignore"], "reward.on_error='ignore' is not one of: raise, zero"),
    (["resume=/no/such/run"], "resume='/no/such/run': no config.yaml there"),
    (["rollout.enable_sleep_mode=true"], "rollout.enable_sleep_mode, rollout.in_process=false and "
                                         "rollout.tensor_parallel_size need rollout=vllm"),
    (["model.dtype=bfloat16", "model.master_dtype=float16"],
     "model.master_dtype must be float32 (mixed precision) or model.dtype (bfloat16: pure bfloat16) (got float16)"),
    (["rollout.async_steps=2"], "rollout.async_steps must be 0 (on-policy) or 1 (one step ahead) (got 2)"),
    (["rollout=vllm", "rollout.enable_sleep_mode=true", "rollout.async_steps=1"],
     "rollout.async_steps=1 generates while the learner trains, so the engine cannot sleep"),
    (["rollout.weight_sync=nccl"], "rollout.weight_sync='nccl' is not one of: rpc, broadcast"),
    (["rollout.weight_sync=broadcast"], "rollout.weight_sync=broadcast needs rollout=vllm with "
                                        "rollout.in_process=false"),
    (["rollout=vllm", "rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization must be in (0, 1]"),
    (["hardware.learner_ranks=2"], "hardware.learner_ranks > 1, hardware.rollout_workers > 1 and "
                                   "hardware.ray_address need hardware.ray=true (e.g. hardware=cpu_ray)"),
    (["hardware=cpu_ray", "hardware.learner_ranks=1", "hardware.fsdp=true"],
     "hardware.fsdp shards over learner ranks: it needs hardware.learner_ranks >= 2"),
    (["hardware=cpu_ray", "hardware.placement_strategy=RANDOM"], "hardware.placement_strategy='RANDOM' is not one of"),
    (["hardware=cpu_ray", "trainer.prompts_per_step=1", "algo.group_size=2", "hardware.learner_ranks=4"],
     "1 prompts/step x 2 = 2 responses cannot feed hardware.learner_ranks=4"),
    (["hardware.device=cuda"], "hardware.device=cuda but torch sees no GPU here"),
    (["algo.routing_replay=true"], "algo.routing_replay=true needs a mixture-of-experts model; "),
    (["model=tiny_moe", "algo.routing_source=engine"], "algo.routing_source='engine' is not one of: learner, rollout"),
    (["model=tiny_moe", "algo.router_aux_loss_coef=-1"], "algo.router_aux_loss_coef must be >= 0"),
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


GPU_PLACEMENTS = {"1gpu_colocated": (False, 1, 1, False), "8gpu": (True, 4, 4, True),
                  "multinode": (True, 8, 8, True)}


@pytest.mark.parametrize("option", sorted(GPU_PLACEMENTS))
def test_gpu_placements_compose_and_validate_on_cpu(rlft, option):
    """`--cfg job` of each GPU config: the placement it promises, and the checks it passes (vLLM aside)."""
    cfg = OmegaConf.create(rlft("train", f"hardware={option}", "--cfg", "job").stdout)
    ray, learner_ranks, rollout_workers, fsdp = GPU_PLACEMENTS[option]
    h = cfg.hardware
    assert (h.device, h.ray, h.learner_ranks, h.rollout_workers, h.fsdp) == ("cuda", ray, learner_ranks,
                                                                              rollout_workers, fsdp)
    assert cfg.rollout.engine == "vllm" and cfg.model.dtype == "bfloat16"
    assert cfg.rollout.enable_sleep_mode == (option == "1gpu_colocated")
    run = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), cfg))
    if vllm_available():
        validate(run)


def test_multinode_gpu_count_must_add_up():
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hardware=multinode", "hardware.nodes=3"])
    run = OmegaConf.to_object(cfg)
    run.rollout.engine = "hf"  # the GPU count check, without vLLM
    with pytest.raises(ConfigError, match=r"= 16 GPUs, but nodes 3 x gpus_per_node 8 = 24"):
        validate(run)
