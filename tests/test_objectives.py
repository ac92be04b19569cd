"""The objectives beside PPO-clip (CISPO, GMPO, SAPO, KL-Cov, Clip-Cov) and the advantage estimators RLOO and
REINFORCE++ against docs/objectives.md: loop-by-loop float64 references written here, token by token with
0-d tensors (nothing shared with the vectorised code), their values to 1e-6 and their gradients (autograd
through the reference) against the implementation's; the presets compose and run their objective."""

import math
from dataclasses import asdict

import pytest
import test_config  # its check that a config mistake is one line before any work
import torch

from rlft.algos.advantages import ADVANTAGES, group_advantages
from rlft.algos.losses import OBJECTIVES, policy_loss
from rlft.algos.settings import loss_settings
from rlft.config import validate
from rlft.config.compose import compose, to_run_config
from rlft.errors import ConfigError

# ---- References --------------------------------------------------------------------------------------


def reference_token_losses(objective, logp, old, adv, mask, *, ratio_level="token", eps_low=0.2, eps_high=0.2,
                           clip_ratio_c=None, tau_pos=1.0, tau_neg=1.05, kl_cov_frac=0.1, kl_cov_coef=1.0,
                           clip_cov_frac=0.2, clip_cov_low=1.0, clip_cov_high=5.0):
    """{(i, t): loss of token t of response i} for the masked tokens, as 0-d tensors of logp's graph.
    clip_cov draws its tokens from torch's global generator: seed it as for the implementation."""
    n, t_max = logp.shape
    tokens = {i: [t for t in range(t_max) if mask[i, t] > 0] for i in range(n)}
    out = {}
    if objective in ("kl_cov", "clip_cov"):
        # the covariance of (detached) logp and A over every masked token of the batch
        flat = [(i, t) for i in range(n) for t in tokens[i]]
        mean_lp = sum(logp[i, t].item() for i, t in flat) / len(flat)
        mean_a = sum(float(adv[i]) for i, _ in flat) / len(flat)
        cov = {(i, t): (logp[i, t].item() - mean_lp) * (float(adv[i]) - mean_a) for i, t in flat}
        chosen = set(sorted(flat, key=lambda key: -cov[key])[:int(kl_cov_frac * len(flat))])
    if objective == "clip_cov":
        def clip_acts(i, t):
            r, a = math.exp(logp[i, t].item() - old[i, t].item()), float(adv[i])
            return (r < 1 - eps_low and a < 0) or (r > 1 + eps_high and a > 0)
        # row by row, as the implementation lists them; then a uniform draw of that many
        candidates = [key for key in flat if not clip_acts(*key) and clip_cov_low < cov[key] < clip_cov_high]
        count = min(max(1, int(clip_cov_frac * len(flat))), len(candidates))
        detached = {candidates[j] for j in torch.randperm(len(candidates))[:count].tolist()}
    for i in range(n):
        if not tokens[i]:
            continue
        a = float(adv[i])
        log_ratios = {t: logp[i, t] - old[i, t] for t in tokens[i]}
        if ratio_level == "sequence":
            seq = sum(log_ratios.values()) / len(tokens[i])
            log_ratios = {t: seq for t in tokens[i]}
        if objective == "gmpo":
            low, high = (math.log(1 - eps_low) if eps_low < 1 else -math.inf), math.log(1 + eps_high)
            kept = []
            for t in tokens[i]:
                x = log_ratios[t]
                clipped = torch.clamp(x, low, high)
                kept.append(torch.minimum(x, clipped) if a >= 0 else torch.maximum(x, clipped))
            seq_loss = -a * torch.exp(sum(kept) / len(kept))
            for t in tokens[i]:
                out[i, t] = seq_loss
            continue
        for t in tokens[i]:
            r = torch.exp(log_ratios[t])
            if objective == "ppo_clip":
                loss = -torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
                if clip_ratio_c is not None and a < 0:
                    loss = torch.minimum(loss, torch.tensor(-clip_ratio_c * a, dtype=loss.dtype))
            elif objective == "cispo":
                weight = min(max(r.item(), 1 - eps_low), 1 + eps_high)  # a number: no gradient through it
                loss = -weight * a * logp[i, t]
            elif objective == "sapo":
                tau = tau_pos if a > 0 else tau_neg
                loss = -(4 / tau) / (1 + torch.exp(-tau * (r - 1))) * a
            elif objective == "kl_cov":
                loss = -a * r + (kl_cov_coef * torch.abs(logp[i, t] - old[i, t]) if (i, t) in chosen else 0.0)
            elif objective == "clip_cov":
                loss = -torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
                if (i, t) in detached:
                    loss = loss * 0.0
            out[i, t] = loss
    return out


