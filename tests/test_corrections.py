"""The rollout corrections (engine vs learner old log-probs) against docs/objectives.md: each registered
correction's weights against a loop-by-loop float64 reference written here, the corrected loss's value and
gradient against autograd through that reference, the mismatch metrics, and the config that picks them."""

import math
from dataclasses import asdict

import pytest
import test_config  # its check that a config mistake is one line before any work
import torch

from conftest import TINY_RUN, read_metrics
from rlft.algos.corrections import CORRECTIONS, apply_correction, engine_mismatch
from rlft.algos.losses import policy_loss
from rlft.algos.settings import loss_settings
from rlft.config import validate
from rlft.config.compose import compose, to_run_config
from rlft.errors import ConfigError


def reference_weights(kind, old, engine, mask, *, low=0.5, high=2.0, cap=2.0):
    """({(i, t): weight} over the masked tokens, the share of tokens or sequences the correction changed)."""
    weights, changed, counted = {}, 0, 0
    for i in range(len(old)):
        tokens = [t for t in range(len(old[i])) if mask[i][t]]
        if not tokens:
            continue
        rhos = {t: math.exp(old[i][t] - engine[i][t]) for t in tokens}
        if kind in ("token_tis", "token_mask", "icepop"):
            for t in tokens:
                inside = low <= rhos[t] <= high
                if kind == "token_tis":
                    weights[i, t], hit = min(rhos[t], cap), rhos[t] > cap
                elif kind == "token_mask":
                    weights[i, t], hit = (1.0 if inside else 0.0), not inside
                else:
                    weights[i, t], hit = (rhos[t] if inside else 0.0), not inside
                changed += hit
                counted += 1
            continue
        product = 1.0
        for t in tokens:
            product *= rhos[t]
        if kind == "seq_tis":
            weight, hit = min(product, cap), product > cap
        else:
            value = product if kind == "seq_mask" else product ** (1 / len(tokens))
            hit = not (low <= value <= high)
            weight = 0.0 if hit else 1.0
        for t in tokens:
            weights[i, t] = weight
        changed += hit
        counted += 1
    return weights, changed / counted


def reference_loss(logp, old, engine, adv, mask, weights, *, eps_low, eps_high, ref=None, kl_coef=0.0):
    """token_mean of PPO-clip's per-token loss times the correction's weight, plus the (unweighted) k3 KL."""
    total, count = 0, 0
    for (i, t), w in weights.items():
        r = torch.exp(logp[i, t] - old[i, t])
        a = float(adv[i])
        loss = -torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a) * w
        if ref is not None:
            x = ref[i, t] - logp[i, t]
            loss = loss + kl_coef * (torch.exp(x) - x - 1)
        total = total + loss
        count += 1
    return total / count


def random_batch(seed, n=8, t=6, mismatch=0.6):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3
    engine = old + torch.randn(n, t, generator=gen, dtype=torch.float64) * mismatch  # both sides of every band
    ref = old + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    mask[-1] = 0
    return logp, old, engine, ref, adv, mask


CASES = [
    ("token_tis", dict(cap=2.0)), ("token_tis", dict(cap=1.1)),
    ("seq_tis", dict(cap=2.0)), ("seq_tis", dict(cap=0.7)),
    ("token_mask", dict(low=0.5, high=2.0)), ("token_mask", dict(low=0.8, high=1.25)),
    ("seq_mask", dict(low=0.5, high=2.0)), ("seq_mask", dict(low=0.0, high=1.5)),
    ("icepop", dict(low=0.5, high=5.0)), ("icepop", dict(low=0.8, high=1.2)),
    ("geo_mask", dict(low=0.8, high=1.25)), ("geo_mask", dict(low=0.95, high=1.05)),
]


