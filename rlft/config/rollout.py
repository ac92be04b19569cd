"""`rollout`: the engine that generates, and how it samples. `engine` (not a key) is the option's name."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Optional

from rlft.config.checks import at_least, within
from rlft.config.env import response_budget, response_budget_key
from rlft.errors import ConfigError


class WeightSync(StrEnum):
    rpc = "rpc"
    broadcast = "broadcast"


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    """Sampling temperature (> 0); the learner scores tokens at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p."""
    max_new_tokens: int = 8
    """L_max: the longest response, in tokens."""
    max_staleness: int = 0
    """k: batches are generated up to k steps ahead while the learner trains, from weights at most k
    versions behind (pair it with algo.tis_cap); 0: on-policy."""
    async_steps: int = 0
    """The older name of max_staleness=1 (0 or 1)."""
    partial_rollouts: bool = False
    """Responses unfinished when a step has its groups continue next step under the newer weights (each
    token keeps its version); needs max_staleness >= 1, the age of a carried token."""
    chunk_tokens: Optional[int] = None
    """Partial rollouts: tokens per sequence per engine pass; null = a quarter of max_new_tokens (multi-turn:
    of env.max_tokens)."""

    @property
    def staleness(self) -> int:
        """k, from either key."""
        return max(self.max_staleness, self.async_steps)


@dataclass
class HFRollout(SamplingConfig):
    engine: ClassVar[str] = "hf"
    max_batch_size: int = 1024
    """Sequences the Hugging Face engine generates at once (bounds its memory)."""


@dataclass
class VLLMRollout(SamplingConfig):
    engine: ClassVar[str] = "vllm"
    gpu_memory_utilization: float = 0.5
    """Share of the GPU's memory vLLM may take (weights + KV cache); leave room for a colocated learner."""
    tensor_parallel_size: int = 1
    """GPUs one engine shards the model over."""
    enable_sleep_mode: bool = False
    """Release vLLM's GPU memory while the learner trains (one GPU shared: hardware=1gpu_colocated)."""
    in_process: bool = True
    """false: the engine core runs in its own process (weights travel as bytes, or by weight_sync=broadcast)."""
    max_model_len: Optional[int] = None
    """Longest prompt + response vLLM plans for; null = the model's own limit."""
    sync_bucket_mb: int = 256
    """Weights travel to the engine in buckets of this many MiB."""
    weight_sync: WeightSync = WeightSync.rpc
    """rpc: through vLLM's worker calls; broadcast (with in_process=false): a torch.distributed group
    (NCCL/gloo) from the learner to vLLM's workers."""


def check(cfg) -> None:
    r = cfg.rollout
    if not (r.temperature > 0 and r.temperature < float("inf")):
        raise ConfigError(f"rollout.temperature must be > 0 for training (got {r.temperature})")
    within("rollout.top_p", r.top_p, 0, 1, low_open=True)
    at_least("rollout.max_new_tokens", r.max_new_tokens, 1)
    if r.async_steps not in (0, 1):
        raise ConfigError(f"rollout.async_steps must be 0 (on-policy) or 1 (one step ahead) (got {r.async_steps}); "
                          "rollout.max_staleness takes any k")
    at_least("rollout.max_staleness", r.max_staleness, 0)
    if r.async_steps and r.max_staleness not in (0, 1):
        raise ConfigError(f"rollout.async_steps=1 is rollout.max_staleness=1, and max_staleness={r.max_staleness} "
                          "was given too: set max_staleness only")
    check_partial(cfg)
    if isinstance(r, HFRollout):
        at_least("rollout.max_batch_size", r.max_batch_size, 1)
        return
    within("rollout.gpu_memory_utilization", r.gpu_memory_utilization, 0, 1, low_open=True)
    at_least("rollout.tensor_parallel_size", r.tensor_parallel_size, 1)
    at_least("rollout.sync_bucket_mb", r.sync_bucket_mb, 1)
    if r.max_model_len is not None:
        at_least("rollout.max_model_len", r.max_model_len, 1)
    if r.staleness and r.enable_sleep_mode:
        key = f"rollout.max_staleness={r.max_staleness}" if r.max_staleness else "rollout.async_steps=1"
        raise ConfigError(f"{key} generates while the learner trains, so the engine cannot sleep "
                          "then: set rollout.enable_sleep_mode=false, or max_staleness=0 to share one GPU")
    if r.weight_sync == WeightSync.broadcast and r.in_process:
        raise ConfigError("rollout.weight_sync=broadcast needs rollout.in_process=false (the workers must be "
                          "other processes to join the broadcast group)")
    if cfg.algo.routing_source == "rollout" and cfg.hardware.device == "cpu":
        raise ConfigError("algo.routing_replay=rollout with rollout=vllm needs a GPU: vLLM 0.32 returns routed "
                          "experts only with its Model Runner V2, which needs Triton. On CPU use rollout=hf, or "
                          "algo.routing_replay=learner")


def check_partial(cfg) -> None:
    r = cfg.rollout
    if not r.partial_rollouts:
        if r.chunk_tokens is not None:
            raise ConfigError(f"rollout.chunk_tokens={r.chunk_tokens} is for partial rollouts only: set "
                              "rollout.partial_rollouts=true, or drop chunk_tokens")
        return
    if r.staleness < 1:
        raise ConfigError("rollout.partial_rollouts=true continues responses under the next weights, so their "
                          "tokens are a version old when trained on: set rollout.max_staleness >= 1")
    if r.chunk_tokens is not None:
        at_least("rollout.chunk_tokens", r.chunk_tokens, 1)
    budget = response_budget(cfg)
    if partial_chunk(cfg) >= budget:
        raise ConfigError(f"rollout.chunk_tokens={partial_chunk(cfg)} is not below {response_budget_key(cfg)}="
                          f"{budget}: every response would finish in one pass (nothing is partial)")


def partial_chunk(cfg) -> Optional[int]:
    """Tokens per sequence per engine pass with partial rollouts, None without."""
    r = cfg.rollout
    if not r.partial_rollouts:
        return None
    return r.chunk_tokens if r.chunk_tokens is not None else max(1, response_budget(cfg) // 4)
