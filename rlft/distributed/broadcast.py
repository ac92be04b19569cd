"""Learner -> rollout weight transfer over a torch.distributed group (NCCL on GPUs, gloo on CPU).

The group is its own: learner rank 0 plus the rollout workers, apart from the learner's and vLLM's own
default groups (each process may already have one). Rank `src` sends; every other rank receives.
Tensors travel in buckets of at most `bucket_bytes`: each bucket is one flat tensor of one dtype, so a
step costs a few large broadcasts instead of one per parameter, and peak extra memory is one bucket.
"""

from __future__ import annotations

import datetime
import pickle
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.distributed as dist

from rlft.types import SyncStats

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of `specs` per bucket: consecutive tensors of one dtype, up to bucket_bytes each
    (a tensor larger than a bucket travels alone)."""
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for index, spec in enumerate(specs):
        if not buckets or spec.dtype != dtype or size + spec.nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, spec.dtype
        buckets[-1].append(index)
        size += spec.nbytes
    return buckets


def open_sync_group(host: str, port: int, rank: int, world_size: int, backend: str,
                    timeout_s: float = 300.0) -> dist.ProcessGroup:
    """A process group of its own (rank 0 hosts the store at host:port), usable next to any default
    group the process has; every rank must call it. backend: "gloo" or "nccl"."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore("rlft-weight-sync", dist.TCPStore(host, port, world_size, is_master=rank == 0,
                                                               timeout=timeout))
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    raise ValueError(f"weight sync backend must be gloo or nccl, not {backend!r}")


def free_port(host: str) -> int:
    """A TCP port free now on `host`, for a group's store."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def join_broadcast(host: str, port: int, rank: int, world_size: int, device: str, bucket_bytes: int
                   ) -> "WeightBroadcaster":
    """open_sync_group with the backend the device needs (NCCL for cuda, gloo for cpu), sender rank 0."""
    group = open_sync_group(host, port, rank, world_size, "nccl" if str(device).startswith("cuda") else "gloo")
    return WeightBroadcaster(group, src=0, bucket_bytes=bucket_bytes, device=device)


class WeightBroadcaster:
    """`group`: a group from open_sync_group, or any torch.distributed ProcessGroup (e.g. the default
    one, dist.group.WORLD); `src` is the sender's rank in it; `device` where buckets live (cuda for NCCL)."""

    def __init__(self, group: dist.ProcessGroup, src: int = 0, bucket_bytes: int = 256 * 2 ** 20,
                 device: str | torch.device = "cpu"):
        self.group, self.src, self.bucket_bytes, self.device = group, src, bucket_bytes, torch.device(device)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> SyncStats:
        """On rank `src`: broadcast names, shapes and dtypes, then the tensors bucket by bucket."""
        start = time.perf_counter()
        tensors = [(name, t.detach()) for name, t in named_tensors]
        specs = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in tensors]
        header = torch.frombuffer(bytearray(pickle.dumps(specs)), dtype=torch.uint8)
        self._broadcast(torch.tensor([header.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(header.to(self.device))
        for bucket in plan_buckets(specs, self.bucket_bytes):
            self._broadcast(torch.cat([tensors[i][1].reshape(-1) for i in bucket]).to(self.device))
        return SyncStats(seconds=time.perf_counter() - start, bytes=sum(s.nbytes for s in specs))

    def receive(self, apply: Callable[[NamedTensors], None]) -> SyncStats:
        """On the other ranks: receive every bucket and hand its (name, tensor) pairs to `apply`."""
        start = time.perf_counter()
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(length)
        header = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(header)
        specs: list[TensorSpec] = pickle.loads(header.cpu().numpy().tobytes())
        for bucket in plan_buckets(specs, self.bucket_bytes):
            flat = torch.empty(sum(specs[i].numel for i in bucket), dtype=specs[bucket[0]].dtype, device=self.device)
            self._broadcast(flat)
            pieces = flat.split([specs[i].numel for i in bucket])
            apply([(specs[i].name, piece.view(specs[i].shape)) for i, piece in zip(bucket, pieces)])
        return SyncStats(seconds=time.perf_counter() - start, bytes=sum(s.nbytes for s in specs))

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = self.src
        self.group.broadcast([tensor], options).wait()
