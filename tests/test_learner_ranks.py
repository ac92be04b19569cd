"""Data-parallel learner ranks over gloo, replicated or sharded (FSDP2): 2 ranks take exactly the 1-rank
optimizer steps, and a full checkpoint state taken on 2 sharded ranks loads on 1."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from test_learner import SETTINGS, batch_and_path

from dataclasses import asdict, replace

from rlft.learner.policy import Policy
from rlft.models.loading import load_causal_lm

SETTINGS_DAPO = replace(SETTINGS, eps_high=0.28, loss_agg="seq_mean_token_mean")


def make_learner(path, group=None, fsdp=False) -> Policy:
    # micro-batches of 3: uneven shards. Adam's eps well above float error (test_learner's
    # micro-batch test says why)
    return Policy(load_causal_lm(path, "float32", "cpu"), max_grad_norm=1.0, ppo_epochs=2, micro_batch_size=3,
                  group=group, fsdp=fsdp, routing_replay="tiny_moe" in str(path), eps=1e-3)


def train(learner: Policy, batch, settings=(SETTINGS, SETTINGS_DAPO, SETTINGS)) -> list[dict]:
    """Each update's statistics, flattened (routing statistics included) for comparison."""
    rows = []
    for s in settings:
        stats = asdict(learner.update(batch, s, lr=1e-3))
        routing = stats.pop("routing") or {}
        named = stats.pop("named")  # the objective's and correction's own metrics
        rows.append(stats | {f"routing_{k}": v for k, v in routing.items()} | {f"named_{k}": v for k, v in named.items()})
    return rows


def rank_main(rank: int, out: str, fsdp: bool) -> None:
    # the batch comes from the parent: sampling it here could differ by thread count
    path, batch = torch.load(f"{out}.batch", weights_only=False)
    # a file store in the test's own folder: no port to race for on a busy machine
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=2)
    learner = make_learner(path, dist.group.WORLD, fsdp)
    metrics = train(learner, batch)
    weights = {n: t.clone() for n, t in learner.full_weights().items()}  # a collective under FSDP
    optimizer_state = learner.full_optimizer_state()
    if weights:
        save_file(weights, f"{out}.{rank}")
        torch.save(optimizer_state, f"{out}.{rank}.optimizer")
    torch.save(metrics, f"{out}.{rank}.metrics")
    dist.destroy_process_group()


@pytest.mark.parametrize("fsdp,model", [(False, "builtin:tiny-adder"), (True, "builtin:tiny-adder"),
                                        (True, "builtin:tiny-moe")], ids=["replicated", "fsdp", "fsdp-moe-replay"])
def test_two_ranks_train_like_one(tmp_path, fsdp, model):
    out = str(tmp_path / "rank")
    path, batch = batch_and_path(model)
    torch.save((path, batch), f"{out}.batch")
    mp.start_processes(rank_main, args=(out, fsdp), nprocs=2, start_method="spawn", join=True)
    one = make_learner(path)
    one_metrics = train(one, batch)
    one_weights = {n: p.detach().clone() for n, p in one.model.named_parameters()}
    tolerance = 1e-4 if "moe" in model else 1e-5  # the MoE model moves ~10x more per step at this lr
    for rank in (0,) if fsdp else (0, 1):  # under FSDP rank 0 alone gathers the full weights
        weights, metrics = load_file(f"{out}.{rank}"), torch.load(f"{out}.{rank}.metrics")
        for name, tensor in one_weights.items():
            if name.endswith("k_proj.bias"):
                # softmax ignores a shift of every key by one vector: this gradient is 0 up to rounding,
                # and Adam scales rounding noise to lr-sized steps, in one rank count as in the other
                continue
            # 6 Adam steps of lr 1e-3; summation order differs (ranks, micro-batches): measured <= 1.1e-5
            # dense, <= 3.4e-5 MoE (router rows of rarely chosen experts: small gradients, scaled up by Adam)
            assert torch.allclose(weights[name], tensor, atol=3 * tolerance, rtol=0), (rank, name)
        for ours, theirs in zip(metrics, one_metrics):
            assert ours.keys() == theirs.keys()
            for key in theirs:
                if key.endswith("_seconds") or theirs[key] is None:  # wall-clock seconds differ between any two runs
                    assert (ours[key] is None) == (theirs[key] is None), key
                    continue
                a, b = torch.tensor(ours[key], dtype=torch.float64), torch.tensor(theirs[key], dtype=torch.float64)
                assert ((a - b).abs() <= 10 * tolerance * b.abs().clamp(min=1.0)).all(), (rank, key)
    changed = load_file(f"{out}.0")
    start = dict(load_causal_lm(path, "float32", "cpu").named_parameters())
    assert any(not torch.equal(changed[n], start[n]) for n in start)


def test_sharded_state_resumes_on_one_rank(tmp_path):
    """The full state gathered from 2 FSDP ranks, loaded on 1 unsharded rank, trains on like the 1-rank
    learner that never stopped."""
    out = str(tmp_path / "rank")
    path, batch = batch_and_path()
    torch.save((path, batch), f"{out}.batch")
    mp.start_processes(rank_main, args=(out, True), nprocs=2, start_method="spawn", join=True)
    resumed = make_learner(path)
    resumed.load_full_state(load_file(f"{out}.0"), torch.load(f"{out}.0.optimizer"))
    straight = make_learner(path)
    train(straight, batch)
    assert resumed.optimizer.state_dict()["state"].keys() == straight.optimizer.state_dict()["state"].keys()
    after_resumed, after_straight = train(resumed, batch, (SETTINGS,)), train(straight, batch, (SETTINGS,))
    assert abs(after_resumed[0]["loss"] - after_straight[0]["loss"]) <= 1e-4 * max(1.0, abs(after_straight[0]["loss"]))
    for (name, a), (_, b) in zip(resumed.model.named_parameters(), straight.model.named_parameters()):
        if not name.endswith("k_proj.bias"):
            assert torch.allclose(a, b, atol=3e-5, rtol=0), name
