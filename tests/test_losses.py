"""The policy loss against ALGORITHMS.md: hand-computed cases, and a loop-by-loop float64 reference
written here with plain Python floats (nothing shared with the vectorised code)."""

import math

import pytest
import torch

from rlft.algos.losses import (KL_ESTIMATORS, LOSS_AGGS, RATIO_LEVELS, aggregate, clipped_surrogate, kl_penalty,
                               policy_loss)


def reference_loss(logp, old, adv, mask, *, ratio_level, eps_low, eps_high, clip_ratio_c, loss_agg,
                   max_response_len, ref=None, kl_coef=0.0, kl_estimator="k3", rollout=None, tis_cap=None):
    logp, old, mask = logp.tolist(), old.tolist(), mask.tolist()
    ref = ref.tolist() if ref is not None else None
    rollout = rollout.tolist() if rollout is not None else None
    adv = adv.tolist()
    seq_losses, token_sum, token_count, sequences = [], 0.0, 0, 0
    for i in range(len(logp)):
        idx = [t for t in range(len(logp[i])) if mask[i][t]]
        if not idx:
            continue
        sequences += 1
        seq_log_ratio = sum(logp[i][t] - old[i][t] for t in idx) / len(idx)
        losses = []
        for t in idx:
            r = math.exp(logp[i][t] - old[i][t]) if ratio_level == "token" else math.exp(seq_log_ratio)
            a = adv[i]
            clipped_r = min(max(r, 1 - eps_low), 1 + eps_high)
            loss = -min(r * a, clipped_r * a)
            if clip_ratio_c is not None and a < 0:
                loss = min(loss, -clip_ratio_c * a)
            if tis_cap is not None:
                loss *= min(math.exp(old[i][t] - rollout[i][t]), tis_cap)
            if ref is not None and kl_coef:
                x = ref[i][t] - logp[i][t]
                kl = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - x - 1}[kl_estimator]
                loss += kl_coef * kl
            losses.append(loss)
        seq_losses.append(sum(losses) / len(losses))
        token_sum += sum(losses)
        token_count += len(losses)
    if loss_agg == "token_mean":
        return token_sum / token_count
    if loss_agg in ("seq_mean_token_mean", "seq_mean"):
        return sum(seq_losses) / sequences
    return token_sum / (sequences * max_response_len)


def random_batch(seed, n=6, t=5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=dtype) * 3
    logp = old + torch.randn(n, t, generator=gen, dtype=dtype) * 0.3   # ratios both inside and outside the clip
    ref = old + torch.randn(n, t, generator=gen, dtype=dtype) * 0.2
    rollout = old + torch.randn(n, t, generator=gen, dtype=dtype) * 0.5
    adv = torch.randn(n, generator=gen, dtype=dtype)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(dtype)
    return logp, old, adv, mask, ref, rollout


def counts(mask, max_len):
    return dict(num_sequences=int((mask.sum(-1) > 0).sum()), num_tokens=int(mask.sum()), max_response_len=max_len)


SETTINGS = [
    dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="seq_mean_token_mean",
         kl_coef=0.04, kl_estimator="k3"),                                                      # GRPO
    dict(ratio_level="token", eps_low=0.2, eps_high=0.28, clip_ratio_c=None, loss_agg="token_mean"),    # DAPO
    dict(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4, clip_ratio_c=None, loss_agg="seq_mean"),  # GSPO
    dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="seq_mean_token_sum_norm",
         kl_coef=0.1, kl_estimator="k1"),                                                       # Dr. GRPO + k1
    dict(ratio_level="token", eps_low=0.1, eps_high=0.1, clip_ratio_c=3.0, loss_agg="token_mean",
         kl_coef=0.2, kl_estimator="k2", tis_cap=2.0),                                           # dual clip, k2, TIS
    dict(ratio_level="sequence", eps_low=0.05, eps_high=0.05, clip_ratio_c=1.5, loss_agg="seq_mean_token_mean"),
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_loop_reference(settings, seed):
    logp, old, adv, mask, ref, rollout = random_batch(seed)
    loss, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, rollout_logp=rollout, **counts(mask, 5), **settings)
    expected = reference_loss(logp, old, adv, mask, ref=ref, rollout=rollout, max_response_len=5, **settings)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_grpo_hand_computed():
    # One response of two tokens, A = 1; ratios 1.1 (inside) and 1.5 (clipped at 1.2).
    logp = torch.log(torch.tensor([[1.1, 1.5]]))
    old = torch.zeros(1, 2)
    loss, metrics = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), ratio_level="token",
                                eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="seq_mean_token_mean",
                                num_sequences=1, num_tokens=2, max_response_len=2)
    assert loss.item() == pytest.approx(-(1.1 + 1.2) / 2, abs=1e-6)
    assert metrics["clip_frac_high"] == 0.5 and metrics["clip_frac_low"] == 0.0
    assert metrics["ratio_max"] == pytest.approx(1.5, abs=1e-6)


def test_clip_at_low_and_high_bound():
    ratio = torch.tensor([0.5, 0.5, 1.5, 1.5])
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0])
    loss, low, high = clipped_surrogate(ratio, adv, eps_low=0.2, eps_high=0.28)
    # A<0, r below 1-eps: clipped at 0.8 -> loss 0.8; A>0, r low: unclipped -0.5;
    # A>0, r above 1+eps: clipped at 1.28 -> -1.28; A<0, r high: unclipped 1.5.
    assert torch.allclose(loss, torch.tensor([0.8, -0.5, -1.28, 1.5]))
    assert low.tolist() == [True, False, False, False]
    assert high.tolist() == [False, False, True, False]


