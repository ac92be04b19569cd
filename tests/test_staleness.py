"""rollout.max_staleness = k: which weights generate which batch is fixed by the schedule, not by timing, and
no batch the learner takes is more than k versions old. A fake engine and learner whose weights are just
their version number run the Collector's producer with random generation and training times."""

import random
import threading
import time

import pytest
import torch

from rlft.rollout.collect import Collector
from rlft.types import HeldWeights, ScoredGroups, SyncStats


class VersionEngine:
    """Its 'weights' are the learner version they came from; generating records what it held."""

    def __init__(self, speed: random.Random):
        self.version, self.speed, self.generating = 0, speed, threading.Lock()
        self.updates_while_generating = 0

    def update_weights(self, named):
        if self.generating.locked():
            self.updates_while_generating += 1
        self.version = int(dict(named)["version"])


class VersionLearner:
    def __init__(self):
        self.version = 0

    def train(self, speed: random.Random):
        time.sleep(speed.uniform(0, 0.004))
        self.version += 1

    def push_weights(self, engine):
        engine.update_weights([("version", torch.tensor(self.version))])
        return SyncStats(seconds=0.0, bytes=8)

    def snapshot_weights(self):
        return HeldWeights({"version": torch.tensor(self.version)})


class FakeCollector(Collector):
    def __init__(self, engine, k, sync_point, start=0):
        super().__init__(engine, sampler=None, encode=None, decode=None, score=None, sampling=None, pad_id=0,
                         prompts_per_step=1, max_staleness=k, sync_point=sync_point, weights_version=start)
        self.generated = []  # (the version the engine held, the version the batch is tagged with)

    def _collect(self, step, weights_version):
        with self.engine.generating:
            time.sleep(self.engine.speed.uniform(0, 0.004))
            self.generated.append((self.engine.version, weights_version))
        return ScoredGroups(problems=[], rollout=None, scores=None, rewards=None, weights_version=weights_version)


def run(k: int, steps: int, sync_steps: set[int], seed: int, evals: set[int] = frozenset()):
    speed = random.Random(seed)
    engine, learner = VersionEngine(speed), VersionLearner()
    collector = FakeCollector(engine, k, lambda step: step in sync_steps or step == steps)  # as the trainer's
    taken = []
    try:
        for step in range(1, steps + 1):
            groups = collector.collect(step)
            taken.append((groups.weights_version, groups.staleness))
            learner.train(speed)
            collector.push_weights(learner)
            if step in evals:
                collector.catch_up(learner)
                assert engine.version == learner.version  # an evaluation scores the current policy
    finally:
        collector.close()
    return taken, collector.generated, engine


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_staleness_never_exceeds_k_and_the_schedule_does_not_depend_on_speed(k):
    rng = random.Random(k)
    for trial in range(6):
        steps = rng.randint(5, 25)
        sync_steps = {s for s in range(1, steps + 1) if rng.random() < 0.15}
        evals = {s for s in range(1, steps + 1) if rng.random() < 0.15}
        taken, generated, engine = run(k, steps, sync_steps, seed=trial, evals=evals)
        assert all(0 <= staleness <= k for _, staleness in taken), taken
        # the engine really held the weights each batch is tagged with, and never took weights mid-batch
        assert all(held == tagged for held, tagged in generated) and engine.updates_while_generating == 0
        assert len(generated) == steps  # nothing collected past the last step the learner took
        # another run with other random speeds takes the same versions at every step
        again, _, _ = run(k, steps, sync_steps, seed=100 + trial, evals=evals)
        assert again == taken
        if k and not sync_steps and not evals and steps > k + 1:
            # in steady state the producer runs exactly k versions behind
            assert [staleness for _, staleness in taken][k + 1:] == [k] * (steps - k - 1)


def test_nothing_is_collected_across_a_sync_point():
    """A checkpoint at step 4: step 5's batch is generated after the push of step 4's weights."""
    taken, _, _ = run(k=3, steps=8, sync_steps={4}, seed=0)
    versions = [version for version, _ in taken]
    assert versions[4] == 4 and [s for _, s in taken][4] == 0
    assert versions == [0, 0, 0, 0, 4, 4, 4, 4]


def test_a_producer_waiting_for_weights_gives_up_when_the_run_closes():
    engine = VersionEngine(random.Random(0))
    collector = FakeCollector(engine, 2, lambda step: False)
    collector.collect(1)  # batches 2 and 3 queued; 3 waits for version 0... and 4 would wait for version 1
    collector.collect(2)
    collector.collect(3)  # batch 4 and 5 queued: batch 4 needs version 1, which never comes
    start = time.monotonic()
    collector.close()
    assert time.monotonic() - start < 5
