"""Partial rollouts: responses continue across weight pushes from their own token ids, every token keeps the
version of the weights that sampled it, no batch holds a token more than k versions old, and the pool is
empty at every checkpoint. A fake engine whose weights are a version number runs the real Collector."""

import random
import threading
import time

import pytest
import torch

from rlft.data.sampler import PromptSampler
from rlft.rollout.collect import Collector
from rlft.types import HeldWeights, Problem, Rollout, SamplingParams, Scores, SyncStats

EOS, PROMPT_LEN, MAX_NEW = 0, 3, 12


class ChunkEngine:
    """Sequences of random length (fixed by their first token); each token's log-prob encodes the version of
    the weights that sampled it, so a test can tell which weights produced every token."""

    def __init__(self, seed: int):
        self.version, self.rng, self.speed = 0, random.Random(seed), random.Random(seed + 1)
        self.calls = []  # per generate call: inputs' response lengths so far

    def update_weights(self, named):
        self.version = int(dict(named)["version"])

    def generate(self, prompts, params):
        time.sleep(self.speed.uniform(0, 0.002))
        rows, ends = [], []
        for ids in prompts:
            response = list(ids[PROMPT_LEN:])
            new = []
            for _ in range(params.max_new_tokens):
                first = (response + new)[0] if response + new else self.rng.randint(1, 99)
                target = 1 + first % MAX_NEW  # the whole response's length, EOS included
                if len(response) + len(new) == target - 1:
                    new.append(EOS)
                    break
                new.append(first if not response + new else self.rng.randint(1, 99))
            rows.append(new)
            ends.append(new[-1] == EOS)
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        logprobs = -(self.version + 1) / 10 * mask.float()
        prompt = torch.ones(len(rows), 1, dtype=torch.long)
        return Rollout(prompt, prompt, ids, mask, logprobs, torch.tensor([not e for e in ends]))


class VersionLearner:
    def __init__(self):
        self.version = 0

    def push_weights(self, engine):
        engine.update_weights([("version", torch.tensor(self.version))])
        return SyncStats(seconds=0.0, bytes=8)

    def snapshot_weights(self):
        return HeldWeights({"version": torch.tensor(self.version)})


def score(problems, completions, lengths):
    n = len(problems)
    return Scores(torch.zeros(n), torch.zeros(n), {})


def collector(engine, k, chunk, sync_point, prompts=4, group=3, score=score, rounds=None):
    problems = [Problem(prompt=str(i), answer="") for i in range(1000)]
    return Collector(engine, PromptSampler(problems, seed=0, shuffle=False), lambda text: [1, int(text), 2],
                     lambda ids: [""] * ids.shape[0], score,
                     SamplingParams(n=group, max_new_tokens=MAX_NEW), pad_id=0, prompts_per_step=prompts,
                     max_staleness=k, sync_point=sync_point, chunk_tokens=chunk,
                     dynamic_sampling=rounds is not None, max_sampling_rounds=rounds or 1)


def versions_from_logprobs(rollout):
    return torch.round(-rollout.logprobs * 10).long() - 1


def run(k, chunk, steps, sync_steps, seed, **options):
    engine, learner, speed = ChunkEngine(seed), VersionLearner(), random.Random(seed + 2)
    c = collector(engine, k, chunk, lambda step: step in sync_steps or step == steps, **options)
    taken = []
    try:
        for step in range(1, steps + 1):
            groups = c.collect(step)
            taken.append(groups)
            if step in sync_steps:
                assert not c.partial.in_flight and not c.partial.finished  # a checkpoint holds no half response
            time.sleep(speed.uniform(0, 0.003))
            learner.version += 1
            c.push_weights(learner)
    finally:
        c.close()
    return taken, c


