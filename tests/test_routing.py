"""Routing replay on mixture-of-experts policies (rlft.models.routing; ALGORITHMS.md)."""

from dataclasses import asdict

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from rlft.algos.losses import policy_loss
from rlft.errors import ConfigError
from rlft.learner.logprobs import model_packing, response_logprobs
from rlft.learner.policy import Policy
from rlft.models.routing import RouterTap, find_routers
from rlft.types import LossSettings, Rollout, TrainBatch

SETTINGS = LossSettings(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                        max_response_len=5)
SHAPE = dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, max_position_embeddings=64, num_experts_per_tok=2, pad_token_id=0, eos_token_id=1)


def qwen3_moe(seed=0):
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=8, moe_intermediate_size=32, intermediate_size=64,
                                              norm_topk_prob=True, mlp_only_layers=[], **SHAPE)).eval()


def mixtral(seed=0):
    torch.manual_seed(seed)
    return MixtralForCausalLM(MixtralConfig(num_local_experts=8, intermediate_size=32, **SHAPE)).eval()


def tokens(rows=4, length=10, seed=1):
    ids = torch.randint(2, 32, (rows, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding in one row
    return ids, mask


def experts_used(model):
    """Spy on the experts modules' top_k_index argument: the experts that actually ran, per layer."""
    used, handles = {}, []
    for layer, block in enumerate(m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")):
        handles.append(block.experts.register_forward_pre_hook(
            lambda mod, args, layer=layer: used.__setitem__(layer, args[1].clone())))
    return used, handles


def nudge_routers(model, scale=0.5, seed=5):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in find_routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=gen) * scale * router.weight.std())


def test_replay_forces_the_recorded_experts_after_the_router_has_moved():
    model = qwen3_moe()
    ids, mask = tokens()
    tap = RouterTap(model)
    used, _ = experts_used(model)
    counts = tap.counts()
    tap.begin("pass", mask, record=True, replay=False, compare=False)
    model(input_ids=ids, attention_mask=mask)
    tap.end(counts)
    recorded = {layer: idx.clone() for layer, idx in tap.recorded["pass"].items()}
    assert set(recorded) == {0, 1} and recorded[0].shape == (ids.numel(), 2)
    nudge_routers(model)

    drifting = tap.counts()
    tap.begin("pass", mask, record=False, replay=False, compare=True)
    model(input_ids=ids, attention_mask=mask)
    tap.end(drifting)
    changed = [(used[layer].sort(-1).values != recorded[layer].sort(-1).values).any(-1) for layer in recorded]
    assert any(c.any() for c in changed)  # replay off: some tokens go to other experts now
    assert drifting.stats().routing_drift == drifting.stats().router_drift > 0

    replayed = tap.counts()
    tap.begin("pass", mask, record=False, replay=True, compare=True)
    model(input_ids=ids, attention_mask=mask)
    tap.end(replayed)
    for layer in recorded:  # replay on: every layer and token runs the recorded experts
        assert torch.equal(used[layer], recorded[layer]), layer
    stats = replayed.stats()
    assert stats.routing_drift == 0.0
    assert stats.router_drift == pytest.approx(drifting.stats().router_drift)


@pytest.mark.parametrize("build", [qwen3_moe, mixtral])
def test_replaying_a_models_own_routes_changes_nothing(build):
    """Same weights: the replayed gate weights equal the router's own, for both normalisation styles."""
    model = build()
    ids, mask = tokens()
    plain = model(input_ids=ids, attention_mask=mask).logits
    tap = RouterTap(model)
    tap.begin(0, mask, record=True, replay=False, compare=False)
    model(input_ids=ids, attention_mask=mask)
    tap.begin(0, mask, record=False, replay=True, compare=True)
    replayed = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(plain, replayed, atol=1e-6, rtol=0)
    tap.clear()  # outside learner passes the hooks change nothing
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, plain)