def reference_aggregate(losses, mask, loss_agg, max_response_len):
    sequences = sorted({i for i, _ in losses})
    per_seq = {i: [v for (j, _), v in losses.items() if j == i] for i in sequences}
    if loss_agg == "token_mean":
        return sum(losses.values()) / len(losses)
    if loss_agg in ("seq_mean_token_mean", "seq_mean"):
        return sum(sum(v) / len(v) for v in per_seq.values()) / len(sequences)
    return sum(losses.values()) / (len(sequences) * max_response_len)


def random_batch(seed, n=6, t=5, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(n, t, generator=gen, dtype=torch.float64) * spread  # both sides of every clip
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    lengths[0] = t
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    mask[-1] = 0  # a response with no loss tokens (all filtered out) counts nowhere
    return logp, old, adv, mask


def counts(mask, max_len=5):
    return dict(num_sequences=int((mask.sum(-1) > 0).sum()), num_tokens=int(mask.sum()), max_response_len=max_len)


CASES = [  # (objective, its settings): each at its paper's values and at others
    ("ppo_clip", dict(eps_low=0.2, eps_high=0.28)),
    ("ppo_clip", dict(eps_low=0.1, eps_high=0.1, clip_ratio_c=1.5)),
    ("ppo_clip", dict(eps_low=0.05, eps_high=0.05, ratio_level="sequence")),
    ("cispo", dict(eps_low=1.0, eps_high=0.1)),
    ("cispo", dict(eps_low=0.1, eps_high=0.2)),
    ("cispo", dict(eps_low=0.1, eps_high=0.05, ratio_level="sequence")),
    ("gmpo", dict(eps_low=1 - math.exp(-0.4), eps_high=math.exp(0.4) - 1)),
    ("gmpo", dict(eps_low=0.1, eps_high=0.15)),
    ("gmpo", dict(eps_low=1.0, eps_high=0.1)),
    ("sapo", dict(tau_pos=1.0, tau_neg=1.05)),
    ("sapo", dict(tau_pos=3.0, tau_neg=8.0)),
    ("sapo", dict(tau_pos=2.0, tau_neg=2.5, ratio_level="sequence")),
    ("kl_cov", dict(kl_cov_frac=0.1, kl_cov_coef=1.0)),
    ("kl_cov", dict(kl_cov_frac=0.3, kl_cov_coef=0.5)),
    ("clip_cov", dict(clip_cov_frac=0.2, clip_cov_low=0.0, clip_cov_high=5.0)),
    ("clip_cov", dict(eps_low=0.1, eps_high=0.3, clip_cov_frac=0.5, clip_cov_low=-0.5, clip_cov_high=0.5)),
]


def run_both(objective, settings, loss_agg, seed):
    """(implementation's loss, its gradient, reference loss, reference gradient) on one random batch."""
    logp0, old, adv, mask = random_batch(seed)
    settings = dict(settings)
    ratio_level = settings.pop("ratio_level", "token")
    clip = dict(eps_low=0.2, eps_high=0.2, clip_ratio_c=None) | {k: v for k, v in settings.items()
                                                                  if k in ("eps_low", "eps_high", "clip_ratio_c")}
    others = {k: v for k, v in settings.items() if k not in clip}
    logp = logp0.clone().requires_grad_(True)
    torch.manual_seed(seed)  # clip_cov's draw
    loss, metrics = policy_loss(logp, old, adv, mask, ratio_level=ratio_level, loss_agg=loss_agg, objective=objective,
                                **clip, **others, **counts(mask))
    loss.backward()
    ref_logp = logp0.clone().requires_grad_(True)
    torch.manual_seed(seed)
    losses = reference_token_losses(objective, ref_logp, old, adv, mask, ratio_level=ratio_level, **clip, **others)
    expected = reference_aggregate(losses, mask, loss_agg, max_response_len=5)
    expected.backward()
    return loss, logp.grad, expected, ref_logp.grad, metrics


@pytest.mark.parametrize("objective,settings", CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(CASES)])
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_objective_value_and_gradient_match_the_reference(objective, settings, loss_agg, seed):
    loss, grad, expected, expected_grad, _ = run_both(objective, settings, loss_agg, seed)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6, rtol=0), (grad, expected_grad)
    assert grad.abs().sum() > 0


