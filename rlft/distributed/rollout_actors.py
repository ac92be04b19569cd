"""Rollout workers as Ray actors: each RolloutActor holds the engine its factory builds (HF or vLLM, as the
rollout option says); RemoteEngine is the driver's rlft.types.RolloutEngine over them.

A step's prompts are split between the workers and their rollouts joined in order. Weights arrive by
broadcast from learner rank 0 (RemoteLearner.push_weights) and each worker hands them to its engine.
A worker that dies is replaced by a fresh actor (hardware.max_rollout_restarts per call): it gets the
current weights and every worker's sampling state from before the failed call, so the retried call
samples what the failed one would have.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Callable, Iterable

import torch

from rlft.distributed.placement import ActorLost, ActorSetup, actor_options, prepare_actor_process, wait_all
from rlft.distributed.ranks import rank_rows
from rlft.errors import WorkerDied
from rlft.types import Rollout, SamplingParams

# Test hooks: the first incarnation of rollout worker RLFT_FAULT_ROLLOUT_WORKER (default 0) exits at its
# generate call number RLFT_FAULT_ROLLOUT_EXIT_AT_CALL (the held-out evaluation at step 0 is call 1), or
# at its weight sync number RLFT_FAULT_ROLLOUT_EXIT_AT_SYNC, as a crashed or preempted actor would.
FAULT_CALL = "RLFT_FAULT_ROLLOUT_EXIT_AT_CALL"
FAULT_SYNC = "RLFT_FAULT_ROLLOUT_EXIT_AT_SYNC"
FAULT_WORKER = "RLFT_FAULT_ROLLOUT_WORKER"


class RolloutActor:
    def __init__(self, setup: ActorSetup, make_engine: Callable, index: int, incarnation: int):
        prepare_actor_process(setup.threads)
        self.device = str(setup.hardware.device)
        self.index, self.incarnation, self.calls, self.syncs = index, incarnation, 0, 0
        # worker 0 samples with the run's seed, as the one engine of hardware=cpu does
        self.engine = make_engine(seed=setup.seed + index)
        self.receiver = None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> tuple[Rollout, torch.Tensor]:
        self.calls += 1
        self._fault_hook(FAULT_CALL, self.calls)
        return self.engine.generate(prompts, params), self.engine.rng_state()

    def _fault_hook(self, variable: str, count: int) -> None:
        if (self.incarnation == 0 and os.environ.get(variable) == str(count)
                and int(os.environ.get(FAULT_WORKER, "0")) == self.index):
            os._exit(1)

    def rng_state(self) -> torch.Tensor:
        return self.engine.rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.engine.set_rng_state(state)

    def join_sync_group(self, host: str, port: int, rank: int, world: int, bucket_bytes: int) -> None:
        from rlft.distributed.broadcast import join_broadcast
        self.receiver = join_broadcast(host, port, rank, world, self.device, bucket_bytes)

    def receive_weights(self) -> int:
        self.syncs += 1
        self._fault_hook(FAULT_SYNC, self.syncs)
        # all buckets first: vLLM's in-place reload expects one complete set of weights
        received: list[tuple[str, torch.Tensor]] = []
        self.receiver.receive(received.extend)
        self.engine.update_weights(received)
        return len(received)

    def sleep(self) -> None:
        self.engine.sleep()


class RemoteEngine:
    """A RolloutEngine whose work runs on `hardware.rollout_workers` actors."""

    def __init__(self, setup: ActorSetup, make_engine: Callable, pad_id: int, placement_group, bundles: range,
                 weight_source):
        import ray
        self.setup, self.make_engine, self.placement_group = setup, make_engine, placement_group
        self.pad_id = pad_id
        self.bundles = list(bundles)
        self.actor = ray.remote(RolloutActor)
        self.weight_source = weight_source  # a RemoteLearner: re-sends the weights to a replaced worker
        self.incarnations = [0] * len(self.bundles)
        self.workers = [self._spawn(i) for i in range(len(self.bundles))]
        self.rng_states = self._wait([w.rng_state.remote() for w in self.workers])
        self.version = 0  # changes whenever a worker is replaced: the weight-sync group must be formed anew

    def _spawn(self, index: int):
        options = actor_options(self.setup.hardware, self.placement_group, self.bundles[index],
                                gpus=self.setup.hardware.gpus_per_rollout_worker)
        return self.actor.options(**options).remote(self.setup, self.make_engine, index, self.incarnations[index])

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        shares = [rank_rows(len(prompts), i, len(self.workers)) for i in range(len(self.workers))]
        busy = [i for i, rows in enumerate(shares) if len(rows)]
        for attempt in itertools.count():
            try:
                results = wait_all([self.workers[i].generate.remote(prompts[shares[i].start:shares[i].stop], params)
                                    for i in busy])
                break
            except ActorLost as lost:  # replace() gives up (WorkerDied) past hardware.max_rollout_restarts
                self.replace(busy[lost.index], lost.error, attempt)
        for i, (_, state) in zip(busy, results):
            self.rng_states[i] = state
        return Rollout.concat([rollout for rollout, _ in results], self.pad_id)

    def replace(self, index: int, error: Exception, attempt: int) -> None:
        """A fresh actor for worker `index` with the current weights; every worker back to its sampling
        state of before the failed call."""
        self._respawn([index], error, attempt)
        self.weight_source.push_weights(self)

    def replace_all(self, error: Exception, attempt: int) -> None:
        """After a death during the weight sync: the group is broken for the survivors too, so all go."""
        self._respawn(list(range(len(self.workers))), error, attempt)

    def _respawn(self, indices: list[int], error: Exception, attempt: int) -> None:
        import ray
        limit = self.setup.hardware.max_rollout_restarts
        if attempt >= limit:
            raise WorkerDied(f"rollout workers {indices} died again after {limit} restarts in one call ({error})")
        print(f"rlft: rollout worker died ({type(error).__name__}); starting fresh worker(s) {indices} "
              f"(restart {attempt + 1} of at most {limit} for this call; logs in the run's ray_logs/)",
              file=sys.stderr, flush=True)
        for index in indices:
            ray.kill(self.workers[index])
            self.incarnations[index] += 1
            self.workers[index] = self._spawn(index)
        self._wait([w.set_rng_state.remote(s) for w, s in zip(self.workers, self.rng_states)])
        self.version += 1

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise TypeError("rollout workers on Ray receive weights from the learner ranks: RemoteLearner.push_weights")

    def join_sync_group(self, host: str, port: int, world: int, bucket_bytes: int) -> list:
        return [w.join_sync_group.remote(host, port, 1 + i, world, bucket_bytes) for i, w in enumerate(self.workers)]

    def receive_weights(self) -> list:
        return [w.receive_weights.remote() for w in self.workers]

    def rng_state(self) -> torch.Tensor:
        """Worker 0's state alone when there is one worker (the format of a one-process run), else stacked."""
        return self.rng_states[0] if len(self.rng_states) == 1 else torch.stack(self.rng_states)

    def set_rng_state(self, state: torch.Tensor) -> None:
        states = [state] if state.dim() == 1 else list(state)
        for i, s in enumerate(states[:len(self.workers)]):
            self.rng_states[i] = s
        self._wait([w.set_rng_state.remote(s) for w, s in zip(self.workers, self.rng_states)])

    def sleep(self) -> None:
        self._wait([w.sleep.remote() for w in self.workers])

    def kill(self) -> None:
        import ray
        for worker in self.workers:
            ray.kill(worker)

    def _wait(self, refs: list) -> list:
        try:
            return wait_all(refs)
        except ActorLost as lost:
            raise WorkerDied(f"rollout worker {lost.index} died outside a generate call ({lost.error})") from lost