def test_gradients_reach_the_routers_with_replay_on():
    model = qwen3_moe().train()
    ids, mask = tokens()
    tap = RouterTap(model)
    tap.begin(0, mask, record=True, replay=False, compare=False)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    nudge_routers(model)
    tap.begin(0, mask, record=False, replay=True, compare=True)
    model(input_ids=ids, attention_mask=mask).logits.logsumexp(-1).sum().backward()
    for router in find_routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def moe_batch(model, rows=8, prompt_len=4, response_len=5):
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(2, 32, (rows, prompt_len), generator=gen)
    response = torch.randint(2, 32, (rows, response_len), generator=gen)
    prompt_mask, response_mask = torch.ones_like(prompt), torch.ones_like(response)
    prompt_mask[0, :2] = 0
    response_mask[1, 3:] = 0
    prompt_mask[2::3, :3], response_mask[2::3, 1:] = 0, 0  # rows 2, 5 of 2 tokens: packed, they share rows
    prompt[prompt_mask == 0], response[response_mask == 0] = 0, 0
    with torch.no_grad():
        logp = response_logprobs(model, prompt, prompt_mask, response, response_mask)
    advantages = torch.linspace(-1, 1, rows)
    rollout = Rollout(prompt, prompt_mask, response, response_mask, logp, truncated=torch.zeros(rows, dtype=torch.bool))
    return TrainBatch(rollout, advantages=advantages, loss_mask=response_mask)


def moe_learner(seed=0, **kwargs):
    return Policy(qwen3_moe(seed).train(), max_grad_norm=1e9, **kwargs)


PACKED = pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])


@PACKED
@pytest.mark.parametrize("micro_batch_size", [8, 3])
def test_learner_reports_drift_without_replay_and_none_with_it(micro_batch_size, padding_free):
    runs = {}
    for replay in (False, True):
        learner = moe_learner(routing_replay=replay, padding_free=padding_free, ppo_epochs=3,
                              micro_batch_size=micro_batch_size)
        assert learner.padding_free == padding_free
        batch = moe_batch(learner.model)
        runs[replay] = learner.update(batch, SETTINGS, lr=3e-2).routing
    off, on = runs[False], runs[True]
    assert off.routing_drift == off.router_drift > 0  # the router moved in epochs 2-3
    assert on.routing_drift == 0.0 and on.router_drift > 0
    real = int(torch.cat([batch.rollout.prompt_mask, batch.rollout.response_mask], 1).sum())
    assert sum(on.expert_tokens) == real * 2 * 2  # tokens x layers x top-k


