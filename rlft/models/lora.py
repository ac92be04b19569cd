"""LoRA adapters on the policy (peft, `model.lora`): only the adapters train; the rollout engines and the
final model get the merged weights."""

from __future__ import annotations

import torch


def with_lora(model, settings):
    """The policy with LoRA adapters (peft) on `settings.target_modules`; their dropout is 0, as every
    dropout of the policy (RL ratios compare passes of one function)."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=0.0,
                                            target_modules=list(settings.target_modules), bias="none"))


@torch.no_grad()
def merged_lora_weights(model) -> dict[str, torch.Tensor]:
    """Hugging Face name -> base weight + LoRA delta, for a peft model (its own weights untouched)."""
    from peft.tuners.lora import LoraLayer
    deltas = {f"{name}.base_layer.weight": module.get_delta_weight(module.active_adapters[0])
              for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    prefix = "base_model.model."
    merged = {}
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        tensor = param.detach() + deltas[name] if name in deltas else param.detach()
        merged[name.removeprefix(prefix).replace(".base_layer.", ".")] = tensor
    return merged
