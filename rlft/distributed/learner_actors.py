"""The learner as Ray actors: one LearnerActor per rank, each holding the learner its factory builds (a
rlft.learner.local.LocalLearner), the ranks forming a torch.distributed group; RemoteLearner is the
driver's rlft.types.Learner over them.

Trajectories go into the Ray object store once (`ray.put`) and every rank reads them from there; weights
leave from rank 0 by broadcast to the rollout workers (RemoteLearner.push_weights).
"""

from __future__ import annotations

import datetime
import itertools
import os
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from rlft.distributed.broadcast import free_port, join_broadcast
from rlft.distributed.placement import (ActorLost, ActorSetup, actor_options, dead_actors, prepare_actor_process,
                                        wait_all)
from rlft.distributed.ranks import rank_rows
from rlft.errors import WorkerDied
from rlft.types import HeldWeights, LossSettings, Rollout, SyncStats, TrainBatch, TrainerState, UpdateStats

# Test hook: the learner rank RLFT_FAULT_LEARNER_RANK (default 0) exits at its update call number
# RLFT_FAULT_LEARNER_EXIT_AT_UPDATE, as a crashed or preempted rank would.
FAULT_UPDATE = "RLFT_FAULT_LEARNER_EXIT_AT_UPDATE"
FAULT_RANK = "RLFT_FAULT_LEARNER_RANK"


class LearnerActor:
    def __init__(self, setup: ActorSetup, make_learner: Callable, rank: int, world: int):
        prepare_actor_process(setup.threads)
        torch.manual_seed(setup.seed)
        self.make_learner, self.rank, self.world = make_learner, rank, world
        self.device = str(setup.hardware.device)
        self.updates = 0
        self.broadcaster = None
        self.kept: dict[int, HeldWeights] = {}  # rank 0: weights versions kept for the engine (max_staleness >= 2)

    def free_address(self) -> tuple[str, int]:
        """This node's address and a free port on it, for a group's store."""
        import ray
        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def setup(self, host: str, port: int) -> None:
        """Join the learner group (rank 0 hosts it) and load the policy; every rank at once."""
        group = None
        if self.world > 1:
            if self.device == "cuda":
                torch.cuda.set_device(0)  # Ray shows each rank its own GPU as cuda:0
            dist.init_process_group("nccl" if self.device == "cuda" else "gloo", init_method=f"tcp://{host}:{port}",
                                    rank=self.rank, world_size=self.world, timeout=datetime.timedelta(minutes=10))
            group = dist.group.WORLD
        self.worker = self.make_learner(group)

    def update(self, batch: TrainBatch, loss: LossSettings, lr: float) -> UpdateStats:
        self.updates += 1
        if os.environ.get(FAULT_UPDATE) == str(self.updates) and int(os.environ.get(FAULT_RANK, "0")) == self.rank:
            os._exit(1)
        return self.worker.update(batch, loss, lr)

    def reference_logprobs(self, rollout: Rollout, rows: range) -> torch.Tensor | None:
        return self.worker.reference_logprobs(rollout, rows)

    def has_reference(self) -> bool:
        return self.worker.reference is not None

    def peak_memory_mb(self) -> float:
        return self.worker.peak_memory_mb()

    def join_sync_group(self, host: str, port: int, world: int, bucket_bytes: int) -> None:
        self.broadcaster = join_broadcast(host, port, 0, world, self.device, bucket_bytes)

    def send_weights(self) -> SyncStats | None:
        """Every rank takes part in gathering the weights (FSDP); rank 0 broadcasts them."""
        weights = self.worker.rollout_weights()
        if self.rank == 0:
            return self.broadcaster.send(weights.items())
        return None

    def keep_weights(self, key: int) -> int:
        """Every rank takes part in gathering the weights (FSDP); rank 0 keeps a copy under `key`. Its bytes
        (0 elsewhere)."""
        if self.rank != 0:
            self.worker.rollout_weights()
            return 0
        self.kept[key] = self.worker.snapshot_weights()
        return self.kept[key].bytes

    def send_kept_weights(self, key: int) -> SyncStats:
        """Rank 0 broadcasts the copy kept under `key`."""
        return self.broadcaster.send(self.kept[key].weights.items())

    def drop_kept_weights(self, key: int) -> None:
        self.kept.pop(key, None)

    def save_checkpoint(self, run_dir: Path, state: TrainerState, keep: int) -> None:
        self.worker.save_checkpoint(run_dir, state, keep)

    def load_checkpoint(self, folder: Path) -> TrainerState:
        return self.worker.load_checkpoint(folder)

    def save_model(self, folder: Path) -> None:
        self.worker.save_model(folder)


@dataclass
class KeptWeights:
    """A WeightsCopy held by learner rank 0 (RemoteLearner.snapshot_weights)."""

    learner: RemoteLearner
    key: int
    bytes: int

    def load_into(self, engine) -> None:
        self.learner._push(engine, lambda: [self.learner.ranks[0].send_kept_weights.remote(self.key)])

    def release(self) -> None:
        self.learner.ranks[0].drop_kept_weights.remote(self.key)  # nothing waits on it


