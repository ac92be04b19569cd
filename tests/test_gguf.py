"""model.path=FOLDER/FILE.gguf: a GGUF file (written here with the gguf package, no download) becomes a cached
Hugging Face folder that every loader then reads."""

import numpy as np
import pytest
import torch

from rlft.errors import ConfigError
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path

H, LAYERS, HEADS, KV_HEADS, FF = 64, 2, 4, 2, 128


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: the byte-level BPE vocabulary GGUF tokenizers use."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def write_tiny_gguf(path) -> dict[str, np.ndarray]:
    import gguf
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = byte_tokens() + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab, head_dim = len(tokens), H // HEADS
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": (rng.standard_normal((vocab, H)) * 0.02).astype(np.float32)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        shapes = {"attn_q": (HEADS * head_dim, H), "attn_k": (KV_HEADS * head_dim, H),
                  "attn_v": (KV_HEADS * head_dim, H), "attn_output": (H, HEADS * head_dim),
                  "ffn_gate": (FF, H), "ffn_up": (FF, H), "ffn_down": (H, FF)}
        for name, shape in shapes.items():
            tensors[f"{p}{name}.weight"] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        for name in ("attn_q", "attn_k", "attn_v"):  # qwen2 has q/k/v biases
            tensors[f"{p}{name}.bias"] = np.zeros(shapes[name][0], np.float32)
        tensors[f"{p}attn_norm.weight"] = np.ones(H, np.float32)
        tensors[f"{p}ffn_norm.weight"] = np.ones(H, np.float32)
    tensors["output_norm.weight"] = np.ones(H, np.float32)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(128)
    writer.add_embedding_length(H)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(1e4)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 3) + [3] * 3)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    writer.add_pad_token_id(vocab - 3)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_a_gguf_file_converts_once_and_loads_like_any_model(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path / "cache"))
    tensors = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = resolve_model_path(str(tmp_path / "tiny.gguf"))
    assert str(tmp_path / "cache" / "gguf") in folder
    model = load_causal_lm(folder, "float32", "cpu")
    tokenizer = load_tokenizer(folder)
    assert model.config.num_hidden_layers == LAYERS and model.config.num_key_value_heads == KV_HEADS
    assert torch.equal(model.get_input_embeddings().weight, torch.from_numpy(tensors["token_embd.weight"]))
    assert torch.equal(model.model.layers[1].self_attn.v_proj.weight, torch.from_numpy(tensors["blk.1.attn_v.weight"]))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    out = model.generate(torch.tensor([tokenizer.encode("the")]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] == len(tokenizer.encode("the")) + 3
    # the second time, the cached folder: no conversion
    (tmp_path / "cache" / "gguf" / folder.rsplit("/", 1)[1] / "marker").write_text("")
    assert resolve_model_path(str(tmp_path / "tiny.gguf")) == folder


def test_gguf_mistakes_are_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="model.path '.*missing.gguf': no such GGUF file"):
        resolve_model_path(str(tmp_path / "missing.gguf"))
    (tmp_path / "broken.gguf").write_bytes(b"GGUF but not really")
    with pytest.raises(ConfigError, match="model.path '.*broken.gguf': cannot load it as a GGUF model"):
        resolve_model_path(str(tmp_path / "broken.gguf"))
