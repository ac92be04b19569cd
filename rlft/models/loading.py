"""Load a policy and its tokenizer from a built-in name, a local Hugging Face folder, or a hub id.

Built-in models ship inside the package (`builtin:tiny-adder`), so the default run needs no download;
every other path goes through the same `from_pretrained` calls.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlft.errors import ConfigError, first_line

BUILTIN_DIR = Path(__file__).parent
BUILTIN_PREFIX = "builtin:"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def builtin_models() -> list[str]:
    return sorted(p.name.replace("_", "-") for p in BUILTIN_DIR.iterdir() if (p / "config.json").exists())


def resolve_model_path(path: str) -> str:
    """A loadable path or hub id; raises ConfigError naming the problem for a missing local model.
    A GGUF file (FOLDER/FILE.gguf, or ORG/REPO/FILE.gguf on the hub) becomes the Hugging Face folder of
    its conversion (done on first use, rlft.models.gguf)."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        folder = BUILTIN_DIR / name.replace("-", "_")
        if not (folder / "config.json").exists():
            raise ConfigError(f"model.path '{path}': no such built-in model "
                              f"(available: {', '.join(BUILTIN_PREFIX + m for m in builtin_models())})")
        return str(folder)
    expanded = os.path.expanduser(path)
    if expanded.endswith(".gguf"):
        from rlft.models.gguf import convert_gguf
        source, _, file = expanded.rpartition("/")
        if os.path.isfile(expanded) or _looks_local(path):
            if not os.path.isfile(expanded):
                raise ConfigError(f"model.path '{path}': no such GGUF file")
            return str(convert_gguf(source or ".", file))
        return str(convert_gguf(source, file))  # ORG/REPO/FILE.gguf on the hub
    if os.path.exists(expanded):
        if not os.path.isfile(os.path.join(expanded, "config.json")):
            raise ConfigError(f"model.path '{path}' has no config.json: not a Hugging Face model folder")
        return expanded
    if _looks_local(path) or path.count("/") > 1:
        hint = " (make it with scripts/fetch_smollm2.py, or: make smollm2)" if "smollm2" in path else ""
        raise ConfigError(f"model.path '{path}' does not exist{hint}")
    return path  # a hub id such as 'org/name'


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~"))


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise ConfigError(f"model.path '{path}': cannot load a tokenizer ({first_line(err)})") from None
    if len(tokenizer) < 2:  # transformers gives an empty one for a folder without tokenizer files
        raise ConfigError(f"model.path '{path}': no tokenizer there (its vocabulary is empty: tokenizer.json, "
                          "tokenizer.model or vocab.json missing?); copy the tokenizer files with the model")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str, device: str, attn_implementation: str | None = None) -> PreTrainedModel:
    """The model on `device`; with no `attn_implementation`, transformers' default, where that is sdpa its
    variant that keeps grouped key/value heads grouped (rlft.models.attention: the same numbers, faster)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation=attn_implementation)
    except OSError as err:
        raise ConfigError(f"model.path '{path}': cannot load a causal LM ({first_line(err)})") from None
    if attn_implementation is None:
        from rlft.models.attention import group_kv_heads
        group_kv_heads(model)
    return model.to(device)


def empty_causal_lm(path: str) -> PreTrainedModel:
    """The model's modules with their weights on the meta device: every shape, no memory, no file read but
    the config (rlft.tooling.flops counts its work from it)."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
