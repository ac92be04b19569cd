"""rollout=vllm on vLLM's CPU build (`make setup-vllm`; CI installs it). Skipped where vLLM is absent.

These tests also guard the vLLM version pin: they call every vLLM API rlft uses (LLM construction options,
TokensPrompt, SamplingParams with logprobs, collective_rpc("reload_weights"), the worker extension,
reset_prefix_cache, enable_lora with LoRARequest, add_lora and the workers' adapter cache), so an upgrade that
changes one of them fails here first.
"""

import copy
from pathlib import Path

import pytest
import torch
from conftest import push_weights

from rlft.algos.advantages import group_advantages
from rlft.data.arithmetic import addition_problem
from rlft.learner.logprobs import response_logprobs
from rlft.config.model import LoraSettings
from rlft.learner.policy import Policy
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlft.models.lora import adapter_weights, with_lora
from rlft.rollout.hf_engine import HFEngine
from rlft.rollout.vllm_engine import vllm_available
from rlft.types import LossSettings, SamplingParams, TrainBatch

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM not installed (make setup-vllm)")]

GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
# Same weights, float32, CPU: vLLM's kernels and the learner's differ only in summation order.
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def parts():
    from rlft.rollout.vllm_engine import VLLMEngine
    path = resolve_model_path("builtin:tiny-adder")
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(p.prompt) for p in problems(64, seed=3)]
    engine = VLLMEngine(str(path), "float32", seed=0, pad_id=tokenizer.pad_token_id)
    return path, tokenizer, prompts, engine


def problems(count, seed):
    rng = torch.Generator().manual_seed(seed)
    return [addition_problem(int(a), int(b)) for a, b in torch.randint(10, 100, (count, 2), generator=rng)]


def hf_engine(model, tokenizer):
    return HFEngine(copy.deepcopy(model), tokenizer.pad_token_id, [tokenizer.eos_token_id], seed=0)


def texts(tokenizer, rollout):
    return tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)


def test_greedy_equals_hf_engine_with_the_same_weights(parts):
    path, tokenizer, prompts, engine = parts
    hf = hf_engine(load_causal_lm(path, "float32", "cpu"), tokenizer)
    ours, theirs = engine.generate(prompts, GREEDY), hf.generate(prompts, GREEDY)
    assert texts(tokenizer, ours) == texts(tokenizer, theirs)
    assert torch.equal(ours.truncated, theirs.truncated)


