"""Learner -> rollout weight transfer over a torch.distributed group (NCCL on GPUs, gloo on CPU).

Rank `src` (learner rank 0) sends; every other rank in the group receives. Tensors travel in buckets
of at most `bucket_bytes`: each bucket is one flat tensor of one dtype, so a step costs a few large
broadcasts instead of one per parameter, and peak extra memory is one bucket.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.distributed as dist

from rlft.sync import SyncStats

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


class WeightBroadcaster:
    def __init__(self, src: int = 0, group: dist.ProcessGroup | None = None, bucket_bytes: int = 256 * 2 ** 20,
                 device: str | torch.device = "cpu"):
        self.src, self.group, self.bucket_bytes, self.device = src, group, bucket_bytes, torch.device(device)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> SyncStats:
        """On rank `src`: broadcast names, shapes and dtypes, then the tensors bucket by bucket."""
        start = time.perf_counter()
        tensors = [(name, t.detach()) for name, t in named_tensors]
        specs = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in tensors]
        dist.broadcast_object_list([specs], src=self.src, group=self.group)
        for bucket in plan_buckets(specs, self.bucket_bytes):
            flat = torch.cat([tensors[i][1].reshape(-1) for i in bucket]).to(self.device)
            dist.broadcast(flat, src=self.src, group=self.group)
        return SyncStats(seconds=time.perf_counter() - start, bytes=sum(s.nbytes for s in specs))

    def receive(self, apply: Callable[[NamedTensors], None]) -> SyncStats:
        """On the other ranks: receive every bucket and hand its (name, tensor) pairs to `apply`."""
        start = time.perf_counter()
        holder: list = [None]
        dist.broadcast_object_list(holder, src=self.src, group=self.group)
        specs: list[TensorSpec] = holder[0]
        for bucket in plan_buckets(specs, self.bucket_bytes):
            flat = torch.empty(sum(specs[i].numel for i in bucket), dtype=specs[bucket[0]].dtype, device=self.device)
            dist.broadcast(flat, src=self.src, group=self.group)
            pieces = flat.split([specs[i].numel for i in bucket])
            apply([(specs[i].name, piece.view(specs[i].shape)) for i, piece in zip(bucket, pieces)])
        return SyncStats(seconds=time.perf_counter() - start, bytes=sum(s.nbytes for s in specs))
