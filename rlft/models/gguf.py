"""GGUF checkpoints (llama.cpp's format): dequantised once into a cached Hugging Face folder.

transformers reads GGUF with the `gguf` package, but slowly (~20 s for 135M parameters, pure-Python
metadata parsing) and keeps it as a "quantized" model that cannot be saved. rlft loads it once with
dequantize=True, saves safetensors + tokenizer into the cache, and every later load (learner, reference,
rollout engines, Ray actors) reads that folder in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rlft.errors import ConfigError


def cache_root() -> Path:
    return Path(os.environ.get("RLFT_CACHE", "~/.cache/rlft")).expanduser()


def converted_folder(source: str, gguf_file: str) -> Path:
    """Where the GGUF's conversion lives: one folder per file (name, size and mtime for local files)."""
    file = Path(source).expanduser() / gguf_file
    identity = f"{file.resolve()}:{file.stat().st_size}:{file.stat().st_mtime_ns}" if file.is_file() \
        else f"{source}/{gguf_file}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{Path(gguf_file).stem}-{digest}"


def convert_gguf(source: str, gguf_file: str, out: Path | None = None, dtype: str = "float32") -> Path:
    """The Hugging Face folder of `source/gguf_file` (source: a local folder or a hub id), converting it
    on first use; returns the folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = Path(source).expanduser()
    if folder.is_dir():
        if not (folder / gguf_file).is_file():
            raise ConfigError(f"model.path: no GGUF file '{gguf_file}' in {source}")
        source = str(folder)
    out = out or converted_folder(source, gguf_file)
    if (out / "config.json").is_file():
        return out
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file, dtype=getattr(torch, dtype),
                                                     quantization_config=GgufConfig(dequantize=True))
    except Exception as err:  # a truncated or foreign file fails deep in the reader, in many ways
        raise ConfigError(f"model.path '{source}/{gguf_file}': cannot load it as a GGUF model "
                          f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''})") from None
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # a whole folder or none: an interrupted conversion is redone
    return out
