import torch

from rlft.algos.advantages import group_advantages
from rlft.learner.policy import Policy
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlft.rollout.hf_engine import HFEngine
from rlft.types import LossSettings, Rollout, SamplingParams, TrainBatch

SETTINGS = LossSettings(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                        max_response_len=6)


def batch_and_path(model: str = "builtin:tiny-adder"):
    path = resolve_model_path(model)
    tok = load_tokenizer(path)
    engine = HFEngine(load_causal_lm(path, "float32", "cpu"), tok.pad_token_id, [tok.eos_token_id], seed=1)
    rollout = engine.generate([tok.encode(p) for p in ["57+65=", "12+34=", "38+47=", "90+19="]],
                              SamplingParams(n=4, temperature=1.0, max_new_tokens=6))
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(0))
    return path, TrainBatch(rollout, advantages=group_advantages(rewards, 4), loss_mask=rollout.response_mask)


def learner(path, **kwargs):
    return Policy(load_causal_lm(path, "float32", "cpu"), max_grad_norm=1e9, **kwargs)


def test_micro_batches_give_the_same_update_as_one_batch():
    path, batch = batch_and_path()
    # Adam's eps well above float error: its first step is lr * g / (|g| + eps), which for eps = 1e-8 turns a
    # summation-order difference in a near-zero gradient into a visible weight difference
    whole, split = learner(path, micro_batch_size=16, eps=1e-3), learner(path, micro_batch_size=4, eps=1e-3)
    m_whole, m_split = whole.update(batch, SETTINGS, lr=1e-3), split.update(batch, SETTINGS, lr=1e-3)
    assert abs(m_whole.loss - m_split.loss) < 1e-6
    assert abs(m_whole.grad_norm - m_split.grad_norm) < 1e-5
    start = dict(load_causal_lm(path, "float32", "cpu").named_parameters())
    for (name, a), (_, b) in zip(whole.model.named_parameters(), split.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert any(not torch.equal(p, start[n]) for n, p in whole.model.named_parameters())


def test_first_epoch_is_on_policy_and_later_epochs_are_not():
    path, batch = batch_and_path()
    one = learner(path).update(batch, SETTINGS, lr=1e-3)
    assert one.ratio_min == one.ratio_max == 1.0 and one.approx_kl == 0.0
    assert one.logprob_diff_mean < 1e-5  # the first pass reproduces the engine's log-probs
    three = learner(path, ppo_epochs=3, micro_batch_size=8).update(batch, SETTINGS, lr=1e-3)
    assert three.ratio_max > 1.0 > three.ratio_min and three.approx_kl > 0


def test_a_zero_loss_mask_trains_nothing():
    path, batch = batch_and_path()
    batch.loss_mask = torch.zeros_like(batch.loss_mask)
    model = learner(path)
    model.update(batch, SETTINGS, lr=1e-3)
    start = dict(load_causal_lm(path, "float32", "cpu").named_parameters())
    assert all(torch.equal(p, start[n]) for n, p in model.model.named_parameters())


def test_mixed_precision_keeps_float32_weights_so_updates_below_bfloat16_resolution_count():
    path, batch = batch_and_path()
    name = "model.layers.0.mlp.up_proj.weight"
    start = dict(load_causal_lm(path, "float32", "cpu").named_parameters())[name].detach()
    mixed = Policy(load_causal_lm(path, "float32", "cpu"), max_grad_norm=1e9, compute_dtype=torch.bfloat16)
    pure = Policy(load_causal_lm(path, "bfloat16", "cpu"), max_grad_norm=1e9)
    m_mixed, m_pure = mixed.update(batch, SETTINGS, lr=1e-5), pure.update(batch, SETTINGS, lr=1e-5)

    def changed(learner):
        weight = dict(learner.model.named_parameters())[name].detach()
        return (weight.float() != start.to(weight.dtype).float()).float().mean().item(), weight.dtype

    share_mixed, dtype_mixed = changed(mixed)
    share_pure, _ = changed(pure)
    # AdamW's first step moves every weight by ~lr = 1e-5, far below bfloat16's spacing at these magnitudes
    assert dtype_mixed == torch.float32 and share_mixed > 0.95, share_mixed
    assert share_pure < 0.2, share_pure
    # the passes did run in bfloat16: their log-probs differ from the float32 engine's by its rounding
    assert m_mixed.logprob_diff_mean > 1e-4 > learner(path).update(batch, SETTINGS, lr=1e-5).logprob_diff_mean


def test_reference_log_probs_in_micro_batches_equal_one_pass():
    from rlft.config.compose import compose, to_run_config
    from rlft.learner.local import LocalLearner
    path, batch = batch_and_path()

    def reference(micro_batch_size):
        dcfg, choices = compose(["algo.kl_coef=0.04", f"compute.micro_batch_size={micro_batch_size}"])
        return LocalLearner(to_run_config(dcfg, choices), path).reference_logprobs(batch.rollout)

    whole, chunked = reference("null"), reference(3)  # 16 rows: passes of 3, 3, 3, 3, 3, 1
    assert chunked.shape == whole.shape == batch.rollout.response_ids.shape
    assert torch.allclose(chunked, whole, atol=1e-5) and whole.abs().sum() > 0


def test_packed_passes_give_the_same_update_as_padded_ones():
    from test_logprobs import uneven_batch
    from rlft.learner.logprobs import model_packing, response_logprobs
    path = resolve_model_path("builtin:tiny-adder")
    prompt_ids, prompt_mask, response_ids, response_mask = uneven_batch(6)
    with torch.no_grad():
        rollout_logp = response_logprobs(load_causal_lm(path, "float32", "cpu"), prompt_ids, prompt_mask,
                                         response_ids, response_mask)
    rollout = Rollout(prompt_ids, prompt_mask, response_ids, response_mask, rollout_logp,
                      truncated=torch.zeros(8, dtype=torch.bool))
    batch = TrainBatch(rollout, advantages=torch.linspace(-1, 1, 8), loss_mask=response_mask)
    runs = {}
    for padding_free in (False, True):
        model = learner(path, ppo_epochs=3, micro_batch_size=4, padding_free=padding_free)
        metrics = model.update(batch, SETTINGS, lr=1e-2)
        runs[padding_free] = metrics, dict(model.model.named_parameters())
    assert model_packing(model.model, prompt_mask[:4], response_mask[:4]) is not None  # it packed
    (padded, padded_weights), (packed, packed_weights) = runs[False], runs[True]
    assert packed.ratio_max > 1.0  # epochs 2-3 are off-policy: the log-probs of moved weights count
    for key in ("loss", "ratio_max", "ratio_min", "entropy", "grad_norm"):
        ours, theirs = getattr(packed, key), getattr(padded, key)
        assert abs(ours - theirs) <= 1e-5 * max(1.0, abs(theirs)), key
    # The keys' bias gets no gradient in exact arithmetic (softmax ignores a shift shared by every key), so
    # AdamW turns its round-off into whole steps of either sign: a packed and a padded pass round
    # differently, and those updates are noise. Every other weight must move the same way.
    start = dict(load_causal_lm(path, "float32", "cpu").named_parameters())
    compared = 0
    for name, weight in padded_weights.items():
        if name.endswith("k_proj.bias"):
            continue
        update, packed_update = weight - start[name], packed_weights[name] - start[name]
        assert (packed_update - update).norm() <= 1e-2 * update.norm(), name
        compared += 1
    assert compared == len(padded_weights) - 4  # one key bias per layer
