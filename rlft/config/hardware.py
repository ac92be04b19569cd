"""`hardware`: where the learner and the rollout engine run. `cpu` and `1gpu_colocated` are one process;
`cpu_ray`, `8gpu` and `multinode` are Ray actors placed by one placement group, the learner ranks a
torch.distributed group (gloo on CPU, NCCL on GPUs). Ray's keys exist only in the Ray options."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Optional

from rlft.config.checks import at_least, positive
from rlft.errors import ConfigError


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


class PlacementStrategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


@dataclass
class LocalHardware:
    ray: ClassVar[bool] = False
    device: Device = Device.cpu
    """cpu, or cuda: the learner and the engine on this process's GPU."""


@dataclass
class RayHardware:
    ray: ClassVar[bool] = True
    device: Device = Device.cpu
    """cpu (gloo between learner ranks), or cuda (one GPU per learner rank, NCCL)."""
    ray_address: Optional[str] = None
    """null: start a Ray instance here; "auto" or host:port: join a running cluster."""
    learner_ranks: int = 2
    """Data-parallel learner actors; each trains on its share of the step's responses."""
    rollout_workers: int = 1
    """Rollout actors, an engine each; a step's prompts are split between them."""
    gpus_per_rollout_worker: int = 1
    """cuda: GPUs per rollout actor (= rollout.tensor_parallel_size for vLLM)."""
    fsdp: bool = False
    """Shard weights, gradients and optimizer state over the learner ranks (FSDP2)."""
    cpus_per_actor: int = 1
    """CPUs Ray reserves per actor (and its torch threads, unless OMP_NUM_THREADS)."""
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK
    """Ray placement group strategy: PACK (fewest nodes), SPREAD, STRICT_PACK, STRICT_SPREAD."""
    placement_timeout_s: float = 120.0
    """How long to wait for the cluster to grant every actor's resources."""
    max_rollout_restarts: int = 3
    """A rollout actor that dies is replaced and the call retried, this often per call."""
    nodes: Optional[int] = None
    """multinode: nodes, checked with gpus_per_node against the actors' GPUs at start."""
    gpus_per_node: Optional[int] = None
    """multinode: GPUs per node."""


def check(cfg) -> None:
    h = cfg.hardware
    if not h.ray:
        return
    for key in ("learner_ranks", "rollout_workers", "cpus_per_actor", "gpus_per_rollout_worker"):
        at_least(f"hardware.{key}", getattr(h, key), 1)
    at_least("hardware.max_rollout_restarts", h.max_rollout_restarts, 0)
    positive("hardware.placement_timeout_s", h.placement_timeout_s)
    if h.fsdp and h.learner_ranks < 2:
        raise ConfigError("hardware.fsdp shards over learner ranks: it needs hardware.learner_ranks >= 2")
    if getattr(cfg.rollout, "enable_sleep_mode", False):
        raise ConfigError("rollout.enable_sleep_mode is for one process sharing a GPU (hardware=1gpu_colocated); "
                          "Ray actors each have their own GPUs")
    if getattr(cfg.rollout, "weight_sync", "rpc") == "broadcast":
        raise ConfigError("with Ray the rollout actors always receive weights by broadcast from learner rank 0; "
                          "leave rollout.weight_sync=rpc (how each actor hands them to its engine)")
    tensor_parallel = getattr(cfg.rollout, "tensor_parallel_size", 1)
    if h.device == Device.cuda and cfg.rollout.engine == "vllm" and h.gpus_per_rollout_worker != tensor_parallel:
        raise ConfigError(f"hardware.gpus_per_rollout_worker={h.gpus_per_rollout_worker} must equal "
                          f"rollout.tensor_parallel_size={tensor_parallel}: vLLM shards over the actor's GPUs")
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