def test_dual_clip_caps_negative_advantage_loss():
    ratio = torch.tensor([5.0, 5.0])
    adv = torch.tensor([-1.0, 1.0])
    loss, _, _ = clipped_surrogate(ratio, adv, eps_low=0.2, eps_high=0.2, clip_ratio_c=3.0)
    # A<0: PPO loss would be 5 (r * -A); dual clip caps it at c * -A = 3. A>0 is untouched (-1.2).
    assert torch.allclose(loss, torch.tensor([3.0, -1.2]))


def test_sequence_ratio_is_length_normalised():
    # Log-ratios 0.3 and 0.1 over two tokens: s = exp(mean) = exp(0.2), not exp(0.4).
    logp = torch.tensor([[0.3, 0.1, 0.0]])
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, metrics = policy_loss(logp, old, torch.tensor([1.0]), mask, ratio_level="sequence", eps_low=1.0,
                             eps_high=1.0, clip_ratio_c=None, loss_agg="seq_mean", **counts(mask, 3))
    assert metrics["ratio_mean"] == pytest.approx(math.exp(0.2), abs=1e-6)


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    x = -0.5  # ref - logp
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(x) - x - 1)


def test_gspo_token_value_and_gradient_equal_gspo():
    logp0, old, adv, mask, _, _ = random_batch(3)
    settings = dict(eps_low=0.05, eps_high=0.05, clip_ratio_c=None, loss_agg="seq_mean", **counts(mask, 5))
    grads, values = [], []
    for level in ("sequence", "sequence_token"):
        logp = logp0.clone().requires_grad_(True)
        loss, metrics = policy_loss(logp, old, adv, mask, ratio_level=level, **settings)
        loss.backward()
        grads.append(logp.grad)
        values.append((loss.item(), metrics["ratio_mean"]))
    assert values[0] == pytest.approx(values[1], abs=1e-9)
    assert torch.allclose(grads[0], grads[1], atol=1e-9)
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("loss_agg", LOSS_AGGS.names())
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_gradient_accumulation_gives_the_same_gradient(loss_agg, ratio_level):
    logp0, old, adv, mask, ref, _ = random_batch(4, n=8, t=6)
    settings = dict(ratio_level=ratio_level, eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg=loss_agg,
                    ref_logp=None, kl_coef=0.0, **counts(mask, 6))
    full = logp0.clone().requires_grad_(True)
    full_loss, _ = policy_loss(full, old, adv, mask, **settings)
    full_loss.backward()
    split = logp0.clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)):
        loss, _ = policy_loss(split[rows], old[rows], adv[rows], mask[rows], **settings)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), abs=1e-12)  # the micro-batches' shares add up to the loss
    assert torch.allclose(full.grad, split.grad, atol=1e-12)
    assert full.grad.abs().sum() > 0


def test_on_policy_ratio_is_one_and_gradient_is_the_policy_gradient():
    # With old = sg[logp], seq_mean_token_mean's gradient is -(1/G) sum_i A_i / |o_i| per token.
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, metrics = policy_loss(logp, logp.detach(), adv, mask, ratio_level="token", eps_low=0.2, eps_high=0.2,
                                clip_ratio_c=None, loss_agg="seq_mean_token_mean", **counts(mask, 2))
    loss.backward()
    assert metrics["ratio_mean"] == 1.0 and metrics["clip_frac_low"] == 0.0
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25], [1.0, 0.0]]))


def test_the_config_offers_exactly_the_registered_names():
    from rlft.algos.advantages import ADVANTAGES
    from rlft.config.algo import KLEstimator, LossAgg, RatioLevel, ScaleRewards
    for enum, registry in ((RatioLevel, RATIO_LEVELS), (LossAgg, LOSS_AGGS), (KLEstimator, KL_ESTIMATORS),
                           (ScaleRewards, ADVANTAGES)):
        assert list(enum.__members__) == registry.names()
    assert LOSS_AGGS.names() == ["token_mean", "seq_mean_token_mean", "seq_mean", "seq_mean_token_sum_norm"]


def test_a_registry_refuses_a_name_twice_and_a_new_entry_is_usable_at_once():
    from rlft.registry import Registry
    with pytest.raises(ValueError, match="loss aggregation 'token_mean' is already registered"):
        LOSS_AGGS.register("token_mean")(lambda *args, **kwargs: None)
    registry = Registry("test")

    @registry.register("sum", per_sequence=False)
    def total(per_token, mask, num_sequences, num_tokens, max_response_len):
        return (per_token * mask).sum()

    assert registry["sum"] is total and total.per_sequence is False and "sum" in registry
    assert list(registry.choices("Choice", __name__).__members__) == ["sum"]
    with pytest.raises(Exception, match="unknown test 'nope' \\(available: sum\\)"):
        registry["nope"]


def test_every_registered_aggregation_and_estimator_matches_the_reference():
    """The registries hold what the loop-by-loop reference above computes, name by name."""
    logp, old, adv, mask, ref, _ = random_batch(5)
    for agg in LOSS_AGGS.names():
        settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg=agg)
        loss, _ = policy_loss(logp, old, adv, mask, **counts(mask, 5), **settings)
        assert loss.item() == pytest.approx(reference_loss(logp, old, adv, mask, max_response_len=5, **settings),
                                            abs=1e-9)
        assert aggregate(torch.ones_like(mask), mask, agg, **counts(mask, 5)).item() > 0
    for estimator in KL_ESTIMATORS.names():
        settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                        kl_coef=0.3, kl_estimator=estimator)
        loss, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, **counts(mask, 5), **settings)
        assert loss.item() == pytest.approx(reference_loss(logp, old, adv, mask, ref=ref, max_response_len=5,
                                                           **settings), abs=1e-9)