def test_groups_logprobs_and_finish_reasons(parts):
    path, tokenizer, prompts, engine = parts
    rollout = engine.generate(prompts[:4], SamplingParams(n=8, temperature=1.0, max_new_tokens=3))
    assert rollout.response_ids.shape[0] == 32
    for row in range(32):  # the n responses of one prompt are adjacent, after that prompt
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        assert prompt == prompts[row // 8]
        length = int(rollout.response_lengths[row])
        ids = rollout.response_ids[row, :length].tolist()
        assert rollout.truncated[row] == (tokenizer.eos_token_id not in ids)  # "length" vs "stop"
        assert length == 3 or ids[-1] == tokenizer.eos_token_id
    learner_logp = response_logprobs(load_causal_lm(path, "float32", "cpu"), rollout.prompt_ids,
                                     rollout.prompt_mask, rollout.response_ids, rollout.response_mask)
    assert (rollout.logprobs * rollout.response_mask).ne(0).any()
    assert (learner_logp - rollout.logprobs).abs().max() < LOGPROB_TOLERANCE
    # Temperature: vLLM reports the log-probs of the tempered distribution, as the learner scores them.
    hot = engine.generate(prompts[:4], SamplingParams(n=4, temperature=0.7, max_new_tokens=3))
    hot_logp = response_logprobs(load_causal_lm(path, "float32", "cpu"), hot.prompt_ids, hot.prompt_mask,
                                 hot.response_ids, hot.response_mask, temperature=0.7)
    assert (hot_logp - hot.logprobs).abs().max() < LOGPROB_TOLERANCE


def test_after_a_training_step_and_a_sync_vllm_follows_the_learner(parts):
    path, tokenizer, prompts, engine = parts
    before = texts(tokenizer, engine.generate(prompts, GREEDY))
    rollout = engine.generate(prompts[:8], SamplingParams(n=4, temperature=1.0, max_new_tokens=6))
    rewards = torch.rand(32, generator=torch.Generator().manual_seed(0))
    learner = Policy(load_causal_lm(path, "float32", "cpu"), max_grad_norm=1e9)
    batch = TrainBatch(rollout, advantages=group_advantages(rewards, 4), loss_mask=rollout.response_mask)
    learner.update(batch, LossSettings(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None,
                                       loss_agg="token_mean", max_response_len=6), lr=3e-3)
    sent = push_weights(learner.model, engine)
    assert sent == sum(p.numel() * 4 for p in learner.model.parameters())
    after = engine.generate(prompts, GREEDY)
    assert texts(tokenizer, after) == texts(tokenizer, hf_engine(learner.model, tokenizer).generate(prompts, GREEDY))
    assert texts(tokenizer, after) != before
    # The new weights are in use for log-probs too (and no stale prefix-cache entry survived).
    learner_logp = response_logprobs(learner.model, after.prompt_ids, after.prompt_mask, after.response_ids,
                                     after.response_mask)
    assert (learner_logp - after.logprobs).abs().max() < LOGPROB_TOLERANCE
    push_weights(load_causal_lm(path, "float32", "cpu"), engine)  # leave the shared engine as it was
    assert texts(tokenizer, engine.generate(prompts, GREEDY)) == before


@pytest.mark.parametrize("part", ["embed_tokens", "norm", "self_attn.q_proj", "mlp.down_proj"])
def test_every_kind_of_weight_arrives_tied_embeddings_included(parts, part):
    # The tiny model ties lm_head to embed_tokens: the learner sends the shared tensor once, under the
    # embedding's name, and vLLM's output head must follow it too.
    path, tokenizer, prompts, engine = parts
    model = load_causal_lm(path, "float32", "cpu")
    assert model.config.tie_word_embeddings
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if part in name:
                p.add_(0.05 * torch.randn_like(p))
    push_weights(model, engine)
    rollout = engine.generate(prompts[:8], SamplingParams(n=2, temperature=1.0, max_new_tokens=4))
    learner_logp = response_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                     rollout.response_mask)
    push_weights(load_causal_lm(path, "float32", "cpu"), engine)
    assert (learner_logp - rollout.logprobs).abs().max() < LOGPROB_TOLERANCE


# ---- model.lora: vLLM takes the adapter alone, under a new id each sync, and checks that its workers hold it

LORA = LoraSettings(r=4, alpha=8.0)


@pytest.fixture(scope="module")
def lora_engine(parts):
    from rlft.rollout.vllm_engine import VLLMEngine
    path, tokenizer, _, _ = parts
    return VLLMEngine(str(path), "float32", seed=0, pad_id=tokenizer.pad_token_id, lora=LORA)


def trained_adapter(path, seed: int):
    """The policy with its adapter moved as training would move it (peft starts B at zero: no change)."""
    torch.manual_seed(seed)  # peft's random A
    model = with_lora(load_causal_lm(path, "float32", "cpu"), LORA)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_a_lora_sync_sends_the_adapter_alone_and_vllm_serves_base_plus_adapter(parts, lora_engine):
    path, tokenizer, prompts, _ = parts
    served = texts(tokenizer, lora_engine.generate(prompts, GREEDY))  # no adapter yet: the base model
    assert served == texts(tokenizer, hf_engine(load_causal_lm(path, "float32", "cpu"), tokenizer)
                           .generate(prompts, GREEDY))
    for seed in (1, 2):  # the second adapter must replace the first, not be served from vLLM's cache
        model = trained_adapter(path, seed)
        sent = adapter_weights(model)
        assert sent and all(".lora_A." in name or ".lora_B." in name for name in sent)
        lora_engine.update_weights(sent.items())
        merged = copy.deepcopy(model).merge_and_unload()  # peft's own merge: what the HF engine would get
        greedy = texts(tokenizer, lora_engine.generate(prompts, GREEDY))
        assert greedy == texts(tokenizer, hf_engine(merged, tokenizer).generate(prompts, GREEDY))
        assert greedy != served
        served = greedy
        rollout = lora_engine.generate(prompts[:8], SamplingParams(n=2, temperature=1.0, max_new_tokens=6))
        with torch.no_grad():
            learner_logp = response_logprobs(merged, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                             rollout.response_mask)
        assert (learner_logp - rollout.logprobs).abs().max() < LOGPROB_TOLERANCE
    folder = Path(lora_engine.adapter.lora_path)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # older adapters' folders are gone


