"""`model`: the policy to fine-tune. The options (conf/model/) are presets of one schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from rlft.config.checks import at_least, positive
from rlft.errors import ConfigError


class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class LoraSettings:
    r: int = 16
    """Rank of the adapters."""
    alpha: float = 16.0
    """Scale: the update is (alpha / r) x B A."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])
    """Linear layers that get adapters (by name)."""


@dataclass
class ModelConfig:
    path: str = "builtin:tiny-adder"
    """builtin:NAME, a local Hugging Face folder, a hub id (org/name), or a GGUF file: FOLDER/FILE.gguf or
    ORG/REPO/FILE.gguf (dequantised once into $RLFT_CACHE)."""
    dtype: DType = DType.float32
    """The engines' weights and the learner's passes: float32, bfloat16 (GPUs) or float16."""
    master_dtype: DType = DType.float32
    """The learner's weights and AdamW state: float32 below a lower dtype is mixed precision; = dtype trains
    purely in it (small updates round away)."""
    lora: Optional[LoraSettings] = None
    """null = full fine-tuning; model.lora.r=16 trains LoRA adapters only (the HF engine gets merged weights,
    vLLM the adapter alone)."""


def check(cfg) -> None:
    m = cfg.model
    if m.master_dtype not in (DType.float32, m.dtype):
        raise ConfigError(f"model.master_dtype must be float32 (mixed precision) or model.dtype "
                          f"({m.dtype}: pure {m.dtype}) (got {m.master_dtype})")
    if not m.path.strip():
        raise ConfigError("model.path is empty: name a model (builtin:tiny-adder, a folder or a hub id)")
    if m.lora is not None:
        if not m.lora.r >= 1:
            raise ConfigError(f"model.lora.r must be >= 1 (got {m.lora.r}); model.lora=null turns LoRA off")
        positive("model.lora.alpha", m.lora.alpha)
        if not m.lora.target_modules:
            raise ConfigError("model.lora.target_modules is empty: name the layers that get adapters")
        if getattr(cfg.hardware, "fsdp", False):
            raise ConfigError("model.lora with hardware.fsdp is not supported yet (the adapters are small: "
                              "data-parallel ranks without FSDP hold them well)")