@pytest.mark.parametrize("kind,band", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correction_weights_match_the_reference(kind, band, seed):
    _, old, engine, _, _, mask = random_batch(seed)
    keys = dict(low=0.5, high=2.0, cap=2.0) | band
    weight, metrics = apply_correction(old, engine, mask, kind, **keys)
    expected, share = reference_weights(kind, old.tolist(), engine.tolist(), mask.tolist(), **keys)
    for (i, t), w in expected.items():
        assert weight[i, t].item() == pytest.approx(w, abs=1e-6), (i, t)
    assert not weight.requires_grad
    assert metrics == {f"offpolicy/{CORRECTIONS[kind].effect}_frac": pytest.approx(share, abs=1e-12)}


@pytest.mark.parametrize("kind,band", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_corrected_loss_value_and_gradient_match_the_reference(kind, band):
    logp0, old, engine, ref, adv, mask = random_batch(5)
    keys = dict(low=0.5, high=2.0, cap=2.0) | band
    logp = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, mask, ratio_level="token", eps_low=0.2, eps_high=0.28, clip_ratio_c=None,
                          loss_agg="token_mean", num_sequences=7, num_tokens=int(mask.sum()), max_response_len=6,
                          ref_logp=ref, kl_coef=0.1, rollout_logp=engine, correction=kind, correction_low=keys["low"],
                          correction_high=keys["high"], correction_cap=keys["cap"])
    loss.backward()
    weights, _ = reference_weights(kind, old.tolist(), engine.tolist(), mask.tolist(), **keys)
    ref_logp = logp0.clone().requires_grad_(True)
    expected = reference_loss(ref_logp, old, engine, adv, mask, weights, eps_low=0.2, eps_high=0.28, ref=ref,
                              kl_coef=0.1)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(logp.grad, ref_logp.grad, atol=1e-6, rtol=0)


def test_every_registered_correction_has_a_reference_case():
    assert {k for k, _ in CASES} == set(CORRECTIONS.names())


def test_the_batches_reach_both_sides_of_every_band():
    _, old, engine, _, _, mask = random_batch(0)
    rho = (old - engine).exp()[mask.bool()]
    assert (rho < 0.5).any() and (rho > 2.0).any()
    batches = [random_batch(seed) for seed in (0, 1, 2)]
    for kind, band in CASES:  # every case changes some tokens (or sequences) and leaves others
        keys = dict(low=0.5, high=2.0, cap=2.0) | band
        shares = [next(iter(apply_correction(old, engine, mask, kind, **keys)[1].values()))
                  for _, old, engine, _, _, mask in batches]
        assert any(0 < share < 1 for share in shares), (kind, band, shares)


@pytest.mark.parametrize("kind,band", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_gradient_accumulation_gives_the_same_gradient(kind, band):
    logp0, old, engine, _, adv, mask = random_batch(6, n=8, t=6)
    keys = dict(low=0.5, high=2.0, cap=2.0) | band
    settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="seq_mean_token_mean",
                    num_sequences=int((mask.sum(-1) > 0).sum()), num_tokens=int(mask.sum()), max_response_len=6,
                    correction=kind, correction_low=keys["low"], correction_high=keys["high"],
                    correction_cap=keys["cap"])
    full = logp0.clone().requires_grad_(True)
    policy_loss(full, old, adv, mask, rollout_logp=engine, **settings)[0].backward()
    split = logp0.clone().requires_grad_(True)
    for rows in (slice(0, 3), slice(3, 8)):
        policy_loss(split[rows], old[rows], adv[rows], mask[rows], rollout_logp=engine[rows], **settings)[0].backward()
    assert torch.allclose(full.grad, split.grad, atol=1e-12)


# ---- By hand ---------------------------------------------------------------------------------------------

def test_icepop_weights_inside_the_band_and_drops_both_sides():
    old = torch.zeros(1, 4, dtype=torch.float64)
    engine = -torch.log(torch.tensor([[0.4, 0.9, 3.0, 6.0]], dtype=torch.float64))  # rho = 0.4, 0.9, 3, 6
    weight, metrics = apply_correction(old, engine, torch.ones(1, 4), "icepop", low=0.5, high=5.0, cap=2.0)
    assert weight[0].tolist() == pytest.approx([0.0, 0.9, 3.0, 0.0])
    assert metrics == {"offpolicy/masked_frac": 0.5}
    weight, metrics = apply_correction(old, engine, torch.ones(1, 4), "token_mask", low=0.5, high=5.0, cap=2.0)
    assert weight[0].tolist() == [0.0, 1.0, 1.0, 0.0]


def test_sequence_masks_use_the_product_or_its_geometric_mean():
    # 20 tokens of ratio 1.05: the product 2.65 is outside [0.5, 2], its geometric mean 1.05 is inside.
    old = torch.full((1, 20), math.log(1.05), dtype=torch.float64)
    engine, mask = torch.zeros(1, 20, dtype=torch.float64), torch.ones(1, 20)
    assert apply_correction(old, engine, mask, "seq_mask", low=0.5, high=2.0, cap=2.0)[0].sum() == 0
    assert apply_correction(old, engine, mask, "geo_mask", low=0.5, high=2.0, cap=2.0)[0].sum() == 20
    weight, metrics = apply_correction(old, engine, mask, "seq_tis", low=0.5, high=2.0, cap=2.0)
    assert weight.unique().tolist() == [2.0] and metrics == {"offpolicy/capped_frac": 1.0}


def test_a_long_sequence_does_not_overflow():
    old, engine, mask = torch.full((1, 4000), 0.5), torch.zeros(1, 4000), torch.ones(1, 4000)  # product e^2000
    for kind in CORRECTIONS.names():
        weight, _ = apply_correction(old, engine, mask, kind, low=0.5, high=2.0, cap=2.0)
        assert torch.isfinite(weight).all(), kind


def test_tis_cap_is_the_shorthand_of_token_tis():
    logp, old, engine, _, adv, mask = random_batch(3)
    settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                    num_sequences=7, num_tokens=int(mask.sum()), max_response_len=6, rollout_logp=engine)
    a, _ = policy_loss(logp, old, adv, mask, tis_cap=1.5, **settings)
    b, _ = policy_loss(logp, old, adv, mask, correction="token_tis", correction_cap=1.5, **settings)
    assert a.item() == b.item()
    with pytest.raises(ValueError, match="tis_cap is the shorthand"):
        policy_loss(logp, old, adv, mask, tis_cap=1.5, correction="icepop", **settings)
    with pytest.raises(ValueError, match="needs the rollout engine's log-probs"):
        policy_loss(logp, old, adv, mask, **(settings | {"rollout_logp": None}), correction="seq_mask")