def test_the_lora_sync_check_fires_when_the_adapter_does_not_reach_vllm(parts, lora_engine, monkeypatch):
    from vllm.lora.request import LoRARequest
    path = parts[0]
    lora_engine.update_weights(adapter_weights(trained_adapter(path, 3)).items())
    served = lora_engine.adapter
    fresh = adapter_weights(trained_adapter(path, 4))
    monkeypatch.setattr(lora_engine, "_deliver", lambda request: None)  # the push to vLLM's workers skipped
    with pytest.raises(RuntimeError, match="does not serve LoRA adapter rlft-v.*: it holds no adapter under that id"):
        lora_engine.update_weights(fresh.items())
    # the workers load an older adapter under the new id
    monkeypatch.setattr(lora_engine, "_deliver", lambda request: lora_engine.llm.llm_engine.add_lora(
        LoRARequest(request.lora_name, request.lora_int_id, served.lora_path)))
    with pytest.raises(RuntimeError, match="does not serve LoRA adapter rlft-v.*: it holds other tensors"):
        lora_engine.update_weights(fresh.items())
    assert lora_engine.adapter == served  # generation stays with the last adapter that passed
    monkeypatch.undo()
    lora_engine.update_weights(fresh.items())
    assert lora_engine.adapter.lora_int_id > served.lora_int_id + 2  # ids of failed syncs are not reused


def test_an_engine_refuses_weights_of_the_other_kind(parts, lora_engine):
    path, _, _, engine = parts
    merged = [(name, p.detach()) for name, p in load_causal_lm(path, "float32", "cpu").named_parameters()]
    with pytest.raises(ValueError, match="takes the LoRA adapter's tensors alone, got model.embed_tokens.weight"):
        lora_engine.update_weights(merged)
    with pytest.raises(ValueError, match="started without model.lora"):
        engine.update_weights(adapter_weights(trained_adapter(path, 5)).items())


@pytest.mark.slow
def test_rlft_train_with_lora_on_vllm_syncs_the_adapter_alone(rlft, tmp_path):
    from conftest import TINY_RUN, read_metrics
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", "rollout=vllm", *TINY_RUN, "trainer.steps=3", "trainer.eval_every=3",
         "model.lora.r=4", "optim.lr=1e-2", "optim.warmup_steps=0")
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    model_bytes = (Path(resolve_model_path("builtin:tiny-adder")) / "model.safetensors").stat().st_size
    assert all(0 < r["sync/bytes"] < model_bytes / 10 for r in rows)  # adapters: ~1/20 of the model
    # steps 2 and 3 sample with adapters 1 and 2 on vLLM: engine and learner (base + adapters) agree
    assert max(r["rollout/logprob_diff_max"] for r in rows[1:]) < 1e-4
    assert rows[2]["train/grad_norm"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["rpc", "broadcast"])  # safetensors bytes; a gloo broadcast group
