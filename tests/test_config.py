"""Every YAML composes onto its schema, every key has help, the default config stays small, and each kind
of config mistake is one clear line before any work."""

from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from conftest import ROOT
from rlft.cli import config_dir
from rlft.config import GROUPS, SCHEMAS, RunConfig, validate
from rlft.config.compose import compose, to_run_config
from rlft.config.describe import field_help, option_schema, schema_at
from rlft.errors import ConfigError

CONF = ROOT / "conf"


def every_yaml() -> list[Path]:
    return sorted(CONF.rglob("*.yaml"))


def group_options():
    return [(path.parent.name, path.stem) for path in every_yaml() if path.parent not in (CONF, CONF / "experiment")]


def experiments() -> list[str]:
    return sorted(path.stem for path in (CONF / "experiment").glob("*.yaml"))


def composed(*overrides: str) -> RunConfig:
    dcfg, choices = compose(list(overrides))
    return to_run_config(dcfg, choices)


def test_every_yaml_is_the_main_config_or_an_option_of_a_group():
    assert {p.relative_to(CONF).parts[0] for p in every_yaml()} == {"config.yaml", "experiment", *GROUPS}
    assert all(len(p.relative_to(CONF).parts) <= 2 for p in every_yaml())  # no nested folders to miss


@pytest.mark.parametrize("group,option", group_options())
def test_every_yaml_composes_onto_its_own_schema(group, option):
    required = {("data", "dataset"): ["data.path=x.jsonl"], ("env", "custom"): ["env.environment=mypkg.envs:MyEnv"]}
    overrides = [f"{group}={option}"] + required.get((group, option), [])
    run = composed(*overrides)
    assert isinstance(run, RunConfig)
    schema = option_schema(group, option)
    assert schema is not None and isinstance(getattr(run, group), schema), "the YAML names its /schema/ default"
    validate(run)


