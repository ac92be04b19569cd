"""The bucketed broadcast moves every tensor exactly, between two real processes over gloo."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import free_port
from safetensors.torch import load_file, save_file

from rlft.distributed.broadcast import TensorSpec, WeightBroadcaster, open_sync_group, plan_buckets


def weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(50, 16, generator=gen),
        "layer.0.weight": torch.randn(16, 16, generator=gen),
        "layer.0.bias": torch.randn(16, generator=gen).to(torch.bfloat16),
        "layer.1.weight": torch.randn(16, 16, generator=gen).to(torch.bfloat16),
        "step": torch.tensor([7], dtype=torch.int64),
        "big.weight": torch.randn(64, 64, generator=gen),  # larger than a bucket: travels alone
    }


def worker(rank: int, port: int, out: str) -> None:
    # Each process already has a default group (as learner ranks and vLLM workers do); the sync group
    # is a second one beside it.
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=2)
    group = open_sync_group("127.0.0.1", port, rank, world_size=2, backend="gloo", timeout_s=60)
    broadcaster = WeightBroadcaster(group, src=0, bucket_bytes=4096)
    for seed in (1, 2):  # two syncs in a row, as two training steps would
        if rank == 0:
            broadcaster.send(weights(seed).items())
        else:
            received = {}
            stats = broadcaster.receive(lambda pairs: received.update((n, t.clone()) for n, t in pairs))
            save_file(received, f"{out}.{seed}")
            assert stats.bytes == sum(t.numel() * t.element_size() for t in weights(seed).values())
    dist.destroy_process_group()


def test_two_process_broadcast_is_bitwise_exact(tmp_path):
    out = str(tmp_path / "received.safetensors")
    for attempt in range(3):  # the sync group's store needs a TCP port: another process may take it first
        Path(f"{out}.store").unlink(missing_ok=True)  # a failed try's file store
        try:
            mp.start_processes(worker, args=(free_port(), out), nprocs=2, start_method="spawn", join=True)
            break
        except mp.ProcessRaisedException as err:
            if "address already in use" not in str(err).lower() or attempt == 2:
                raise
    for seed in (1, 2):
        received, sent = load_file(f"{out}.{seed}"), weights(seed)
        assert received.keys() == sent.keys()
        for name, tensor in sent.items():
            assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="gloo or nccl"):
        open_sync_group("127.0.0.1", free_port(), 0, world_size=1, backend="mpi", timeout_s=5)


def test_buckets_hold_one_dtype_and_respect_the_size():
    specs = [TensorSpec("a", (256,), torch.float32), TensorSpec("b", (256,), torch.float32),
             TensorSpec("c", (8,), torch.bfloat16), TensorSpec("d", (2048,), torch.float32),
             TensorSpec("e", (4,), torch.float32)]
    assert plan_buckets(specs, bucket_bytes=2048) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(specs, bucket_bytes=1024) == [[0], [1], [2], [3], [4]]
