import pytest
import torch

from rlft.learner.logprobs import response_logprobs
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from conftest import push_weights
from rlft.rollout.hf_engine import HFEngine, _inverse_cdf_sample, _top_p_filter
from rlft.types import SamplingParams

PROMPTS = ["57+65=", "12+34=", "9+99=", "40+41="]


@pytest.fixture(scope="module")
def parts():
    path = resolve_model_path("builtin:tiny-adder")
    tokenizer = load_tokenizer(path)
    return path, tokenizer, [tokenizer.encode(p) for p in PROMPTS]


def make_engine(path, tokenizer, seed=0):
    return HFEngine(load_causal_lm(path, "float32", "cpu"), tokenizer.pad_token_id, [tokenizer.eos_token_id], seed)


def test_greedy_matches_transformers_generate(parts):
    path, tokenizer, prompts = parts
    engine = make_engine(path, tokenizer)
    rollout = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    ours = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    model = load_causal_lm(path, "float32", "cpu")
    for prompt, text in zip(prompts, ours):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        assert tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True) == text


def test_sampled_logprobs_equal_learner_logprobs_and_masks_stop_at_eos(parts):
    path, tokenizer, prompts = parts
    engine = make_engine(path, tokenizer)
    rollout = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=6))
    assert rollout.response_ids.shape[0] == 32
    learner_logp = response_logprobs(load_causal_lm(path, "float32", "cpu"), rollout.prompt_ids,
                                     rollout.prompt_mask, rollout.response_ids, rollout.response_mask)
    assert (learner_logp - rollout.logprobs).abs().max() < 1e-4
    for row in range(32):
        length = int(rollout.response_lengths[row])
        ids = rollout.response_ids[row].tolist()
        if rollout.truncated[row]:
            assert length == 6 and tokenizer.eos_token_id not in ids
        else:
            assert ids[length - 1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in ids[:length - 1]


def test_same_seed_same_samples_and_rng_state_round_trip(parts):
    path, tokenizer, prompts = parts
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
    a, b = make_engine(path, tokenizer, seed=5), make_engine(path, tokenizer, seed=5)
    assert torch.equal(a.generate(prompts, params).response_ids, b.generate(prompts, params).response_ids)
    state = a.rng_state()
    first = a.generate(prompts, params).response_ids
    a.set_rng_state(state)
    assert torch.equal(a.generate(prompts, params).response_ids, first)


def test_update_weights_changes_what_the_engine_generates(parts):
    path, tokenizer, prompts = parts
    engine = make_engine(path, tokenizer)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    before = engine.generate(prompts, greedy)
    learner = load_causal_lm(path, "float32", "cpu")
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn(p.shape, generator=noise) * 0.5)
    sent = push_weights(learner, engine)
    after = engine.generate(prompts, greedy)
    expected = response_logprobs(learner, after.prompt_ids, after.prompt_mask, after.response_ids, after.response_mask)
    # The engine now runs the learner's weights. The perturbed model has large logits, and the engine's
    # cached decode sums in another order than the learner's full pass: float error up to ~1e-4 was seen;
    # an engine still on the old weights is off by more than 1.
    assert (expected - after.logprobs).abs().max() < 1e-3
    assert not torch.equal(before.logprobs, after.logprobs)
    assert sent == sum(p.numel() * 4 for p in learner.parameters())
    with pytest.raises(KeyError, match="no weight named"):
        engine.update_weights([("not.a.weight", torch.zeros(1))])


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(_top_p_filter(probs, 0.7), torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert torch.allclose(_top_p_filter(probs, 0.5), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))


def test_inverse_cdf_draws_each_index_with_its_probability_and_never_a_zero_one():
    weights = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 4.0], [1.0, 1.0, 0.0, 2.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([_inverse_cdf_sample(weights, generator) for _ in range(20_000)])   # [draws, rows]
    for row in range(3):
        frequency = torch.bincount(draws[:, row], minlength=5).double() / len(draws)
        expected = weights[row].double() / weights[row].sum()
        assert (frequency - expected).abs().max() < 0.015  # about 4 standard errors at 20k draws
        assert (frequency[expected == 0] == 0).all()


def test_sampling_at_a_temperature_draws_from_the_tempered_distribution(parts):
    path, tokenizer, prompts = parts
    engine = make_engine(path, tokenizer)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20_000, 1)
    tokens, logprobs = engine._sample(logits, SamplingParams(n=1, temperature=0.5, max_new_tokens=1))
    tempered = torch.log_softmax(logits[0] / 0.5, -1)
    assert (torch.bincount(tokens, minlength=4) / len(tokens) - tempered.exp()).abs().max() < 0.015
    assert torch.allclose(logprobs, tempered[tokens])


def test_an_engine_sharing_the_learner_weights_samples_from_them_without_a_copy(parts):
    path, tokenizer, prompts = parts
    learner = load_causal_lm(path, "float32", "cpu")
    engine, copy = make_engine(path, tokenizer), make_engine(path, tokenizer)
    engine.share_weights(learner)
    embedding = engine.model.get_input_embeddings().weight
    assert embedding.data_ptr() == learner.get_input_embeddings().weight.data_ptr()
    assert engine.model.get_output_embeddings().weight is embedding  # tied weights stay tied
    assert not embedding.requires_grad and all(p.requires_grad for p in learner.parameters())
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    assert torch.equal(engine.generate(prompts, greedy).response_ids, copy.generate(prompts, greedy).response_ids)
    with torch.no_grad():  # an optimizer step, in place: the shared engine has it with no push
        for p in learner.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    assert engine.shares_learner_weights and not copy.shares_learner_weights  # a learner pushes it nothing
    push_weights(learner, copy)
    push_weights(learner, engine)  # were it pushed, it copies nothing and breaks nothing
    after = engine.generate(prompts, greedy)
    assert torch.equal(after.response_ids, copy.generate(prompts, greedy).response_ids)
    expected = response_logprobs(learner, after.prompt_ids, after.prompt_mask, after.response_ids, after.response_mask)
    assert (expected - after.logprobs).abs().max() < 1e-3
    with pytest.raises(ValueError, match="takes no other"):  # a copy would overwrite the learner's weights
        engine.update_weights([(name, p.detach().clone()) for name, p in learner.named_parameters()])
    with pytest.raises(ValueError, match="cannot share weight"):
        make_engine(path, tokenizer).share_weights(load_causal_lm(path, "float32", "cpu").double())


def test_non_finite_logits_stop_sampling_with_a_clear_error(parts):
    path, tokenizer, _ = parts
    engine = make_engine(path, tokenizer)
    logits = torch.zeros(3, 5)
    logits[1, 2] = float("nan")
    with pytest.raises(ValueError, match="logits are not finite"):
        engine._sample(logits, SamplingParams(n=1, temperature=1.0, max_new_tokens=1))


def test_a_group_shares_one_prompt_prefill_and_samples_as_if_each_had_its_own(parts):
    path, tokenizer, prompts = parts
    engine = HFEngine(load_causal_lm(path, "float32", "cpu").double(), tokenizer.pad_token_id,
                      [tokenizer.eos_token_id], seed=0)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    shared = engine.generate(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=6))  # 4 prefills
    alone = engine.generate([p for p in prompts for _ in range(3)], greedy)                  # 12 prefills
    assert torch.equal(shared.response_ids, alone.response_ids)
    assert torch.equal(shared.logprobs, alone.logprobs)  # float64: the same function, exactly