# ---- Metrics ---------------------------------------------------------------------------------------------

def test_engine_mismatch_metrics_match_the_reference():
    _, old, engine, _, _, mask = random_batch(2)
    metrics = engine_mismatch(old, engine, mask)
    pairs = [(o, e) for o_row, e_row, m_row in zip(old.tolist(), engine.tolist(), mask.tolist())
             for o, e, m in zip(o_row, e_row, m_row) if m]
    k3 = [math.exp(o - e) - 1 - (o - e) for o, e in pairs]
    assert metrics["offpolicy/engine_kl"] == pytest.approx(sum(k3) / len(k3), abs=1e-9)
    rho = torch.tensor([math.exp(o - e) for o, e in pairs], dtype=torch.float64)
    for name, p in (("p01", 0.01), ("p50", 0.5), ("p99", 0.99)):
        assert metrics[f"offpolicy/ratio_{name}"] == pytest.approx(torch.quantile(rho, p).item(), abs=1e-9)
    assert engine_mismatch(old, old, mask) == {"offpolicy/engine_kl": 0.0, "offpolicy/ratio_p01": 1.0,
                                               "offpolicy/ratio_p50": 1.0, "offpolicy/ratio_p99": 1.0}
    assert engine_mismatch(old, engine, torch.zeros_like(mask)) == {}


def test_policy_loss_reports_the_mismatch_whenever_it_has_the_engine_log_probs():
    logp, old, engine, _, adv, mask = random_batch(1)
    settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                    num_sequences=7, num_tokens=int(mask.sum()), max_response_len=6)
    _, metrics = policy_loss(logp, old, adv, mask, rollout_logp=engine, **settings)
    assert {"offpolicy/engine_kl", "offpolicy/ratio_p50"} <= set(metrics) and "offpolicy/masked_frac" not in metrics
    _, metrics = policy_loss(logp, old, adv, mask, rollout_logp=engine, correction="geo_mask", **settings)
    assert "offpolicy/masked_frac" in metrics
    _, metrics = policy_loss(logp, old, adv, mask, **settings)
    assert not any(key.startswith("offpolicy/") for key in metrics)


# ---- Config ----------------------------------------------------------------------------------------------

def algo(*overrides):
    dcfg, choices = compose([f"algo.{o}" for o in overrides])
    run = to_run_config(dcfg, choices)
    validate(run)
    return run.algo


def test_a_correction_key_turns_it_on_and_reaches_the_loss_settings():
    assert algo().correction is None and algo().rollout_correction is None
    assert loss_settings(algo(), 1, 4).correction is None
    s = loss_settings(algo("correction.kind=icepop", "correction.high=5"), 1, 4)
    assert (s.correction, s.correction_low, s.correction_high) == ("icepop", 0.5, 5.0)
    s = loss_settings(algo("tis_cap=3"), 1, 4)  # the shorthand
    assert (s.correction, s.correction_cap) == ("token_tis", 3.0)
    assert "tis_cap" not in asdict(s)


CONFIG_ERRORS = [
    (["tis_cap=2", "correction.kind=icepop"], "algo.tis_cap is the shorthand of algo.correction.kind=token_tis"),
    (["correction.low=1.5"], "algo.correction.low must be in [0, 1] (got 1.5)"),
    (["correction.low=-0.1"], "algo.correction.low must be in [0, 1] (got -0.1)"),
    (["correction.high=0.5"], "algo.correction.high must be >= 1 (got 0.5)"),
    (["correction.cap=0"], "algo.correction.cap must be a finite number > 0 (got 0"),
    (["correction.cap=inf"], "algo.correction.cap must be a finite number > 0 (got inf)"),
]


@pytest.mark.parametrize("overrides,message", CONFIG_ERRORS, ids=[" ".join(o) for o, _ in CONFIG_ERRORS])
def test_correction_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        algo(*overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bad_correction_kind_is_one_error_line(rlft_here, tmp_path):
    test_config.test_config_errors_are_one_line_before_any_work(
        rlft_here, tmp_path, ["algo.correction.kind=tis"],
        "algo.correction.kind='tis' is not one of: token_tis, seq_tis, token_mask, seq_mask, icepop, geo_mask")


def test_a_run_logs_the_correction_metrics_every_step(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=2", "trainer.eval_every=2",
         "trainer.save_every=2", "algo=cispo", "algo.correction.kind=icepop", "algo.correction.high=5")
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval" and "train/loss" in r]
    assert len(rows) == 2
    for row in rows:
        assert {"offpolicy/engine_kl", "offpolicy/ratio_p01", "offpolicy/ratio_p50", "offpolicy/ratio_p99",
                "offpolicy/masked_frac"} <= set(row)
        # on-policy, same weights: the engine and the learner agree to round-off
        assert row["offpolicy/engine_kl"] < 1e-6 and row["offpolicy/masked_frac"] == 0.0