def test_every_registered_objective_has_a_reference_case():
    assert {o for o, _ in CASES} == set(OBJECTIVES.names())
    assert OBJECTIVES.names()[0] == "ppo_clip"


def test_the_batches_reach_every_branch():
    """The random batches above have ratios outside every clip band and both advantage signs."""
    logp, old, adv, mask = random_batch(0)
    r = (logp - old).exp()[mask.bool()]
    assert (r < 0.8).any() and (r > 1.28).any() and (adv > 0).any() and (adv < 0).any()


# ---- What each objective is, on hand-computed cases -----------------------------------------------------

def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # r = 2 is far above 1 + eps_high: PPO-clip gives that token (A > 0) no gradient, CISPO gives it
    # -clip(r) A = -1.2 per unit of logp, divided by the token count.
    logp = torch.log(torch.tensor([[2.0, 1.0]], dtype=torch.float64)).requires_grad_(True)
    old, adv, mask = torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2)
    settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                    **counts(mask, 2))
    loss, metrics = policy_loss(logp, old, adv, mask, objective="cispo", **settings)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.2 / 2, -1.0 / 2])
    assert metrics["clip_frac_high"] == 0.5
    ppo = logp.detach().clone().requires_grad_(True)
    policy_loss(ppo, old, adv, mask, objective="ppo_clip", **settings)[0].backward()
    assert ppo.grad[0, 0] == 0.0


def test_gmpo_is_the_geometric_mean_of_the_clipped_token_ratios():
    # Token ratios e^0.1 and e^0.9 with A = 1 and the range (e^-0.4, e^0.4): the second is clipped to e^0.4,
    # so the sequence ratio is exp((0.1 + 0.4) / 2), where the arithmetic mean of PPO would be (e^0.1 + e^0.4)/2.
    logp = torch.tensor([[0.1, 0.9]], dtype=torch.float64)
    old, mask = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2)
    loss, metrics = policy_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), mask, objective="gmpo",
                                ratio_level="token", eps_low=1 - math.exp(-0.4), eps_high=math.exp(0.4) - 1,
                                clip_ratio_c=None, loss_agg="seq_mean", **counts(mask, 2))
    assert loss.item() == pytest.approx(-math.exp(0.25), abs=1e-12)
    assert metrics["clip_frac_high"] == 0.5
    # A < 0: the larger of clipped and unclipped, so the ratio above the range stays: exp((0.1 + 0.9) / 2)
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0], dtype=torch.float64), mask, objective="gmpo",
                          ratio_level="token", eps_low=1 - math.exp(-0.4), eps_high=math.exp(0.4) - 1,
                          clip_ratio_c=None, loss_agg="seq_mean", **counts(mask, 2))
    assert loss.item() == pytest.approx(math.exp(0.5), abs=1e-12)


def test_sapo_gate_is_one_on_policy_and_fades_off_policy():
    # On-policy (r = 1) the gate's value is 2/tau and its gradient weight 4 s (1 - s) = 1, as PPO's;
    # at r = 3 the weight is 4 s(1-s) r, much less than r.
    logp = torch.log(torch.tensor([[1.0, 3.0]], dtype=torch.float64)).requires_grad_(True)
    old, mask = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2)
    loss, metrics = policy_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), mask, objective="sapo",
                                tau_pos=1.0, tau_neg=1.05, ratio_level="token", eps_low=0.2, eps_high=0.2,
                                clip_ratio_c=None, loss_agg="token_mean", **counts(mask, 2))
    loss.backward()
    s = 1 / (1 + math.exp(-2.0))
    assert loss.item() == pytest.approx(-(2.0 + 4 * s) / 2, abs=1e-12)
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -4 * s * (1 - s) * 3 / 2], abs=1e-12)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0