@pytest.mark.parametrize("k,chunk", [(1, 1), (1, 4), (2, 2), (3, 1), (4, 3)])
def test_tokens_keep_their_versions_and_no_batch_holds_one_older_than_k(k, chunk):
    rng = random.Random(k * 10 + chunk)
    for trial in range(4):
        steps = rng.randint(4, 12)
        sync_steps = {s for s in range(1, steps + 1) if rng.random() < 0.2}
        taken, c = run(k, chunk, steps, sync_steps, seed=trial)
        carried = 0
        for step, groups in enumerate(taken, start=1):
            r = groups.rollout
            sampled = r.model_mask.bool()
            # every token is tagged with the weights that really sampled it
            assert torch.equal(r.versions[sampled], versions_from_logprobs(r)[sampled])
            ages = (step - 1) - r.versions[sampled]
            assert 0 <= int(ages.min()) and int(ages.max()) <= k and groups.staleness == int(ages.max())
            # continued from its own ids: each response has the length its first token fixed, ending in EOS,
            # or was cut at max_new_tokens
            for row in range(r.size):
                ids = r.response_ids[row, :int(r.response_mask[row].sum())].tolist()
                target = 1 + ids[0] % MAX_NEW
                assert (len(ids) == target and ids[-1] == EOS and not r.truncated[row]) or \
                       (len(ids) == MAX_NEW and r.truncated[row]), ids
            assert groups.num_groups >= 4 and r.size == groups.num_groups * 3
            assert abs(sum(groups.staleness_histogram) - 1) < 1e-6
            carried += groups.carried_groups
        assert carried > 0 or chunk >= MAX_NEW  # long responses really spanned collections
        # the schedule is fixed, not left to timing: another run with other speeds takes the same tokens
        again, _ = run(k, chunk, steps, sync_steps, seed=trial)
        assert [g.rollout.response_ids.tolist() for g in again] == [g.rollout.response_ids.tolist() for g in taken]


def test_groups_that_grow_too_old_are_dropped_and_counted():
    # k = 1 with one token per pass: a group still in flight after two collections holds tokens two
    # versions old by the third, and is dropped there
    taken, c = run(1, 1, 10, set(), seed=0)
    assert sum(g.stale_dropped for g in taken) > 0
    assert all(g.staleness <= 1 for g in taken)


def test_a_checkpoint_step_takes_every_group_in_flight():
    taken, c = run(2, 1, 6, {3}, seed=0)
    assert taken[2].num_groups > 4  # step 3 drained the pool into its batch
    assert taken[3].carried_groups == 0 and taken[3].staleness == 0  # step 4 starts afresh from weights 3


def first_right_score(problems, completions, lengths):
    """Every fourth prompt's responses all score 0 (a group with no signal); in the others' groups the first
    response scores 1."""
    first = torch.arange(len(problems)) % 3 == 0
    signal = torch.tensor([int(p.prompt) % 4 != 0 for p in problems])
    return Scores((first & signal).float(), torch.zeros(len(problems)), {})


@pytest.mark.parametrize("k,chunk", [(1, 2), (3, 1)])
def test_dynamic_sampling_drops_equal_groups_from_the_pool_and_tops_it_up(k, chunk):
    taken, c = run(k, chunk, 12, {4}, seed=1, score=first_right_score, rounds=4)
    for step, groups in enumerate(taken, start=1):
        totals = groups.scores.total.view(-1, 3)
        assert bool((totals.max(1).values > totals.min(1).values).all())  # only groups with a signal
        assert all(int(p.prompt) % 4 for p in groups.problems)
        r = groups.rollout
        sampled = r.model_mask.bool()
        assert torch.equal(r.versions[sampled], versions_from_logprobs(r)[sampled])
        assert int(((step - 1) - r.versions[sampled]).max()) <= k
        if step not in (4, 12):  # not a drained checkpoint step: the step's share exactly, rounds allowing
            assert groups.num_groups == 4 or groups.rounds == 4
    assert sum(g.dropped_groups for g in taken) > 0 and max(g.rounds for g in taken) > 1
    assert sum(g.carried_groups for g in taken) > 0
    assert not c.partial.in_flight and not c.partial.finished  # step 12 (the last) drained the pool


def test_steps_that_keep_no_group_still_advance_the_schedule():
    """Dynamic sampling may keep nothing: the trainer then skips the update (Collector.skip_update), and the
    producer, which loads the weights each step is due, must not wait for a version that never comes."""
    engine, learner = ChunkEngine(0), VersionLearner()
    nothing = lambda problems, completions, lengths: Scores(torch.zeros(len(problems)), torch.zeros(len(problems)), {})  # noqa: E731
    c = collector(engine, 3, 2, lambda step: step == 6, score=nothing, rounds=2)
    finished = []

    def steps():
        for step in range(1, 7):
            assert c.collect(step).num_groups == 0
            learner.version += 1
            c.skip_update(learner)
        finished.append(True)

    worker = threading.Thread(target=steps, daemon=True)
    worker.start()
    worker.join(timeout=60)
    c.close()
    assert finished == [True], "the producer waited for weights that never came"
    assert c.learner_version == 6