@pytest.mark.parametrize("name", experiments())
def test_every_experiment_preset_starts_with_its_launch_command_and_composes(name):
    lines = (CONF / "experiment" / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"  # Hydra reads it only as the first line
    assert f"rlft train experiment={name}" in lines[1]
    run = composed(f"experiment={name}")
    validate(run)
    assert run.model.path.endswith("smollm2-135m-instruct") and run.data.tasks and run.data.system_prompt


def test_an_experiment_preset_replaces_the_default_task_mix_and_the_command_line_wins():
    assert composed("data=reasoning_gym").data.tasks == {"chain_sum": 1.0}
    preset = composed("experiment=smollm2_products")
    assert preset.data.tasks == {"products": {"max_digits": 2}}  # merged, chain_sum would have stayed
    assert (preset.trainer.steps, preset.trainer.prompts_per_step, preset.algo.kl_coef) == (30, 4, 0.0)
    mine = composed("experiment=smollm2_products", "data.tasks={countdown: 1.0}", "trainer.steps=3", "model=tiny_adder")
    assert mine.data.tasks == {"countdown": 1.0} and mine.trainer.steps == 3
    assert mine.model.path == "builtin:tiny-adder"


def test_config_dir_is_the_checkout_conf():
    assert Path(config_dir()) == CONF


def leaves(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key in node:
        child = node._get_node(key)
        section = isinstance(child, DictConfig) and not child._is_none()
        if section and is_dataclass(OmegaConf.get_type(child)):
            out += leaves(child, f"{prefix}{key}.")  # an option with no keys (env=none) adds none
        else:
            out.append(f"{prefix}{key}")
    return out


def test_the_default_config_stays_small(rlft_here):
    """Under 60 keys until the off-policy issue's objective, correction, staleness and partial-rollout keys (67 with
    algo.clip_cov, 69 with the collapse rule's two): a key is added only where a run needs it, and sections that
    are off are one null key."""
    printed = OmegaConf.create(rlft_here("train", "--cfg", "job").stdout)
    count = len(leaves(OmegaConf.merge(compose([])[0], printed)))
    assert count <= 69, count
    root = Path(__file__).resolve().parent.parent  # the docs state the count: they stay true as keys come and go
    assert f"The default run has {count} keys" in (root / "README.md").read_text()
    assert f"every key, {count} of them" in (root / "conf/config.yaml").read_text()


@pytest.mark.parametrize("group,option", group_options())
def test_every_key_of_every_option_has_help(group, option):
    required = {("data", "dataset"): ["data.path=x.jsonl"], ("env", "custom"): ["env.environment=mypkg.envs:MyEnv"]}
    overrides = [f"{group}={option}"] + required.get((group, option), [])
    dcfg, _ = compose(overrides)
    for key in leaves(dcfg):
        found = schema_at(key, dcfg)
        assert found is not None, key
        assert len(field_help(found[0]).get(found[1], "")) > 15, f"{key} has no help"


@pytest.mark.parametrize("schema", sorted(SCHEMAS.values(), key=lambda s: s.__name__), ids=lambda s: s.__name__)
def test_every_field_of_every_schema_has_help(schema):
    """Optional sections (null by default) too: their schemas are reached through the fields' types."""
    import typing
    pending, seen = [schema], set()
    while pending:
        current = pending.pop()
        seen.add(current)
        docs = field_help(current)
        for f in fields(current):
            assert len(docs.get(f.name, "")) > 15, f"{current.__name__}.{f.name} has no help"
            hint = typing.get_type_hints(current)[f.name]
            pending += [a for a in (hint, *typing.get_args(hint)) if is_dataclass(a) and a not in seen]


def test_a_key_of_an_optional_section_turns_it_on():
    assert composed().algo.overlong is None and composed().model.lora is None
    overlong = composed("algo.overlong.buffer=2").algo.overlong
    assert (overlong.enabled, overlong.buffer, overlong.penalty) == (True, 2, 1.0)
    assert composed("algo=dapo", "algo.overlong.enabled=false").algo.overlong.enabled is False
    assert composed("model.lora.r=8").model.lora.r == 8
    schedule = composed("algo.eps_high_schedule.end=0.3").algo.eps_high_schedule
    assert (schedule.kind, schedule.end, schedule.steps) == ("linear", 0.3, 100)


def test_partial_rollouts_compose_with_dynamic_sampling():
    run = composed("rollout.partial_rollouts=true", "rollout.max_staleness=2", "algo=dapo")
    validate(run)
    assert run.algo.dynamic_sampling and run.rollout.partial_rollouts


def test_partial_rollouts_take_episodes_and_engine_routes_and_chunk_an_episodes_budget():
    from rlft.config.rollout import partial_chunk
    episodes = composed("rollout.partial_rollouts=true", "rollout.max_staleness=1", "env=calculator",
                        "model=tiny_calculator", "data=calculator", "rollout.max_new_tokens=8")
    validate(episodes)
    assert partial_chunk(episodes) == 48 // 4  # a quarter of env.max_tokens, not of max_new_tokens
    routed = composed("rollout.partial_rollouts=true", "rollout.max_staleness=1", "model=tiny_moe",
                      "algo.routing_replay=rollout")
    validate(routed)
    assert partial_chunk(routed) == routed.rollout.max_new_tokens // 4
    assert partial_chunk(composed()) is None


def test_overrides_of_an_optional_section_apply_in_order():
    assert composed("algo.overlong=null", "algo.overlong.buffer=4").algo.overlong.buffer == 4
    assert composed("algo.overlong.buffer=4", "algo.overlong=null").algo.overlong is None


def test_run_controls_parse_lists_of_steps():
    from rlft.cli import split_controls
    controls, rest = split_controls(["trainer.profile_steps=[2,5]", "seed=1", "trainer.exit_after_step=3"])
    assert controls.profile_steps == (2, 5) and controls.exit_after_step == 3 and rest == ["seed=1"]
    assert split_controls(["trainer.profile_steps=4"])[0].profile_steps == (4,)
    assert split_controls(["--profile"])[0].profile_steps == (2,)


def test_a_mapping_replaces_a_free_form_dict():
    data = composed("data=reasoning_gym", "data.tasks={countdown: 0.5, chain_sum: 0.5}").data
    assert data.tasks == {"countdown": 0.5, "chain_sum": 0.5}
    assert composed("data=reasoning_gym", "data.tasks={countdown: 1.0}").data.tasks == {"countdown": 1.0}
    options = composed("data=reasoning_gym", "data.tasks={chain_sum: {weight: 2, min_terms: 2, max_digits: 1}}")
    assert options.data.tasks == {"chain_sum": {"weight": 2, "min_terms": 2, "max_digits": 1}}


ERRORS = [
    # unknown keys: a typo, a `+`/`++` addition, a key of another option, a key that moved
    (["algo.eps_hgih=0.3"], "unknown config key 'algo.eps_hgih' (allowed in algo: group_size, scale_rewards"),
    (["+algo.eps_hgih=0.3"], "unknown config key 'algo.eps_hgih' (allowed in algo: group_size, scale_rewards"),
    (["++algo.eps_hgih=0.3"], "unknown config key 'algo.eps_hgih' (allowed in algo: group_size, scale_rewards"),
    (["+seeds=1"], "unknown config key 'seeds' (allowed: algo, model, data"),
    (["data.path=my.jsonl"], "data.path is a key of data=dataset, not of data=arithmetic"),
    (["rollout.enable_sleep_mode=true"], "rollout.enable_sleep_mode is a key of rollout=vllm, not of rollout=hf"),
    (["hardware.learner_ranks=2"], "hardware.learner_ranks is a key of hardware=8gpu or cpu_ray or multinode, "
                                   "not of hardware=cpu"),
    (["logger.project=x"], "logger.project is a key of logger=wandb, not of logger=console"),
    (["reward.format_pattern=x"], "reward.format_pattern is a key of reward=countdown or math or reasoned_answer"),
    (["algo.micro_batch_size=8"], "unknown config key 'algo.micro_batch_size': it moved to compute.micro_batch_size"),
    (["model.gguf_file=x.gguf"], "unknown config key 'model.gguf_file': it moved to model.path (FOLDER/FILE.gguf"),
    # values
    (["model=nope"], "unknown model 'nope' (available: smollm2_135m, tiny_adder, tiny_calculator, tiny_moe)"),
    (["experiment=nope"], "unknown experiment 'nope' (available: smollm2_chain_sum, smollm2_products)"),
    (["experiment=null"], "experiment= takes the name of one of its options (smollm2_chain_sum, smollm2_products)"),
    (["data.system_prompt=Be brief."], "data.system_prompt goes into the chat template, but this run renders plain"),
    (["algo.group_size=abc"], "algo.group_size: Value 'abc' of type 'str' could not be converted to Integer"),
    (["algo.loss_agg=mean"], "algo.loss_agg='mean' is not one of: token_mean, seq_mean_token_mean, seq_mean"),
    (["algo.group_size=1"], "algo.group_size must be >= 2 (got 1)"),
    (["trainer.epochs=2", "trainer.steps=5"], "trainer.epochs=2.0 decides the number of steps: it does not combine"),
    (["reward.weights=[1.0,nan]", "reward.fns=[exact_match,format]"], "reward.weights[1] must be a finite number"),
    (["data=reasoning_gym", "data.tasks={chain_sum: -1}"], "data.tasks.chain_sum must be a finite number > 0"),
    (["data=reasoning_gym", "data.tasks={chain_sum: {weight: 0}}"],
     "data.tasks.chain_sum.weight must be a finite number > 0 (got 0)"),
    (["data=reasoning_gym", "data.tasks={chain_sum: heavy}"],
     "data.tasks.chain_sum must be a weight (a number > 0), or the task's {weight: W, option: value, ...} (got 'heavy')"),
    (["optim.lr=nan"], "optim.lr must be a finite number > 0 (got nan)"),
    (["optim.betas=[0.9,1.5]"], "optim.betas[1] must be in [0, 1) (got 1.5)"),
    (["reward.on_error=ignore"], "reward.on_error='ignore' is not one of: raise, zero"),
    (["model.dtype=bfloat16", "model.master_dtype=float16"],
     "model.master_dtype must be float32 (mixed precision) or model.dtype (bfloat16: pure bfloat16) (got float16)"),
    (["rollout.async_steps=2"], "rollout.async_steps must be 0 (on-policy) or 1 (one step ahead) (got 2)"),
    (["rollout=vllm", "rollout.enable_sleep_mode=true", "rollout.async_steps=1"],
     "rollout.async_steps=1 generates while the learner trains, so the engine cannot sleep"),
    (["rollout=vllm", "rollout.enable_sleep_mode=true", "rollout.max_staleness=3"],
     "rollout.max_staleness=3 generates while the learner trains, so the engine cannot sleep"),
    (["rollout.max_staleness=-1"], "rollout.max_staleness must be >= 0 (got -1)"),
    (["rollout.async_steps=1", "rollout.max_staleness=2"], "rollout.async_steps=1 is rollout.max_staleness=1, and"),
    (["rollout.partial_rollouts=true"], "rollout.partial_rollouts=true continues responses under the next weights"),
    (["rollout.chunk_tokens=2"], "rollout.chunk_tokens=2 is for partial rollouts only"),
    (["rollout.partial_rollouts=true", "rollout.max_staleness=1", "rollout.chunk_tokens=0"],
     "rollout.chunk_tokens must be >= 1 (got 0)"),
    (["rollout.partial_rollouts=true", "rollout.max_staleness=1", "rollout.chunk_tokens=8"],
     "rollout.chunk_tokens=8 is not below rollout.max_new_tokens=8"),
    (["rollout.partial_rollouts=true", "rollout.max_staleness=1", "env=calculator", "model=tiny_calculator",
      "data=calculator", "rollout.chunk_tokens=48"], "rollout.chunk_tokens=48 is not below env.max_tokens=48"),
    (["rollout=vllm", "rollout.weight_sync=nccl"], "rollout.weight_sync='nccl' is not one of: rpc, broadcast"),
    (["rollout=vllm", "rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization must be in (0, 1]"),
    (["hardware=cpu_ray", "hardware.learner_ranks=1", "hardware.fsdp=true"],
     "hardware.fsdp shards over learner ranks: it needs hardware.learner_ranks >= 2"),
    (["hardware=cpu_ray", "hardware.placement_strategy=RANDOM"], "hardware.placement_strategy='RANDOM' is not one of"),
    (["hardware=cpu_ray", "trainer.prompts_per_step=1", "algo.group_size=2", "hardware.learner_ranks=4"],
     "1 prompts/step x 2 = 2 responses cannot feed hardware.learner_ranks=4"),
    (["model=tiny_moe", "algo.routing_replay=engine"], "algo.routing_replay='engine' is not one of: false, true"),
    (["model=tiny_moe", "algo.router_aux_loss_coef=-1"], "algo.router_aux_loss_coef must be >= 0"),
    (["data=dataset"], "data.path is required with data=dataset (a .jsonl/.json/.csv/.parquet file"),
    (["trainer.exit_after_step=x"], "trainer.exit_after_step takes one whole step number (got 'x')"),
    (["trainer.profile_steps=[0]"], "trainer.profile_steps takes a list of step numbers, e.g. [2,5] (got '[0]')"),
    (["trainer.profile_steps=[2,"], "trainer.profile_steps takes a list of step numbers, e.g. [2,5] (got '[2,')"),
    # what rlft train takes: group options by name, its own flags, no deletions
    (["data=null"], "data= takes the name of one of its options (arithmetic, calculator, countdown, dataset"),
    (["algo=[grpo,dapo]"], "algo= takes the name of one of its options (cispo, clip_cov, dapo, gmpo, grpo, gspo, "
                           "kl_cov, reinforce_pp, rloo, sapo); got '[grpo,dapo]'"),
    (["~algo.kl_coef"], "'~algo.kl_coef': rlft keys cannot be deleted; set the key instead (algo.kl_coef=VALUE)"),
    (["--cfg", "hydra"], "--cfg takes 'job' (rlft train --cfg job prints the composed config); got 'hydra'"),
    (["--resolve"], "rlft train does not take '--resolve' (its flags: -m, --cfg job, --profile, --help [KEY])"),
    (["-m", "seed=0,1", "--cfg", "job"], "--cfg job prints one run's config: it does not combine with -m"),
    # what the config points at (preflight)
    (["model.path=/no/such/model"], "model.path '/no/such/model' does not exist"),
    (["model.path=builtin:nope"], "no such built-in model (available: builtin:tiny-adder, builtin:tiny-calculator, builtin:tiny-moe)"),
    (["data=dataset", "data.path=/no/such.jsonl"], "data file '/no/such.jsonl' does not exist"),
    (["model.path=/tmp/nope.gguf"], "model.path '/tmp/nope.gguf': no such GGUF file"),
    (["compute.attn_implementation=fast"], "compute.attn_implementation='fast' is not one of: eager, sdpa"),
    (["model.path=/no/cache/models/smollm2-135m-instruct"], "does not exist (make it with scripts/fetch_smollm2.py"),
    (["reward.fns=[nope]"], "unknown reward 'nope' (available: answer_format, answer_match, code_tests, countdown"),
    (["reward.fns=[exact_match,format]", "reward.weights=[1.0]"], "reward.weights has 1 values for 2 reward.fns"),
    (["resume=/no/such/run"], "resume='/no/such/run': no config.yaml there"),
    (["trainer.steps=3", "trainer.exit_after_step=4"], "trainer.exit_after_step must be in [1, trainer.steps=3]"),
    (["hardware.device=cuda"], "hardware.device=cuda but torch sees no GPU here"),
    (["algo.routing_replay=true"], "algo.routing_replay=true needs a mixture-of-experts model; "),
]


@pytest.mark.parametrize("overrides,message", ERRORS, ids=[" ".join(o) for o, _ in ERRORS])
def test_config_errors_are_one_line_before_any_work(rlft_here, tmp_path, overrides, message):
    """In this process (a fresh one per case cost minutes of CI; the next test checks a few from a fresh one)."""
    proc = rlft_here("train", f"hydra.run.dir={tmp_path / 'run'}", *overrides, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("rlft: error: ") and not proc.stdout, proc.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()  # nothing written


FRESH_PROCESS = [0, 14, 56]  # a typo, a value, a missing file: also one line from a fresh interpreter's start


@pytest.mark.parametrize("index", FRESH_PROCESS)
def test_config_errors_are_one_line_from_a_fresh_process(rlft, tmp_path, index):
    overrides, message = ERRORS[index]
    proc = rlft("train", f"hydra.run.dir={tmp_path / 'run'}", *overrides, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == proc.stderr.strip().splitlines()[0]
    assert proc.stderr.startswith("rlft: error: ") and message in proc.stderr and not proc.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [["+algo.eps_hgih=0.3"], ["data.path=my.jsonl"], ["algo.group_size=1"]])
def test_cfg_job_refuses_what_a_run_refuses(rlft_here, overrides):
    proc = rlft_here("train", "--cfg", "job", *overrides, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("rlft: error: ") and not proc.stdout


def test_cfg_job_prints_the_composed_config(rlft_here):
    proc = rlft_here("train", "--cfg", "job", "algo.kl_coef=0.5")
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.algo.kl_coef == 0.5 and cfg.model.path == "builtin:tiny-adder"
    assert proc.stdout.startswith("# options: algo=grpo model=tiny_adder data=arithmetic")


def test_help_of_a_key_gives_its_type_value_choices_and_help(rlft_here):
    out = rlft_here("train", "--help", "algo.loss_agg").stdout
    assert out.startswith("algo.loss_agg: one of: token_mean, seq_mean_token_mean, seq_mean, seq_mean_token_sum_norm")
    assert "value: seq_mean_token_mean" in out and "Dr. GRPO" in out
    out = rlft_here("train", "--help", "algo.loss_agg", "algo=dapo").stdout
    assert "value: token_mean" in out
    out = rlft_here("train", "--help", "data.path").stdout  # a key of another option: shown there
    assert "data.path is a key of data=dataset" in out and "data.path: str" in out and "??? (required)" in out
    out = rlft_here("train", "--help", "algo").stdout  # a group: its keys with a line of help each
    assert "algo.eps_high" in out and "clip" in out and "others: cispo, clip_cov, dapo, gmpo, gspo, kl_cov" in out
    assert "compute.layout" in rlft_here("train", "--help", "compute").stdout
    assert "data" in rlft_here("train", "--help").stdout
    out = rlft_here("train", "--help", "model.lora.r").stdout  # a key of a section that is off
    assert out.startswith("model.lora.r: int") and "model.lora is null (setting this key turns it on" in out
    assert "schema default: 16" in out
    proc = rlft_here("train", "--help", "algo.nope", check=False)
    assert proc.returncode == 2 and "unknown config key 'algo.nope'" in proc.stderr


GPU_PLACEMENTS = {"1gpu_colocated": (False, None, None, None), "8gpu": (True, 4, 4, True),
                  "multinode": (True, 8, 8, True)}


@pytest.mark.parametrize("option", sorted(GPU_PLACEMENTS))
def test_gpu_placements_compose_and_validate_on_cpu(rlft_here, option):
    """`--cfg job` of each GPU config: the placement it promises, and the checks it passes (vLLM aside)."""
    cfg = OmegaConf.create(rlft_here("train", f"hardware={option}", "--cfg", "job").stdout)
    ray, learner_ranks, rollout_workers, fsdp = GPU_PLACEMENTS[option]
    h = cfg.hardware
    assert h.device == "cuda" and ("learner_ranks" in h) == ray
    if ray:
        assert (h.learner_ranks, h.rollout_workers, h.fsdp) == (learner_ranks, rollout_workers, fsdp)
    assert "gpu_memory_utilization" in cfg.rollout and cfg.model.dtype == "bfloat16"  # rollout=vllm
    assert cfg.rollout.enable_sleep_mode == (option == "1gpu_colocated")


def test_multinode_gpu_count_must_add_up():
    with pytest.raises(ConfigError, match=r"= 16 GPUs, but nodes 3 x gpus_per_node 8 = 24"):
        validate(composed("hardware=multinode", "hardware.nodes=3"))


def test_resume_keeps_the_run_and_may_move_it_to_another_placement(rlft_here, tmp_path):
    """The saved options and values come back (this command's keys on top); a new hardware option brings
    its own section only: the run's rollout engine stays what it was."""
    run = tmp_path / "run"
    (run).mkdir()
    saved = rlft_here("train", "--cfg", "job", "algo=dapo", "rollout.max_new_tokens=6").stdout
    (run / "config.yaml").write_text(saved)
    out = rlft_here("train", f"resume={run}", "--cfg", "job", "trainer.steps=7").stdout
    cfg = OmegaConf.create(out)
    assert out.splitlines()[0] == saved.splitlines()[0]
    assert (cfg.algo.loss_agg, cfg.rollout.max_new_tokens, cfg.trainer.steps) == ("token_mean", 6, 7)
    moved = rlft_here("train", f"resume={run}", "hardware=cpu_ray", "hardware.learner_ranks=3", "--cfg", "job").stdout
    cfg = OmegaConf.create(moved)
    assert "hardware=cpu_ray" in moved.splitlines()[0] and cfg.hardware.learner_ranks == 3
    assert "max_batch_size" in cfg.rollout and cfg.rollout.max_new_tokens == 6  # still rollout=hf
    colocated = OmegaConf.create(rlft_here("train", f"resume={run}", "hardware=1gpu_colocated", "--cfg", "job").stdout)
    assert colocated.hardware.device == "cuda" and "max_batch_size" in colocated.rollout
    proc = rlft_here("train", f"resume={run}", "algo=grpo", check=False)
    assert proc.returncode == 2 and "resume keeps its config groups" in proc.stderr


@pytest.mark.parametrize("launch", [["experiment=smollm2_products"],
                                    ["data=reasoning_gym", "data.tasks={countdown: 1.0}"]])
def test_resume_keeps_a_task_mix_other_than_the_default(rlft_here, tmp_path, launch):
    """A saved data.tasks mapping replaces the option's default one (merged, its new task was refused)."""
    run = tmp_path / "run"
    run.mkdir()
    saved = rlft_here("train", "--cfg", "job", *launch).stdout
    (run / "config.yaml").write_text(saved)
    out = rlft_here("train", f"resume={run}", "--cfg", "job", "trainer.steps=7").stdout
    cfg = OmegaConf.create(out)
    assert cfg.data.tasks == OmegaConf.create(saved).data.tasks and "chain_sum" not in cfg.data.tasks
    assert cfg.trainer.steps == 7 and out.splitlines()[0] == saved.splitlines()[0]
    proc = rlft_here("train", f"resume={run}", "experiment=smollm2_chain_sum", check=False)
    assert proc.returncode == 2 and "resume keeps its config groups" in proc.stderr


@pytest.mark.parametrize("text,message", [
    ("# options: algo\nseed: 0\n", "config.yaml:1: the options line is damaged"),
    ("# options: algo=grpo\nseed: [\n", "config.yaml: not a readable rlft config"),
    ("# options: algo=grpo\n- 1\n", "config.yaml: not an rlft config (a mapping of groups expected)"),
    ("# options: algo=grpo\nalgo: 3\n", "config.yaml: 'algo' is not a section"),
    ("# options: algo=grpo\n\udcff\n", "config.yaml: cannot be read"),
])
def test_a_damaged_saved_config_is_named_on_resume(tmp_path, text, message):
    from rlft.cli import resumed_overrides
    (tmp_path / "config.yaml").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resumed_overrides(tmp_path, [])