def test_kl_cov_selects_the_tokens_of_largest_covariance():
    # Four tokens; the covariance (logp - mean)(A - mean) is largest for the token with high logp and
    # high A: with frac 0.25 only it gets beta |logp - old|.
    logp = torch.tensor([[-0.1, -3.0], [-0.2, -2.5]], dtype=torch.float64)
    old = logp - torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 2)
    settings = dict(objective="kl_cov", ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None,
                    loss_agg="token_mean", **counts(mask, 2))
    with_kl, metrics = policy_loss(logp, old, adv, mask, kl_cov_frac=0.25, kl_cov_coef=2.0, **settings)
    without, _ = policy_loss(logp, old, adv, mask, kl_cov_frac=0.25, kl_cov_coef=0.0, **settings)
    assert with_kl.item() - without.item() == pytest.approx(2.0 * 0.5 / 4, abs=1e-12)
    assert metrics["kl_cov/selected_frac"] == 0.25


def test_clip_cov_removes_the_gradient_of_drawn_tokens_only_inside_the_band():
    # Four unclipped tokens (r = 1): logp -1, -1 | -3, -1 and A +1 | -2 give covariances 0.75, 0.75 | 2.25,
    # -0.75. The band (1, 5) holds the third alone, so with frac 0.25 (one token) it is always the one drawn.
    logp = torch.tensor([[-1.0, -1.0], [-3.0, -1.0]], dtype=torch.float64).requires_grad_(True)
    old, adv, mask = logp.detach().clone(), torch.tensor([1.0, -2.0], dtype=torch.float64), torch.ones(2, 2)
    settings = dict(objective="clip_cov", ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None,
                    loss_agg="token_mean", clip_cov_frac=0.25, clip_cov_low=1.0, **counts(mask, 2))
    for seed in range(5):
        torch.manual_seed(seed)
        logp.grad = None
        loss, metrics = policy_loss(logp, old, adv, mask, clip_cov_high=5.0, **settings)
        loss.backward()
        assert logp.grad.flatten().tolist() == pytest.approx([-1 / 4, -1 / 4, 0.0, 2 / 4])  # -A r / 4, not the drawn
        assert metrics["clip_cov/detached_frac"] == 0.25
    # a band that holds nothing removes nothing: PPO-clip's gradient
    logp.grad = None
    loss, metrics = policy_loss(logp, old, adv, mask, clip_cov_high=2.0, **settings)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 4, -1 / 4, 2 / 4, 2 / 4])
    assert metrics["clip_cov/detached_frac"] == 0.0


def test_an_objective_refuses_a_ratio_level_it_is_not_defined_at():
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match="objective 'gmpo' works at ratio level token, not sequence"):
        policy_loss(logp, old, adv, mask, objective="gmpo", ratio_level="sequence", eps_low=0.2, eps_high=0.2,
                    clip_ratio_c=None, loss_agg="seq_mean", **counts(mask))


def test_ppo_clip_is_the_default_objective():
    logp, old, adv, mask = random_batch(7)
    settings = dict(ratio_level="token", eps_low=0.2, eps_high=0.28, clip_ratio_c=None, loss_agg="token_mean",
                    **counts(mask))
    assert policy_loss(logp, old, adv, mask, **settings)[0].item() == \
        policy_loss(logp, old, adv, mask, objective="ppo_clip", **settings)[0].item()


PER_MICRO_BATCH = ("kl_cov", "clip_cov")


@pytest.mark.parametrize("objective,settings", [c for c in CASES if c[0] not in PER_MICRO_BATCH],
                         ids=[f"{o}-{i}" for i, (o, _) in enumerate(CASES) if o not in PER_MICRO_BATCH])
def test_gradient_accumulation_gives_the_same_gradient(objective, settings):
    """KL-Cov and Clip-Cov aside (they select among a micro-batch's tokens, as the paper's implementation
    does: docs/objectives.md)."""
    logp0, old, adv, mask = random_batch(4, n=8, t=6)
    settings = dict(settings)
    kwargs = dict(ratio_level=settings.pop("ratio_level", "token"), eps_low=settings.pop("eps_low", 0.2),
                  eps_high=settings.pop("eps_high", 0.2), clip_ratio_c=settings.pop("clip_ratio_c", None),
                  loss_agg="token_mean", objective=objective, **settings, **counts(mask, 6))
    full = logp0.clone().requires_grad_(True)
    policy_loss(full, old, adv, mask, **kwargs)[0].backward()
    split = logp0.clone().requires_grad_(True)
    for rows in (slice(0, 3), slice(3, 8)):
        policy_loss(split[rows], old[rows], adv[rows], mask[rows], **kwargs)[0].backward()
    assert torch.allclose(full.grad, split.grad, atol=1e-12)