@PACKED
def test_the_loss_is_the_dense_formula_on_the_replayed_logprobs(padding_free):
    """Routes from outside (the rollout engine's, R3): the learner replays them in every pass, and its loss
    is policy_loss of the log-probs computed under those routes, nothing else. Packed, the learner picks
    the real tokens' routes out of the padded layout the engine returns."""
    learner = moe_learner(routing_replay=True, padding_free=padding_free)
    batch = moe_batch(learner.model)
    r = batch.rollout
    if padding_free:  # short sequences share rows
        assert model_packing(learner.model, r.prompt_mask, r.response_mask).rows < batch.size
    layers, tokens_per_row = 2, r.prompt_ids.shape[1] + r.response_ids.shape[1]
    routes = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(i))[:2]
                          for i in range(batch.size * tokens_per_row * layers)])
    r.routes = routes.view(batch.size, tokens_per_row, layers, 2)

    reference = qwen3_moe().train()
    tap = RouterTap(reference)
    tap.set_routes("all", r.routes)
    tap.begin("all", torch.cat([r.prompt_mask, r.response_mask], 1), record=False, replay=True, compare=True)
    logp = response_logprobs(reference, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    tap.clear()
    expected, _ = policy_loss(logp, logp.detach(), batch.advantages, batch.loss_mask,
                              num_sequences=batch.size, num_tokens=int(batch.loss_mask.sum()),
                              rollout_logp=r.logprobs, **asdict(SETTINGS))
    stats = learner.update(batch, SETTINGS, lr=3e-2)
    assert stats.loss == pytest.approx(expected.item(), abs=1e-7)
    # the log-probs themselves (at ratio 1 the loss's value does not depend on them)
    gap = (logp.detach() - r.logprobs).abs()[r.response_mask.bool()]
    assert gap.mean() > 1e-3  # the engine's random routes are not the model's own
    assert stats.logprob_diff_mean == pytest.approx(gap.mean().item(), rel=1e-5)
    assert stats.routing.routing_drift == 0.0 and stats.routing.router_drift > 0.5  # random routes


def test_the_load_balancing_loss_is_added_with_its_coefficient():
    plain, balanced = moe_learner(), moe_learner(router_aux_loss_coef=0.1)
    batch = moe_batch(plain.model)
    a = plain.update(batch, SETTINGS, lr=3e-2)
    b = balanced.update(batch, SETTINGS, lr=3e-2)
    assert a.routing.load_balance_loss == pytest.approx(b.routing.load_balance_loss)
    assert a.routing.load_balance_loss > 0
    # one pass: the loss term is the step's load balance
    assert b.loss - a.loss == pytest.approx(0.1 * a.routing.load_balance_loss, rel=1e-4)
    assert any(not torch.equal(p, q) for (_, p), q in zip(plain.model.named_parameters(),
                                                          balanced.model.parameters()))


def test_the_load_balance_metric_does_not_depend_on_the_micro_batches():
    stats = [moe_learner(micro_batch_size=size).update(moe_batch(qwen3_moe()), SETTINGS, lr=3e-2).routing
             for size in (8, 3)]
    for key in ("load_balance_loss", "expert_load_cv", "expert_tokens"):
        assert getattr(stats[0], key) == pytest.approx(getattr(stats[1], key), rel=1e-6), key


def test_a_dense_model_has_no_routers_and_replay_is_refused():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    dense = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert find_routers(dense) == []
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        Policy(dense, routing_replay=True)


@pytest.mark.parametrize("max_batch_size", [16, 3])  # 3: rollouts of different widths are concatenated
def test_the_hf_engine_returns_the_routes_a_full_forward_pass_picks(max_batch_size):
    from rlft.types import SamplingParams
    from rlft.rollout.hf_engine import HFEngine
    engine = HFEngine(qwen3_moe(), pad_id=0, eos_ids=[1], seed=0, max_batch_size=max_batch_size, return_routes=True)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    rollout = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6))
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
    assert rollout.routes.shape == (6, ids.shape[1], 2, 2) and rollout.routes.dtype == torch.uint8

    model = qwen3_moe()
    tap = RouterTap(model)
    tap.begin(0, mask, record=True, replay=False, compare=False)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    full = torch.stack([tap.recorded[0][layer] for layer in range(2)], 1).view(6, ids.shape[1], 2, 2)
    # every real token but the last one of each response (never fed back) went to the same experts
    scored = mask.clone()
    last = rollout.prompt_ids.shape[1] + rollout.response_mask.sum(-1) - 1
    scored[torch.arange(6), last] = 0
    same = (rollout.routes.long().sort(-1).values == full.sort(-1).values).all(-1).all(-1)
    assert same[scored.bool()].all()


@PACKED
def test_replay_under_gradient_checkpointing_gives_the_same_update(padding_free):
    """The backward recompute of a checkpointed layer runs the routers again: it must replay too."""
    plain, checkpointed = (moe_learner(routing_replay=True, padding_free=padding_free, ppo_epochs=3, micro_batch_size=4)
                           for _ in range(2))
    checkpointed.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = moe_batch(plain.model)
    a = plain.update(batch, SETTINGS, lr=3e-2)
    b = checkpointed.update(batch, SETTINGS, lr=3e-2)
    assert a.routing.router_drift > 0 and b.routing.routing_drift == 0.0
    assert b.loss == pytest.approx(a.loss, abs=1e-6)
    for (name, p), q in zip(plain.model.named_parameters(), checkpointed.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_engine_routes_are_placed_like_the_padded_tokens():
    """vLLM's layout: per request, prompt then response tokens, the last sampled one missing."""
    from rlft.rollout.batching import place_routes
    prompt_lens, response_lens = [2, 4], [3, 1]
    per_request = [torch.arange(p + r - 1).view(-1, 1, 1).expand(-1, 2, 2) + 10 * i
                   for i, (p, r) in enumerate(zip(prompt_lens, response_lens))]
    routes = place_routes(per_request, prompt_lens, prompt_width=4, response_width=3)
    assert routes.shape == (2, 7, 2, 2) and routes.dtype == torch.uint8
    assert routes[0, :, 0, 0].tolist() == [0, 0, 0, 1, 2, 3, 0]  # 2 pad, prompt 0-1, response 2-3, last missing
    assert routes[1, :, 0, 0].tolist() == [10, 11, 12, 13, 0, 0, 0]  # one response token: never fed back
