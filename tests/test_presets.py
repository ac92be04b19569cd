"""The algorithms are presets of one loss: DAPO with its parts off is GRPO without KL, and GSPO at
token level is the GRPO surrogate (ALGORITHMS.md, last paragraph)."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import ROOT
from rlft.algos.losses import policy_loss
from rlft.config import register_schemas
from rlft.trainer import loss_settings


def algo(name, *overrides):
    register_schemas()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"algo={name}", *[f"algo.{o}" for o in overrides]])
    return OmegaConf.to_object(cfg).algo


def loss_of(algo_cfg, seed=0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(8, 6, generator=gen, dtype=torch.float64) * 2
    logp = (old + torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.4).requires_grad_(True)
    ref = old + torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.randn(8, generator=gen, dtype=torch.float64)
    rollout = old + torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.1
    mask = (torch.arange(6)[None] < torch.randint(1, 7, (8, 1), generator=gen)).double()
    loss, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, rollout_logp=rollout, num_sequences=8, num_tokens=int(mask.sum()),
                          max_response_len=6, **loss_settings(algo_cfg, step=1))
    loss.backward()
    return loss.item(), logp.grad


def test_presets_have_the_specified_defaults():
    grpo, dapo, gspo = algo("grpo"), algo("dapo"), algo("gspo")
    assert (grpo.eps_low, grpo.eps_high, grpo.kl_coef, grpo.loss_agg) == (0.2, 0.2, 0.04, "seq_mean_token_mean")
    assert (dapo.eps_high, dapo.kl_coef, dapo.loss_agg, dapo.dynamic_sampling, dapo.overlong.enabled) == \
        (0.28, 0.0, "token_mean", True, True)
    assert (gspo.ratio_level, gspo.eps_low, gspo.eps_high, gspo.loss_agg) == ("sequence", 3e-4, 4e-4, "seq_mean")


def test_dapo_with_every_part_off_is_grpo_without_kl():
    dapo_off = algo("dapo", "eps_high=0.2", "loss_agg=seq_mean_token_mean", "dynamic_sampling=false",
                    "overlong.enabled=false")
    grpo_no_kl = algo("grpo", "kl_coef=0")
    a, b = loss_of(dapo_off), loss_of(grpo_no_kl)
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    assert loss_of(algo("dapo"))[0] != a[0]  # and the DAPO parts do change it


def test_gspo_at_token_level_is_the_grpo_surrogate():
    gspo_token = algo("gspo", "ratio_level=token", "eps_low=0.2", "eps_high=0.2")
    grpo_no_kl = algo("grpo", "kl_coef=0")
    a, b = loss_of(gspo_token), loss_of(grpo_no_kl)
    assert a[0] == pytest.approx(b[0], abs=1e-12) and torch.allclose(a[1], b[1], atol=1e-12)


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo"])
@pytest.mark.parametrize("override", ["ratio_level=sequence", "ratio_level=sequence_token", "clip_ratio_c=3.0",
                                      "loss_agg=seq_mean_token_sum_norm", "kl_coef=0.1", "kl_estimator=k2",
                                      "scale_rewards=none", "tis_cap=2.0", "dynamic_sampling=true"])
def test_every_key_works_with_every_algorithm(name, override):
    loss, grad = loss_of(algo(name, override))
    assert torch.isfinite(torch.tensor(loss)) and grad.abs().sum() > 0
