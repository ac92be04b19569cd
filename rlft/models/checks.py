"""What a model must be for the run, checked from its config.json and file headers before any weights are
read: a config transformers understands, weight files that are whole, room in its context for a prompt and
a response, LoRA target modules it has, an attention kernel that is installed, and a step whose unavoidable
tensors fit in this machine's memory. Each problem is one ConfigError naming the key or the file.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from rlft.errors import ConfigError, first_line


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model's config.json that size a run."""
    context: int | None      # max_position_embeddings; None when the config does not say
    vocab: int
    hidden: int
    layers: int
    kv_width: int            # key/value heads x head dimension, per layer


def read_model_config(model_path: str, key: str = "model.path"):
    """transformers' config of the model, its errors worded as one line."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        first = first_line(err)
        config = Path(model_path) / "config.json"
        where = str(config) if config.is_file() else f"{key} '{model_path}'"
        raise ConfigError(f"{where}: not a model config transformers can read ({first})") from None


def shape_of(config) -> ModelShape:
    text = getattr(config, "text_config", None) or config  # multimodal configs nest the language model's
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(text, "head_dim", 0) or (hidden // heads if hidden else 0))
    kv_heads = int(getattr(text, "num_key_value_heads", heads) or heads)
    context = next((getattr(text, key) for key in ("max_position_embeddings", "n_positions", "max_seq_len",
                                                    "seq_length") if getattr(text, key, None)), None)
    return ModelShape(context=context, vocab=int(text.vocab_size or 0),
                      hidden=hidden, layers=int(getattr(text, "num_hidden_layers", 0) or 0),
                      kv_width=kv_heads * head_dim)


def check_weight_files(model_path: str) -> None:
    """Every .safetensors file of a local model folder is whole: its header parses and the file is as long
    as the header says (a download or copy cut short fails here, not in the middle of loading)."""
    folder = Path(model_path)
    if not folder.is_dir():
        return  # a hub id: transformers checks what it downloads
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ConfigError(f"model.path '{model_path}' has no weights (no .safetensors or pytorch_model.bin file)")
    for file in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem:
            raise ConfigError(f"{file}: {problem} (a truncated or damaged weights file; copy or download it again)")


def check_weights_match(config, model_path: str) -> None:
    """The weight files' tensors are the ones config.json builds, by name and shape, from the files' headers and
    the model built on the meta device: a config.json of another size (vocab_size, hidden_size, layers) fails
    here, not as a size mismatch in the middle of loading, or as layers silently left at random. Tensors the
    files lack are only looked for when every name in the files is one of the model's (checkpoints saved under
    other names, fused experts for one, are renamed by transformers as it loads)."""
    import re

    import torch
    from transformers import AutoModelForCausalLM
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    stored = {name: (file, entry.get("shape")) for file in files for name, entry in _header(file).items()
              if name != "__metadata__" and isinstance(entry, dict)}
    if not stored:
        return  # a hub id, or .bin weights
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    wanted = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    advice = "does config.json belong to these weights?"
    for name, (file, shape) in stored.items():
        if name in wanted and shape != wanted[name]:
            raise ConfigError(f"{file}: {name} is {shape} but config.json makes it {wanted[name]} ({advice})")
    if not set(stored) <= set(wanted):
        return
    shared: dict[int, list[str]] = {}  # tied weights (lm_head = embeddings) are stored once
    for name, parameter in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(parameter), []).append(name)
    present = {name for names in shared.values() if set(names) & set(stored) for name in names}
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    missing = [name for name in wanted if name not in stored and name not in present
               and not any(p.search(name) for p in ignored)]
    if missing:
        raise ConfigError(f"model.path '{model_path}': its weight files lack {len(missing)} of the tensors config.json "
                          f"makes ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}; {advice})")


def _header(file: Path) -> dict:
    with file.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(header_len))


def safetensors_problem(file: Path) -> str | None:
    """Why a .safetensors file cannot be whole (from its header and size), or None."""
    size = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{size} bytes, too short for a safetensors header"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return f"its header claims {header_len} bytes but the file has {size}"
        try:
            header = json.loads(handle.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "its header is not valid JSON"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    needed = 8 + header_len + max(ends, default=0)
    if needed > size:
        return f"{size} bytes, but its tensors need {needed}"
    return None


def check_context(shape: ModelShape, max_new_tokens: int, key: str = "rollout.max_new_tokens") -> None:
    if shape.context is not None and max_new_tokens >= shape.context:
        raise ConfigError(f"{key}={max_new_tokens} leaves no room for a prompt: the model's context "
                          f"is {shape.context} tokens (max_position_embeddings); use fewer")


def check_lora_targets(config, target_modules: list[str]) -> None:
    """The named layers exist: the model is built on the meta device (no weights, no memory) to list them."""
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear)}
    missing = [target for target in target_modules if target not in names]
    if missing:
        raise ConfigError(f"model.lora.target_modules: {', '.join(missing)} not in the model (its linear layers: "
                          f"{', '.join(sorted(names))})")


def check_attention(attn_implementation: str | None, device: str) -> None:
    if attn_implementation != "flash_attention_2":
        return
    import importlib.util
    if device != "cuda":
        raise ConfigError("compute.attn_implementation=flash_attention_2 needs a GPU (hardware.device=cuda); "
                          "on CPU use sdpa or eager")
    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("compute.attn_implementation=flash_attention_2 needs the flash-attn package "
                          "(pip install flash-attn), or use sdpa")


def step_bytes(shape: ModelShape, responses: int, micro_batch: int, sequence: int, engine_batch: int) -> int:
    """A floor on a step's memory that no setting removes: the rollout's token tensors, the engine's KV
    cache for the sequences it generates at once, and one training pass's float32 logits and their
    gradient (the peak of a pass). Parameters and activations come on top."""
    tokens = responses * sequence * 8 * 4              # ids, masks and log-probs of every response
    kv_cache = 2 * shape.layers * shape.kv_width * engine_batch * sequence * 4
    logits = 2 * micro_batch * sequence * shape.vocab * 4
    return tokens + kv_cache + logits


def available_memory_bytes(device: str) -> int | None:
    """Memory a run may use here: the GPU's free memory, or the host's (its cgroup limit when lower)."""
    if device == "cuda":
        import torch
        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total