# ---- Advantage estimators ------------------------------------------------------------------------------

def reference_rloo(rewards, group_size):
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        for i, r in enumerate(group):
            out.append(r - sum(g for j, g in enumerate(group) if j != i) / (group_size - 1))
    return out


def reference_reinforce_pp(rewards, group_size):
    centred = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        centred += [r - sum(group) / len(group) for r in group]
    mean = sum(centred) / len(centred)
    std = math.sqrt(sum((c - mean) ** 2 for c in centred) / (len(centred) - 1))
    return [(c - mean) / (std + 1e-6) for c in centred]


@pytest.mark.parametrize("name,reference", [("rloo", reference_rloo), ("reinforce_pp", reference_reinforce_pp)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantage_estimator_matches_the_reference(name, reference, seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(24, generator=gen, dtype=torch.float64)
    rewards[:4] = 1.0  # a group of equal rewards: no gradient from it
    got = group_advantages(rewards, 4, name)
    assert got.tolist() == pytest.approx(reference(rewards.tolist(), 4), abs=1e-6)
    assert got[:4].abs().max() < 1e-9


def test_rloo_and_reinforce_pp_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    # RLOO: 1 - (0 + 0 + 1)/3 = 2/3; 0 - (1 + 0 + 1)/3 = -2/3
    assert group_advantages(rewards, 4, "rloo")[:2].tolist() == pytest.approx([2 / 3, -2 / 3])
    # REINFORCE++: centred [.5, -.5, -.5, .5, .25, .25, -.75, .25] over their batch std, not the group's
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, -0.75, 0.25])
    assert torch.allclose(group_advantages(rewards, 4, "reinforce_pp"), centred / (centred.std() + 1e-6))
    assert not torch.allclose(group_advantages(rewards, 4, "reinforce_pp"), group_advantages(rewards, 4, "batch"))


def test_the_config_offers_exactly_the_registered_objectives():
    from rlft.config.algo import Objective, ScaleRewards
    assert list(Objective.__members__) == OBJECTIVES.names()
    assert list(ScaleRewards.__members__) == ADVANTAGES.names()
    assert {"rloo", "reinforce_pp"} <= set(ADVANTAGES.names())


# ---- Presets and config ------------------------------------------------------------------------------

def algo(name, *overrides):
    dcfg, choices = compose([f"algo={name}", *[f"algo.{o}" for o in overrides]])
    run = to_run_config(dcfg, choices)
    validate(run)
    return run.algo


PRESETS = {"cispo": "cispo", "gmpo": "gmpo", "sapo": "sapo", "kl_cov": "kl_cov", "clip_cov": "clip_cov",
           "rloo": "ppo_clip",
           "reinforce_pp": "ppo_clip"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_composes_validates_and_picks_its_parts(name):
    a = algo(name)
    assert a.objective == PRESETS[name]
    settings = loss_settings(a, step=1, max_response_len=6)
    assert settings.objective == PRESETS[name]
    logp, old, adv, mask = random_batch(3, t=6)
    loss, _ = policy_loss(logp.requires_grad_(True), old, adv, mask, num_sequences=int((mask.sum(-1) > 0).sum()),
                          num_tokens=int(mask.sum()), **asdict(settings))
    loss.backward()
    assert torch.isfinite(loss) and logp.grad.abs().sum() > 0


def test_presets_have_the_papers_values():
    cispo, gmpo, sapo, kl_cov = algo("cispo"), algo("gmpo"), algo("sapo"), algo("kl_cov")
    assert (cispo.eps_low, cispo.loss_agg, cispo.kl_coef) == (1.0, "token_mean", 0.0)
    assert math.log(1 - gmpo.eps_low) == pytest.approx(-0.4) and math.log(1 + gmpo.eps_high) == pytest.approx(0.4)
    assert (gmpo.loss_agg, sapo.sapo.tau_pos, sapo.sapo.tau_neg) == ("seq_mean", 1.0, 1.05)
    assert (kl_cov.kl_cov.frac, kl_cov.kl_cov.coef) == (2e-3, 1.0)
    clip_cov = algo("clip_cov").clip_cov
    assert (clip_cov.frac, clip_cov.low, clip_cov.high) == (2e-4, 1.0, 5.0)
    assert (algo("rloo").scale_rewards, algo("reinforce_pp").scale_rewards) == ("rloo", "reinforce_pp")


def test_objective_keys_reach_the_loss_settings():
    s = loss_settings(algo("grpo", "objective=sapo", "sapo.tau_neg=2.0"), step=1, max_response_len=4)
    assert (s.objective, s.tau_pos, s.tau_neg) == ("sapo", 1.0, 2.0)
    s = loss_settings(algo("grpo", "objective=sapo"), step=1, max_response_len=4)
    assert (s.tau_pos, s.tau_neg) == (1.0, 1.05)  # a null section is the paper's values
    s = loss_settings(algo("kl_cov", "kl_cov.frac=0.01"), step=1, max_response_len=4)
    assert (s.kl_cov_frac, s.kl_cov_coef) == (0.01, 1.0)
    s = loss_settings(algo("clip_cov", "clip_cov.high=3"), step=1, max_response_len=4)
    assert (s.objective, s.clip_cov_frac, s.clip_cov_low, s.clip_cov_high) == ("clip_cov", 2e-4, 1.0, 3.0)


CONFIG_ERRORS = [
    (["objective=gmpo", "ratio_level=sequence"], "algo.objective=gmpo works at algo.ratio_level=token (got sequence)"),
    (["objective=kl_cov", "ratio_level=sequence_token"], "algo.objective=kl_cov works at algo.ratio_level=token"),
    (["objective=sapo", "clip_ratio_c=3"], "algo.clip_ratio_c is a key of algo.objective=ppo_clip, not of sapo"),
    (["objective=sapo", "eps_high_schedule.end=0.3"],
     "algo.eps_high_schedule is a key of algo.objective=ppo_clip or cispo or gmpo or clip_cov, not of sapo"),
    (["sapo.tau_pos=2"], "algo.sapo is a key of algo.objective=sapo, not of ppo_clip"),
    (["kl_cov.frac=0.1"], "algo.kl_cov is a key of algo.objective=kl_cov, not of ppo_clip"),
    (["objective=sapo", "sapo.tau_neg=0"], "algo.sapo.tau_neg must be a finite number > 0 (got 0"),
    (["objective=kl_cov", "kl_cov.frac=0"], "algo.kl_cov.frac must be in (0, 1] (got 0"),
    (["objective=kl_cov", "kl_cov.frac=1.5"], "algo.kl_cov.frac must be in (0, 1] (got 1.5)"),
    (["objective=kl_cov", "kl_cov.coef=-1"], "algo.kl_cov.coef must be >= 0 (got -1"),
    (["clip_cov.frac=0.1"], "algo.clip_cov is a key of algo.objective=clip_cov, not of ppo_clip"),
    (["objective=clip_cov", "clip_cov.frac=0"], "algo.clip_cov.frac must be in (0, 1] (got 0"),
    (["objective=clip_cov", "clip_cov.low=5", "clip_cov.high=1"],
     "algo.clip_cov.low must be below algo.clip_cov.high (got 5"),
    (["objective=clip_cov", "ratio_level=sequence"], "algo.objective=clip_cov works at algo.ratio_level=token"),
    (["eps_low=1.5"], "algo.eps_low must be in [0, 1] (got 1.5)"),
]


@pytest.mark.parametrize("overrides,message", CONFIG_ERRORS, ids=[" ".join(o) for o, _ in CONFIG_ERRORS])
def test_objective_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        algo("grpo", *overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


CLI_ERRORS = [
    (["algo=sapo", "algo.sapo.tau_pos=-1"], "algo.sapo.tau_pos must be a finite number > 0 (got -1.0)"),
    (["algo.objective=nope"], "algo.objective='nope' is not one of: ppo_clip, cispo, gmpo, sapo, kl_cov"),
    (["algo.scale_rewards=loo"], "algo.scale_rewards='loo' is not one of: group, batch, none, rloo, reinforce_pp"),
]


@pytest.mark.parametrize("overrides,message", CLI_ERRORS, ids=[" ".join(o) for o, _ in CLI_ERRORS])
def test_a_bad_objective_is_one_error_line_from_the_cli(rlft_here, tmp_path, overrides, message):
    test_config.test_config_errors_are_one_line_before_any_work(rlft_here, tmp_path, overrides, message)
