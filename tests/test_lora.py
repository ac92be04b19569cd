"""model.lora: only the adapters train and are checkpointed; the HF engine and the final model get the
merged weights, under their Hugging Face names; vLLM the adapter alone (tests/test_vllm_engine.py)."""

import copy
import json

import torch
from safetensors.torch import load_file

from conftest import TINY_RUN, read_metrics
from rlft.config.model import LoraSettings
from rlft.models.lora import merged_lora_weights, with_lora
from rlft.models.loading import load_causal_lm, resolve_model_path

PATH = resolve_model_path("builtin:tiny-adder")


def test_merged_weights_equal_peft_merge_and_keep_the_policy_as_it_is():
    model = with_lora(load_causal_lm(PATH, "float32", "cpu"), LoraSettings(r=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at 0: make the delta non-zero
                p.normal_(0, 0.1)
    before = {n: p.clone() for n, p in model.named_parameters()}
    merged = merged_lora_weights(model)
    reference = copy.deepcopy(model).merge_and_unload()
    assert merged.keys() == dict(reference.named_parameters()).keys()
    for name, tensor in reference.named_parameters():
        assert torch.allclose(merged[name], tensor, atol=1e-6), name
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_a_lora_run_trains_adapters_and_syncs_merged_weights(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=2", "trainer.eval_every=2", "model.lora.r=4",
         "optim.lr=1e-2", "optim.warmup_steps=0", "algo.kl_coef=0.04")
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    # step 2 samples with the merged weights of step 1: engine and learner (base + adapters) agree
    assert rows[1]["rollout/logprob_diff_max"] < 1e-4 and rows[1]["train/grad_norm"] > 0
    checkpoint = load_file(run / "checkpoints" / "step_000002" / "model.safetensors")
    assert checkpoint and all(".lora_" in name for name in checkpoint)  # adapters only
    final = load_file(run / "final_model" / "model.safetensors")
    start = load_file(f"{PATH}/model.safetensors")
    assert set(final) <= set(start) | {"lm_head.weight"}
    assert torch.equal(final["model.embed_tokens.weight"], start["model.embed_tokens.weight"])  # not a target
    assert not torch.equal(final["model.layers.0.self_attn.q_proj.weight"],
                           start["model.layers.0.self_attn.q_proj.weight"])
    assert json.loads((run / "final_model" / "config.json").read_text())["model_type"] == "qwen2"


def test_the_learner_sends_vllm_the_adapter_and_the_hf_engine_merged_weights():
    from rlft.config.compose import compose, to_run_config
    from rlft.learner.local import LocalLearner

    def sent(*overrides):
        dcfg, choices = compose(["model.lora.r=4", *overrides])
        return LocalLearner(to_run_config(dcfg, choices), str(PATH)).rollout_weights()

    to_vllm, to_hf = sent("rollout=vllm"), sent()
    assert to_vllm and all(name.endswith((".lora_A.weight", ".lora_B.weight")) for name in to_vllm)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in to_vllm  # peft's saved names
    assert set(to_hf) == set(load_file(f"{PATH}/model.safetensors")) - {"lm_head.weight"}
