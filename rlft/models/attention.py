"""Scaled-dot-product attention that keeps grouped keys and values grouped.

transformers' `sdpa` path repeats each key/value head for its group of query heads (a full copy of the
KV cache, every layer, every decode step) whenever there is an attention mask and the device is not an
XPU or MPS: always, for a batch of left-padded prompts. PyTorch's CPU kernel takes the groups itself
(`enable_gqa`), so on CPU this variant hands it the unrepeated heads (elsewhere it is transformers' sdpa). Same numbers, no copy:
at SmolLM2's 9 query / 3 key-value heads a CPU decode step's attention costs about a third
(docs/bench_vs_trl.md). Everything else (the causal flag, masks, packed sequences) is transformers'
sdpa path: the mask is built by its sdpa mask function.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "sdpa_grouped"


def grouped_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, Q, D], key/value [B, H_kv, K, D] -> ([B, Q, H, D], None), as transformers' sdpa."""
    groups = getattr(module, "num_key_value_groups", 1)
    # On CUDA a masked grouped call can fall back to the slow math kernel: transformers' choice stands there.
    if (groups == 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or kwargs.get("cache") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                      **kwargs)
    q_length, kv_length = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_length > 1 and attention_mask is None and causal)
    if causal and kv_length > q_length:  # sdpa's causal mask is aligned top-left: keep the first q keys
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
assert GROUPED_SDPA in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping  # else transformers would build no mask


def group_kv_heads(model: PreTrainedModel) -> PreTrainedModel:
    """Switch a model running transformers' sdpa to the grouped variant (any other choice stays)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(GROUPED_SDPA)
    return model
