import torch

from rlft.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlft.types import TrainerState
from rlft.models.loading import load_causal_lm, resolve_model_path


def trained_model_and_optimizer():
    model = load_causal_lm(resolve_model_path("builtin:tiny-adder"), "float32", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    ids = torch.randint(2, 20, (4, 8))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def saved(model, optimizer):
    return {n: p for n, p in model.named_parameters()}, optimizer.state_dict()


def restore(folder, model, optimizer):
    weights, optimizer_state, trainer_state = load_checkpoint(folder, [n for n, _ in model.named_parameters()])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])
    optimizer.load_state_dict(optimizer_state)
    return trainer_state


def state(step):
    return TrainerState(step=step, sampler_position=7 * step, rollout_rng=torch.Generator().manual_seed(step).get_state(),
                        torch_rng=torch.get_rng_state())


def test_round_trip_restores_model_optimizer_and_state_exactly(tmp_path):
    model, optimizer = trained_model_and_optimizer()
    save_checkpoint(tmp_path, *saved(model, optimizer), state(3), keep=2)
    fresh, fresh_opt = trained_model_and_optimizer()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    restored = restore(latest_checkpoint(tmp_path), fresh, fresh_opt)
    assert restored.step == 3 and restored.sampler_position == 21
    assert torch.equal(restored.rollout_rng, state(3).rollout_rng)
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(a, b), name
    sa, sb = optimizer.state_dict(), fresh_opt.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for index, slots in sa["state"].items():
        for key, value in slots.items():
            assert torch.equal(value, sb["state"][index][key])


def test_latest_points_at_newest_and_old_ones_are_pruned(tmp_path):
    model, optimizer = trained_model_and_optimizer()
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, *saved(model, optimizer), state(step), keep=2)
    assert latest_checkpoint(tmp_path).name == "step_000006"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000004", "step_000006"]


def test_an_interrupted_write_leaves_the_last_checkpoint_usable(tmp_path):
    model, optimizer = trained_model_and_optimizer()
    save_checkpoint(tmp_path, *saved(model, optimizer), state(2), keep=2)
    # A crash while writing step 4: its temporary folder is half written and `latest` was never moved.
    partial = tmp_path / "checkpoints" / ".step_000004.tmp"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"truncated")
    folder = latest_checkpoint(tmp_path)
    assert folder.name == "step_000002"
    assert restore(folder, model, optimizer).step == 2
    save_checkpoint(tmp_path, *saved(model, optimizer), state(4), keep=2)  # the next save cleans it up
    assert not partial.exists() and latest_checkpoint(tmp_path).name == "step_000004"
