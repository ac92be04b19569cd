"""LoRA adapters on the policy (peft, `model.lora`): only the adapters train. The HF engine and the final
model get the merged weights; the vLLM engine gets the adapter alone (rlft.rollout.vllm_engine), as a peft
adapter folder it loads under a new adapter id each sync."""

from __future__ import annotations

from pathlib import Path

import torch


def lora_config(settings):
    """peft's LoraConfig for `settings` (rlft.config.model.LoraSettings); dropout 0, as every dropout of the
    policy (RL ratios compare passes of one function)."""
    from peft import LoraConfig
    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=0.0,
                      target_modules=list(settings.target_modules), bias="none")


def with_lora(model, settings):
    """The policy with LoRA adapters (peft) on `settings.target_modules`."""
    from peft import get_peft_model
    return get_peft_model(model, lora_config(settings))


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


@torch.no_grad()
def adapter_weights(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names peft saves them with (`...q_proj.lora_A.weight`), which is what
    vLLM reads from an adapter folder."""
    from peft import get_peft_model_state_dict
    return {name: t.detach() for name, t in get_peft_model_state_dict(model).items()}


def is_adapter_weight(name: str) -> bool:
    return name.endswith((".lora_A.weight", ".lora_B.weight"))


def write_adapter(folder: Path, tensors: dict[str, torch.Tensor], settings) -> None:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors), as save_pretrained writes it."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    save_file({name: t.cpu().contiguous() for name, t in tensors.items()}, folder / "adapter_model.safetensors")
    lora_config(settings).save_pretrained(folder)


def adapter_fingerprint(tensors: dict[str, torch.Tensor], settings) -> tuple[float, float, float]:
    """(sum A, sum |A|, sum |scale x B|) in float64: what an engine holding this adapter must report. Sums
    do not depend on how an engine lays the tensors out (vLLM transposes, packs q/k/v); vLLM folds the scale
    alpha / r into B when it loads an adapter, so B is compared in magnitude only."""
    scale = settings.alpha / settings.r
    a = [t.double() for name, t in tensors.items() if name.endswith(".lora_A.weight")]
    b = [t.double() for name, t in tensors.items() if name.endswith(".lora_B.weight")]
    return (sum(float(t.sum()) for t in a), sum(float(t.abs().sum()) for t in a),
            scale * sum(float(t.abs().sum()) for t in b))


def same_adapter(got: tuple[float, ...], expected: tuple[float, ...], dtype: torch.dtype) -> bool:
    """Fingerprints of one adapter: A arrives as sent (float64 sums differ in order only); B once rounded to
    `dtype` by the folded scale (half a unit in the last place per value at most)."""
    sum_a, abs_a, abs_b = expected
    return (len(got) == 3 and abs(got[0] - sum_a) <= 1e-9 * abs_a and abs(got[1] - abs_a) <= 1e-9 * abs_a
            and abs(got[2] - abs_b) <= torch.finfo(dtype).eps * abs_b)