def test_engine_in_its_own_process_receives_bucketed_weights(weight_sync):
    from rlft.rollout.vllm_engine import VLLMEngine
    path = resolve_model_path("builtin:tiny-adder")
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(p.prompt) for p in problems(32, seed=4)]
    # ~1/8 of the model per bucket, so several buckets travel and must be reassembled
    engine = VLLMEngine(str(path), "float32", seed=0, pad_id=tokenizer.pad_token_id, in_process=False,
                        sync_bucket_mb=1, weight_sync=weight_sync)
    model = load_causal_lm(path, "float32", "cpu")
    assert (engine.broadcaster is not None) == (weight_sync == "broadcast")
    before = texts(tokenizer, engine.generate(prompts, GREEDY))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.7)
    push_weights(model, engine)
    after = texts(tokenizer, engine.generate(prompts, GREEDY))
    assert after == texts(tokenizer, hf_engine(model, tokenizer).generate(prompts, GREEDY))
    assert after != before


@pytest.mark.slow
def test_rlft_train_with_the_vllm_engine_learns(rlft, tmp_path):
    from conftest import TINY_RUN, read_metrics
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", "rollout=vllm", "trainer.steps=20", "trainer.eval_every=20",
         "trainer.prompts_per_step=32", "algo.group_size=8", *TINY_RUN[2:])
    rows = read_metrics(run)
    evals = [r["eval/accuracy"] for r in rows if r.get("kind") == "eval"]
    steps = [r for r in rows if r.get("kind") != "eval"]
    assert evals[-1] > evals[0] + 0.3, evals  # measured: 0.29 -> 0.89 after 20 steps
    assert max(r["rollout/logprob_diff_max"] for r in steps) < 1e-3
    assert all(r["sync/bytes"] > 0 for r in steps)


@pytest.mark.slow
def test_rlft_train_runs_the_calculator_environment_on_vllm(rlft, tmp_path):
    """Multi-turn episodes on vLLM: each turn from token ids (the history grows by sampled and observation ids),
    tool calls run, the learner agrees with the engine on every sampled token."""
    from conftest import read_metrics
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", "rollout=vllm", "env=calculator", "data=calculator", "model=tiny_calculator",
         "trainer.steps=3", "trainer.eval_every=3", "trainer.prompts_per_step=8", "algo.group_size=4",
         "data.eval_size=24", "logger.console=false")
    rows = read_metrics(run)
    steps = [r for r in rows if r.get("kind") != "eval"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert len(steps) == 3 and len(evals) == 2
    assert all(r["episode/tool_call_rate"] > 0 and r["episode/observation_tokens_mean"] > 0 for r in steps)
    assert all(r["episode/turns_mean"] > 1 for r in steps)
    assert max(r["rollout/logprob_diff_max"] for r in steps) < 1e-3
    assert evals[0]["eval/episode/tool_call_rate"] > 0


def test_a_moe_model_syncs_exactly_into_vllm():
    """model=tiny_moe: vLLM's CPU MoE prepacks the expert weights, and its in-place reload skips that step
    (rlft.rollout.vllm_worker repeats it). Without it the engine's log-probs drift by ~0.5 after one sync."""
    from rlft.rollout.vllm_engine import VLLMEngine
    path = resolve_model_path("builtin:tiny-moe")
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(p.prompt) for p in problems(16, seed=4)]
    # its own process: vLLM's parallel state, set up by this module's dense engine, has no expert group
    engine = VLLMEngine(str(path), "float32", seed=0, pad_id=tokenizer.pad_token_id, in_process=False)
    model = load_causal_lm(path, "float32", "cpu")

    def worst_gap() -> float:
        rollout = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6))
        with torch.no_grad():
            logp = response_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                     rollout.response_mask)
        return float((logp - rollout.logprobs).abs().max())

    assert worst_gap() < LOGPROB_TOLERANCE
    with torch.no_grad():
        for p in model.parameters():  # experts, routers, attention and embeddings all move
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    assert worst_gap() > 0.1
    push_weights(model, engine)
    assert worst_gap() < LOGPROB_TOLERANCE


def test_the_routed_experts_api_rlft_uses_on_gpus_is_there():
    """algo.routing_replay=rollout with vLLM runs on GPUs only (Model Runner V2); this guards its API here."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs
    from vllm.outputs import CompletionOutput
    assert "enable_return_routed_experts" in {f.name for f in dataclasses.fields(EngineArgs)}
    assert "routed_experts" in {f.name for f in dataclasses.fields(CompletionOutput)}
