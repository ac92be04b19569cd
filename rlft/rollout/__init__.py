"""Rollout engines behind one interface (rlft.types.RolloutEngine), chosen by the `rollout` option, and the
collector that drives them through phases 1-3 of the loop (rlft.rollout.collect)."""

from __future__ import annotations

from rlft.models.loading import load_causal_lm
from rlft.types import RolloutEngine


def build_engine(cfg, model_path: str, dtype: str, device: str, tokenizer, seed: int,
                 return_routes: bool = False, lora=None) -> RolloutEngine:
    """An engine with its own copy of the weights at `model_path`, as `cfg` (rlft.config.rollout) says;
    `return_routes`: with each rollout, the MoE experts every token was routed to (routing replay R3);
    `lora` (model.lora): vLLM takes the adapter alone at each sync, the HF engine merged weights."""
    eos = getattr(tokenizer, "eos_token_id", None)
    eos_ids = sorted({eos} if eos is not None else set())
    if cfg.engine == "hf":
        from rlft.rollout.hf_engine import HFEngine
        model = load_causal_lm(model_path, dtype, device)
        generation_eos = model.generation_config.eos_token_id
        if generation_eos is not None:
            more = [generation_eos] if isinstance(generation_eos, int) else generation_eos
            eos_ids = sorted(set(eos_ids) | set(more))
        return HFEngine(model, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids, seed=seed,
                        max_batch_size=cfg.max_batch_size, return_routes=return_routes)
    from rlft.rollout.vllm_engine import VLLMEngine
    return VLLMEngine(str(model_path), str(dtype), seed, pad_id=tokenizer.pad_token_id,
                      max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.gpu_memory_utilization,
                      tensor_parallel_size=cfg.tensor_parallel_size, enable_sleep_mode=cfg.enable_sleep_mode,
                      in_process=cfg.in_process, sync_bucket_mb=cfg.sync_bucket_mb,
                      weight_sync=str(cfg.weight_sync), return_routes=return_routes, lora=lora)


def engine_for(cfg, model_path: str, seed: int) -> RolloutEngine:
    """The engine a run's config (rlft.config.RunConfig) asks for, in this process or in a rollout actor."""
    from rlft.models.loading import load_tokenizer
    return build_engine(cfg.rollout, model_path, cfg.model.dtype, str(cfg.hardware.device), load_tokenizer(model_path),
                        seed=seed, return_routes=cfg.algo.routing_source == "rollout", lora=cfg.model.lora)