class RemoteLearner:
    """The driver's side: the learner's methods, each run on every rank."""

    def __init__(self, setup: ActorSetup, make_learner: Callable, placement_group, bundles: range):
        import ray
        self.setup = setup
        actor = ray.remote(LearnerActor)
        world = len(bundles)
        self.ranks = [actor.options(**actor_options(setup.hardware, placement_group, bundle, gpus=1)).remote(
            setup, make_learner, rank, world) for rank, bundle in enumerate(bundles)]
        host, port = self._on_rank0("free_address")
        self._on_all("setup", host, port)
        self.has_reference = self._on_rank0("has_reference")  # kl_coef = 0 loads none: no call for nothing
        self.synced_engine_version = None  # the rollout workers' group is formed at the first push
        self.copies = itertools.count()  # keys of the weights copies rank 0 keeps

    def update(self, batch: TrainBatch, loss: LossSettings, lr: float) -> UpdateStats:
        import ray
        batch_ref = ray.put(batch)  # once into the object store; every rank reads the same copy
        return self._on_all("update", batch_ref, loss, lr)[0]  # already reduced over the ranks

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        import ray
        if not self.has_reference:
            return None
        rollout_ref = ray.put(rollout)
        parts = self._wait([rank.reference_logprobs.remote(rollout_ref, rank_rows(rollout.size, i, len(self.ranks)))
                            for i, rank in enumerate(self.ranks)])
        return torch.cat(parts)

    def peak_memory_mb(self) -> float:
        return max(self._on_all("peak_memory_mb"))

    def push_weights(self, engine) -> SyncStats:
        """Learner rank 0 -> every rollout worker, by broadcast. A rollout worker that dies on the way breaks
        the group for all: every worker is replaced (RemoteEngine.replace_all) and the push repeated."""
        return self._push(engine, lambda: [rank.send_weights.remote() for rank in self.ranks])

    def snapshot_weights(self) -> KeptWeights:
        """This version's weights, kept on rank 0 (on its device, as the in-process learner keeps them) until
        the engine takes them (Collector, max_staleness >= 2)."""
        key = next(self.copies)
        return KeptWeights(self, key, self._on_all("keep_weights", key)[0])

    def _push(self, engine, send: Callable[[], list]) -> SyncStats:
        import ray
        start = time.perf_counter()
        restarts = self.setup.hardware.max_rollout_restarts
        for attempt in range(restarts + 1):
            try:
                if self.synced_engine_version != engine.version:  # new workers: a new group
                    self._form_sync_group(engine)
                receiving = engine.receive_weights()
                results = wait_all(receiving + send())
                return SyncStats(seconds=time.perf_counter() - start, bytes=results[len(receiving)].bytes)
            except (ActorLost, ray.exceptions.RayTaskError) as err:
                # rank 0's broadcast may fail before the dead peer is reported: look at who is gone
                lost_ranks = dead_actors(self.ranks)
                if lost_ranks:
                    raise self._died(lost_ranks[0], err) from err
                if not dead_actors(engine.workers):
                    raise
                engine.replace_all(err, attempt)
        raise WorkerDied(f"the weight sync failed after {restarts} rollout worker restarts")

    def _form_sync_group(self, engine) -> None:
        host, port = self._on_rank0("free_address")
        world = 1 + len(engine.workers)
        bucket_bytes = self.setup.bucket_bytes
        joining = engine.join_sync_group(host, port, world, bucket_bytes)
        wait_all(joining + [self.ranks[0].join_sync_group.remote(host, port, world, bucket_bytes)])
        self.synced_engine_version = engine.version

    def save_checkpoint(self, run_dir: Path, state: TrainerState, keep: int) -> None:
        self._on_all("save_checkpoint", run_dir, state, keep)

    def load_checkpoint(self, folder: Path) -> TrainerState:
        return self._on_all("load_checkpoint", folder)[0]

    def save_model(self, folder: Path) -> None:
        self._on_all("save_model", folder)

    def kill(self) -> None:
        import ray
        for rank in self.ranks:
            ray.kill(rank)

    def _on_all(self, method: str, *args) -> list:
        return self._wait([getattr(rank, method).remote(*args) for rank in self.ranks])

    def _on_rank0(self, method: str, *args):
        return self._wait([getattr(self.ranks[0], method).remote(*args)])[0]

    def _wait(self, refs: list) -> list:
        try:
            return wait_all(refs)
        except ActorLost as lost:
            raise self._died(lost.index, lost.error) from lost

    def _died(self, rank: int, error: Exception) -> WorkerDied:
        return WorkerDied(f"learner rank {rank} of {len(self.ranks)} died ({type(error).__name__}); its output is "
                          f"in the run directory's ray_logs/ (worker-*.err)")
