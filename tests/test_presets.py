"""The algorithms are presets of one loss: DAPO with its parts off is GRPO without KL, and GSPO at
token level is the GRPO surrogate (ALGORITHMS.md, last paragraph)."""

from dataclasses import asdict

import pytest
import torch

from rlft.algos.advantages import group_advantages
from rlft.algos.losses import policy_loss
from rlft.algos.settings import loss_settings
from rlft.config.compose import compose, to_run_config


def algo(name, *overrides):
    dcfg, choices = compose([f"algo={name}", *[f"algo.{o}" for o in overrides]])
    return to_run_config(dcfg, choices).algo


def loss_of(algo_cfg, seed=0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(8, 6, generator=gen, dtype=torch.float64) * 2
    logp = (old + torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.6).requires_grad_(True)
    ref = old + torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.randn(8, generator=gen, dtype=torch.float64)
    rollout = old + torch.randn(8, 6, generator=gen, dtype=torch.float64) * 0.1
    mask = (torch.arange(6)[None] < torch.randint(1, 7, (8, 1), generator=gen)).double()
    loss, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, rollout_logp=rollout, num_sequences=8,
                          num_tokens=int(mask.sum()), **asdict(loss_settings(algo_cfg, step=1, max_response_len=6)))
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


# Each loss key, set on top of each preset, against the same preset with the key at another value: the
# key is an input of the loss, so the loss must change. (Where a key only acts with another one, both
# sides set that one: the KL estimator needs a KL term.)
LOSS_KEYS = {
    "ratio_level=sequence": "ratio_level=token",
    "ratio_level=sequence_token": "ratio_level=token",
    "clip_ratio_c=1.5": "ratio_level=token",          # dual clip: the ratios of some negative advantages > 1.5
    "eps_high=0.5": "eps_high=0.05",
    "eps_low=0.5": "eps_low=0.05",
    "loss_agg=seq_mean_token_sum_norm": "loss_agg=token_mean",
    "kl_coef=0.1": "kl_coef=0",
    "kl_estimator=k2": "kl_estimator=k3",
    "kl_in_reward=true": "kl_in_reward=false",
    "tis_cap=2.0": "tis_cap=null",
    "objective=cispo": "objective=ppo_clip",
    "objective=sapo": "objective=ppo_clip",
    "correction.kind=icepop": "correction=null",
    "correction.kind=seq_tis": "correction=null",
}
NEEDS = {"clip_ratio_c=1.5": ["ratio_level=token"], "kl_estimator=k2": ["kl_coef=0.1"],
         "kl_estimator=k3": ["kl_coef=0.1"], "kl_in_reward=true": ["kl_coef=0.1"],
         "kl_in_reward=false": ["kl_coef=0.1"],
         "eps_high=0.5": ["ratio_level=token"], "eps_high=0.05": ["ratio_level=token"],
         "eps_low=0.5": ["ratio_level=token"], "eps_low=0.05": ["ratio_level=token"]}


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo"])
@pytest.mark.parametrize("override", sorted(LOSS_KEYS))
def test_every_loss_key_changes_the_loss_of_every_algorithm(name, override):
    other = LOSS_KEYS[override]
    loss, grad = loss_of(algo(name, *NEEDS.get(override, []), override))
    other_loss, other_grad = loss_of(algo(name, *NEEDS.get(other, []), other))
    assert torch.isfinite(torch.tensor(loss)) and grad.abs().sum() > 0
    assert loss != pytest.approx(other_loss, abs=1e-9) or not torch.allclose(grad, other_grad), (loss, other_loss)


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo"])
def test_scale_rewards_changes_the_advantages_of_every_algorithm(name):
    """Not a loss input: the advantage estimator, before the loss."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    by_group = group_advantages(rewards, 4, algo(name).scale_rewards)
    by_batch = group_advantages(rewards, 4, algo(name, "scale_rewards=batch").scale_rewards)
    centred = group_advantages(rewards, 4, algo(name, "scale_rewards=none").scale_rewards)
    assert not torch.allclose(by_group, by_batch) and not torch.allclose(by_group, centred)
    assert torch.allclose(centred, torch.tensor([-0.75, 0.25, 0.25, 0.25, -0.25, -0.25, -0.25, 0.75]))
