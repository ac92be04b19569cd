"""The typed run config. Each group of conf/ has a dataclass here; Hydra composes the YAML onto these
schemas (registered in the ConfigStore), so an unknown key or a wrong type fails at start-up.

Key names follow ALGORITHMS.md ("Config keys"): one name per concept, in YAML, logs and W&B alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Optional, get_type_hints

from hydra.core.config_store import ConfigStore

from rlft.algos.losses import KL_ESTIMATORS, LOSS_AGGS, RATIO_LEVELS
from rlft.errors import ConfigError

SCALE_REWARDS = ("group", "batch", "none")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
ENGINES = ("hf", "vllm")
WEIGHT_SYNCS = ("rpc", "broadcast")
ROUTING_SOURCES = ("learner", "rollout")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class EpsHighSchedule:
    """Moves eps_high from its configured value to `end` over `steps` training steps."""
    kind: str = "linear"          # linear | cosine
    end: float = 0.28
    steps: int = 100


@dataclass
class OverlongConfig:
    """DAPO overlong reward shaping: a length penalty in the last `buffer` tokens before max_new_tokens."""
    enabled: bool = False
    buffer: Optional[int] = None  # null = max_new_tokens // 4
    penalty: float = 1.0


@dataclass
class AlgoConfig:
    """The policy-gradient algorithm (ALGORITHMS.md): GRPO, DAPO and GSPO are presets of these keys."""
    name: str = "grpo"
    group_size: int = 8                    # responses sampled per prompt (G)
    scale_rewards: str = "group"           # group | batch | none (Dr. GRPO)
    ratio_level: str = "token"             # token | sequence | sequence_token
    eps_low: float = 0.2
    eps_high: float = 0.2
    eps_high_schedule: Optional[EpsHighSchedule] = None
    clip_ratio_c: Optional[float] = None   # dual clip for negative advantages; null = off
    loss_agg: str = "seq_mean_token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum_norm | seq_mean
    kl_coef: float = 0.04                  # 0 = no reference model is loaded
    kl_estimator: str = "k3"               # k1 | k2 | k3
    kl_in_reward: bool = False             # put -kl_coef * KL into the reward instead of the loss
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    mask_truncated: bool = False           # overlong filtering: responses without EOS get no loss
    routing_replay: bool = False           # MoE: training passes use the old pass's experts (ALGORITHMS.md)
    routing_source: str = "learner"        # MoE: old routes from the learner's old pass (R2) | rollout (R3)
    router_aux_loss_coef: float = 0.0      # MoE: weight of the router's load-balancing loss in the loss
    tis_cap: Optional[float] = None        # truncated importance sampling cap C; null = off
    ppo_epochs: int = 1                    # optimizer steps per batch of rollouts
    micro_batch_size: Optional[int] = None  # responses per forward/backward; null = the whole batch
    share_prompt_prefix: bool = True       # learner: one pass per distinct prompt, shared by its group
    padding_free: bool = True              # learner: sequences packed end to end, no compute on padding


@dataclass
class LoraSettings:
    """LoRA adapters (peft) instead of full fine-tuning; r = 0 is off."""
    r: int = 0
    alpha: float = 16.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])


@dataclass
class ModelConfig:
    """The policy to fine-tune: `builtin:NAME`, a local Hugging Face folder, or a hub id."""
    path: str = "builtin:tiny-adder"
    dtype: str = "float32"                 # float32 | bfloat16 | float16: the engines' weights, the passes' math
    master_dtype: str = "float32"          # the learner's weights and AdamW state; below it, the learner's
                                           # passes run under autocast in `dtype` (mixed precision). =dtype:
                                           # pure low precision, where small updates round away
    gguf_file: Optional[str] = None        # a GGUF file in `path` (folder or hub id): dequantised once, cached
    attn_implementation: Optional[str] = None  # the learner's attention: eager | sdpa | flash_attention_2; null: default
    gradient_checkpointing: bool = False   # recompute activations in backward: less memory, ~30% more time
    lora: LoraSettings = field(default_factory=LoraSettings)  # model.lora.r=16: train adapters only


@dataclass
class DataConfig:
    """Prompts and reference answers. Generated tasks need no download; `dataset` reads files or a hub id."""
    name: str = "arithmetic"               # arithmetic | countdown | multistep | reasoning_gym | humaneval | dataset
    min_operand: int = 10                  # arithmetic: operand range; countdown, multistep: numbers up to max
    max_operand: int = 99
    operands: int = 4                      # countdown, multistep: numbers per problem
    size: int = 10000                      # generated tasks (countdown, multistep, reasoning_gym): training problems
    eval_size: int = 500                   # held-out problems (generated, or split off the training rows)
    split_seed: int = 0                    # fixes which problems are held out
    shuffle: bool = True                   # a fresh seeded order each epoch; false keeps the file's order
    tasks: dict[str, float] = field(default_factory=dict)  # reasoning_gym: task name -> weight in the mix
    path: Optional[str] = None             # dataset: a .jsonl/.csv/.parquet file, a dataset folder, or a hub id
    split: str = "train"                   # dataset: the split of a folder or hub dataset
    eval_path: Optional[str] = None        # dataset: held-out rows from another file ...
    eval_split: Optional[str] = None       # ... or another split; neither: eval_size rows split off
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    map_fn: Optional[str] = None           # module:function, row -> {"prompt", "answer", other fields}
    max_prompt_tokens: Optional[int] = None  # longer prompts are dropped (and counted), never truncated
    chat_template: Optional[bool] = None   # render prompts with the tokenizer's chat template; null: if it has one
    system_prompt: Optional[str] = None    # with the chat template: the system message


@dataclass
class RewardConfig:
    """Reward functions (rlft.rewards): built-in names or `module:function`, summed with weights."""
    fns: list[str] = field(default_factory=lambda: ["exact_match"])
    weights: Optional[list[float]] = None  # one per fn; null = 1 each
    accuracy: str = "exact_match"          # the fn whose full marks (>= 1) count as correct (train/eval accuracy)
    on_error: str = "raise"                # raise: stop with one error naming fn and sample; zero: score 0, count it
    timeout_s: float = 10.0                # per call of a user fn (import path), run in a worker process
    workers: int = 2                       # processes for user fns
    format_pattern: str = r"<think>.*?</think>\s*<answer>.*?</answer>"  # the `format` reward's regex
    length_target: Optional[int] = None    # `length_penalty`: tokens without penalty; null = max_new_tokens // 2
    sandbox_timeout_s: float = 10.0        # `code_tests`: wall clock per program (CPU seconds alike)
    sandbox_memory_mb: int = 1024          # `code_tests`: address space per program


@dataclass
class RolloutConfig:
    """The rollout engine and how it samples."""
    engine: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8                # L_max, the longest response
    max_batch_size: int = 1024             # hf: sequences generated at once
    async_steps: int = 0                   # 1: collect the next batch during the update, one weights version
                                           # behind (pair with algo.tis_cap); 0: on-policy
    # vllm only (rollout=vllm):
    gpu_memory_utilization: float = 0.5    # share of GPU memory vLLM may take (weights + KV cache)
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False        # free vLLM's GPU memory while the learner trains (colocated)
    in_process: bool = True                # False: the engine core runs in its own process
    max_model_len: Optional[int] = None    # null = the model's own limit
    sync_bucket_mb: int = 256              # weights travel to the engine in buckets of this size
    weight_sync: str = "rpc"               # rpc: through vLLM's worker calls; broadcast: a torch.distributed
                                           # group (NCCL/gloo) from the learner to the workers (own process)


@dataclass
class HardwareConfig:
    """Where the learner and the rollout engine run: one process (ray=false), or Ray actors placed by a
    placement group (ray=true), the learner ranks forming a torch.distributed group (gloo/NCCL)."""
    device: str = "cpu"
    num_threads: Optional[int] = None      # torch threads per process; null = the cores it may use
    ray: bool = False                      # rollout workers and learner ranks as Ray actors
    ray_address: Optional[str] = None      # null: start a Ray instance here; "auto" or host:port: join a cluster
    learner_ranks: int = 1                 # data-parallel learner actors (one GPU each on cuda)
    rollout_workers: int = 1               # rollout actors; the prompts of a step are split between them
    fsdp: bool = False                     # shard the learner ranks' weights and optimizer (FSDP2)
    cpus_per_actor: int = 1
    gpus_per_rollout_worker: int = 1       # cuda: = rollout.tensor_parallel_size
    placement_strategy: str = "PACK"       # Ray placement group: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
    max_rollout_restarts: int = 3          # a rollout actor that dies is replaced, this often per call
    placement_timeout_s: float = 120.0     # how long to wait for the cluster to grant the resources
    nodes: Optional[int] = None            # multinode: checked against the actors' GPUs, with gpus_per_node
    gpus_per_node: Optional[int] = None


@dataclass
class LoggerConfig:
    console: bool = True                   # a progress bar and one line per step
    jsonl: bool = True                     # metrics.jsonl in the run directory
    wandb: bool = False                    # also log to Weights & Biases (logger=wandb)
    project: str = "rlft"
    entity: Optional[str] = None
    group: Optional[str] = None            # null: a multirun's runs share the sweep's name as group
    tags: list[str] = field(default_factory=list)  # a multirun adds each run's swept key=value
    name: Optional[str] = None             # null: the run directory's name
    mode: Optional[str] = None             # online, offline, disabled; null: WANDB_MODE, else online
    log_model: bool = False                # upload the final model as a W&B artifact


@dataclass
class TrainerConfig:
    steps: int = 100                       # RL steps (one batch of rollouts each)
    epochs: Optional[float] = None         # instead of steps: passes over the training prompts (rounded up)
    prompts_per_step: int = 32             # prompts per step; each gets group_size responses
    eval_every: int = 10                   # steps between held-out evaluations (also at start and end)
    save_every: int = 20                   # steps between checkpoints (also at the end)
    keep_checkpoints: int = 2
    exit_after_step: Optional[int] = None  # stop this invocation early (the schedule keeps `steps`); resume later
    profile_steps: list[int] = field(default_factory=list)  # torch.profiler traces of these steps (run_dir/profile)


@dataclass
class OptimConfig:
    lr: float = 1e-4
    warmup_steps: int = 5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0


@dataclass
class RunConfig:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    resume: Optional[str] = None           # a run directory to continue from its last checkpoint


GROUPS = {"algo": AlgoConfig, "model": ModelConfig, "data": DataConfig, "reward": RewardConfig,
          "rollout": RolloutConfig, "hardware": HardwareConfig, "logger": LoggerConfig}


def register_schemas() -> None:
    store = ConfigStore.instance()
    store.store(name="rlft_schema", node=RunConfig)


def keys_at(dotted: str) -> list[str] | None:
    """The keys allowed under a dotted path of the run config ('' = top level), or None if not a section."""
    node = RunConfig
    for part in filter(None, dotted.split(".")):
        hint = get_type_hints(node).get(part)
        hint = next((a for a in getattr(hint, "__args__", ()) if a is not type(None)), hint)  # Optional[X]
        if not is_dataclass(hint):
            return None
        node = hint
    return [f.name for f in fields(node)]


def validate(cfg: RunConfig) -> None:
    """Checks the types cannot express; raises ConfigError naming the key and what is allowed."""
    a, r, t = cfg.algo, cfg.rollout, cfg.trainer
    _choice("algo.scale_rewards", a.scale_rewards, SCALE_REWARDS)
    _choice("algo.ratio_level", a.ratio_level, RATIO_LEVELS)
    _choice("algo.loss_agg", a.loss_agg, LOSS_AGGS)
    _choice("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    _choice("model.dtype", cfg.model.dtype, DTYPES)
    if cfg.model.master_dtype not in ("float32", cfg.model.dtype):
        raise ConfigError(f"model.master_dtype must be float32 (mixed precision) or model.dtype "
                          f"({cfg.model.dtype}: pure {cfg.model.dtype}) (got {cfg.model.master_dtype})")
    if cfg.model.lora.r < 0 or (cfg.model.lora.r > 0 and cfg.hardware.fsdp):
        raise ConfigError("model.lora.r must be >= 0, and LoRA with hardware.fsdp is not supported yet "
                          "(the adapters are small: data-parallel ranks without FSDP hold them well)")
    if cfg.model.attn_implementation is not None:
        _choice("model.attn_implementation", cfg.model.attn_implementation, ("eager", "sdpa", "flash_attention_2"))
    _choice("rollout.engine", r.engine, ENGINES)
    _validate_hardware(cfg)
    if a.eps_high_schedule is not None:
        _choice("algo.eps_high_schedule.kind", a.eps_high_schedule.kind, ("linear", "cosine"))
    _at_least("algo.group_size", a.group_size, 2)
    _at_least("algo.ppo_epochs", a.ppo_epochs, 1)
    _at_least("algo.max_sampling_rounds", a.max_sampling_rounds, 1)
    if a.micro_batch_size is not None:
        _at_least("algo.micro_batch_size", a.micro_batch_size, 1)
    _at_least("rollout.max_new_tokens", r.max_new_tokens, 1)
    _at_least("rollout.tensor_parallel_size", r.tensor_parallel_size, 1)
    _at_least("rollout.sync_bucket_mb", r.sync_bucket_mb, 1)
    if r.async_steps not in (0, 1):
        raise ConfigError(f"rollout.async_steps must be 0 (on-policy) or 1 (one step ahead) (got {r.async_steps})")
    if r.async_steps and r.enable_sleep_mode:
        raise ConfigError("rollout.async_steps=1 generates while the learner trains, so the engine cannot sleep "
                          "then: set rollout.enable_sleep_mode=false, or async_steps=0 to share one GPU")
    if not 0 < r.gpu_memory_utilization <= 1:
        raise ConfigError(f"rollout.gpu_memory_utilization must be in (0, 1] (got {r.gpu_memory_utilization})")
    if r.engine != "vllm" and (r.enable_sleep_mode or not r.in_process or r.tensor_parallel_size > 1):
        raise ConfigError("rollout.enable_sleep_mode, rollout.in_process=false and rollout.tensor_parallel_size "
                          f"need rollout=vllm (this run uses rollout.engine={r.engine})")
    _choice("reward.on_error", cfg.reward.on_error, ("raise", "zero"))
    _at_least("reward.workers", cfg.reward.workers, 1)
    if cfg.reward.timeout_s <= 0:
        raise ConfigError(f"reward.timeout_s must be > 0 (got {cfg.reward.timeout_s})")
    if cfg.logger.mode is not None:
        _choice("logger.mode", cfg.logger.mode, ("online", "offline", "disabled"))
    _choice("rollout.weight_sync", r.weight_sync, WEIGHT_SYNCS)
    if r.weight_sync == "broadcast" and (r.engine != "vllm" or r.in_process):
        raise ConfigError("rollout.weight_sync=broadcast needs rollout=vllm with rollout.in_process=false "
                          "(the workers must be other processes to join the broadcast group)")
    if r.engine == "vllm":
        from rlft.rollout.vllm_engine import INSTALL_HINT, vllm_available
        if not vllm_available():
            raise ConfigError(INSTALL_HINT)
    _at_least("trainer.steps", t.steps, 1)
    _at_least("trainer.prompts_per_step", t.prompts_per_step, 1)
    _at_least("trainer.eval_every", t.eval_every, 1)
    _at_least("trainer.save_every", t.save_every, 1)
    _at_least("trainer.keep_checkpoints", t.keep_checkpoints, 1)
    if t.epochs is not None and t.epochs <= 0:
        raise ConfigError(f"trainer.epochs must be > 0 or null (got {t.epochs})")
    if not 0 <= a.eps_low < 1 or a.eps_high < 0:
        raise ConfigError(f"algo.eps_low must be in [0, 1) and algo.eps_high >= 0 (got {a.eps_low}, {a.eps_high})")
    if a.clip_ratio_c is not None and a.clip_ratio_c <= 1:
        raise ConfigError(f"algo.clip_ratio_c must be > 1 or null (got {a.clip_ratio_c})")
    if a.tis_cap is not None and a.tis_cap <= 0:
        raise ConfigError(f"algo.tis_cap must be > 0 or null (got {a.tis_cap})")
    if a.kl_coef < 0:
        raise ConfigError(f"algo.kl_coef must be >= 0 (got {a.kl_coef})")
    if r.temperature <= 0:
        raise ConfigError(f"rollout.temperature must be > 0 for training (got {r.temperature})")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1] (got {r.top_p})")
    if cfg.optim.lr <= 0 or len(cfg.optim.betas) != 2:
        raise ConfigError("optim.lr must be > 0 and optim.betas a list of two floats")
    if t.exit_after_step is not None and not 1 <= t.exit_after_step <= t.steps:
        raise ConfigError(f"trainer.exit_after_step must be in [1, trainer.steps] (got {t.exit_after_step})")
    _choice("algo.routing_source", a.routing_source, ROUTING_SOURCES)
    if a.routing_source == "rollout" and r.engine == "vllm" and cfg.hardware.device == "cpu":
        raise ConfigError("algo.routing_source=rollout with rollout=vllm needs a GPU: vLLM 0.32 returns routed "
                          "experts only with its Model Runner V2, which needs Triton. On CPU use rollout=hf, or "
                          "algo.routing_source=learner")
    if a.router_aux_loss_coef < 0:
        raise ConfigError(f"algo.router_aux_loss_coef must be >= 0 (got {a.router_aux_loss_coef})")
    if a.overlong.enabled and a.overlong.buffer is not None and not 1 <= a.overlong.buffer <= r.max_new_tokens:
        raise ConfigError(f"algo.overlong.buffer must be in [1, rollout.max_new_tokens={r.max_new_tokens}] "
                          f"or null (got {a.overlong.buffer})")
    if cfg.data.name == "dataset" and not cfg.data.path:
        raise ConfigError("data.path is required with data=dataset (a .jsonl/.csv/.parquet file, a folder or a hub id)")
    if cfg.data.name == "reasoning_gym" and not cfg.data.tasks:
        raise ConfigError("data=reasoning_gym needs data.tasks, e.g. data.tasks={countdown: 1.0}")
    if cfg.data.max_prompt_tokens is not None:
        _at_least("data.max_prompt_tokens", cfg.data.max_prompt_tokens, 1)


def _validate_hardware(cfg: RunConfig) -> None:
    h, r = cfg.hardware, cfg.rollout
    _choice("hardware.device", h.device, DEVICES)
    _choice("hardware.placement_strategy", h.placement_strategy, PLACEMENT_STRATEGIES)
    for key in ("learner_ranks", "rollout_workers", "cpus_per_actor"):
        _at_least(f"hardware.{key}", getattr(h, key), 1)
    _at_least("hardware.max_rollout_restarts", h.max_rollout_restarts, 0)
    if not h.ray and (h.learner_ranks > 1 or h.rollout_workers > 1 or h.ray_address):
        raise ConfigError("hardware.learner_ranks > 1, hardware.rollout_workers > 1 and hardware.ray_address "
                          "need hardware.ray=true (e.g. hardware=cpu_ray)")
    if h.fsdp and h.learner_ranks < 2:
        raise ConfigError("hardware.fsdp shards over learner ranks: it needs hardware.learner_ranks >= 2")
    if h.ray and r.weight_sync == "broadcast":
        raise ConfigError("with hardware.ray the rollout actors always receive weights by broadcast from learner "
                          "rank 0; leave rollout.weight_sync=rpc (how each actor hands them to its engine)")
    if h.ray and r.enable_sleep_mode:
        raise ConfigError("rollout.enable_sleep_mode is for one process sharing a GPU (hardware=1gpu_colocated); "
                          "Ray actors each have their own GPUs")
    if h.device == "cuda" and r.engine == "vllm" and h.gpus_per_rollout_worker != r.tensor_parallel_size and h.ray:
        raise ConfigError(f"hardware.gpus_per_rollout_worker={h.gpus_per_rollout_worker} must equal "
                          f"rollout.tensor_parallel_size={r.tensor_parallel_size}: vLLM shards over the actor's GPUs")
    if (h.nodes is None) != (h.gpus_per_node is None):
        raise ConfigError("hardware.nodes and hardware.gpus_per_node go together (both set, or both null)")
    if h.nodes is not None:
        wanted = h.learner_ranks + h.rollout_workers * h.gpus_per_rollout_worker
        if wanted != h.nodes * h.gpus_per_node:
            raise ConfigError(f"hardware: learner_ranks {h.learner_ranks} + rollout_workers {h.rollout_workers} x "
                              f"gpus_per_rollout_worker {h.gpus_per_rollout_worker} = {wanted} GPUs, but nodes "
                              f"{h.nodes} x gpus_per_node {h.gpus_per_node} = {h.nodes * h.gpus_per_node}")
    batch = cfg.trainer.prompts_per_step * cfg.algo.group_size
    if batch < h.learner_ranks or cfg.trainer.prompts_per_step < h.rollout_workers:
        raise ConfigError(f"{cfg.trainer.prompts_per_step} prompts/step x {cfg.algo.group_size} = {batch} responses "
                          f"cannot feed hardware.learner_ranks={h.learner_ranks} and "
                          f"hardware.rollout_workers={h.rollout_workers} (one prompt each at least)")


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}='{value}' is not one of: {', '.join(allowed)}")


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} must be >= {low} (got {value})")
