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


# --- multi-turn episodes through the pool -------------------------------------------------------------------

def continuing_engine(tokenizer, script):
    """Like test_envs' ScriptedEngine, but continues a turn begun in an earlier pass: the turn's whole text is
    the script's answer to the history before it, and a request gets what is left of it after what the
    request already holds. Each token's log-prob encodes the version of the weights that sampled it."""
    from rlft.rollout.batching import left_pad, right_pad

    class Engine:
        version, requests = 0, []

        def update_weights(self, named):
            self.version = int(dict(named)["version"])

        def generate(self, prompts, params):
            responses, truncated = [], []
            for prompt in prompts:
                self.requests.append(list(prompt))
                text = tokenizer.decode(prompt)
                start = max(text.rfind("</result>") + len("</result>") if "</result>" in text else 0,
                            text.index("=") + 1)
                turn = tokenizer.encode(script(text[:start]), add_special_tokens=False) + [1]
                begun = len(tokenizer.encode(text[start:], add_special_tokens=False))
                rest = turn[begun:]
                truncated.append(len(rest) > params.max_new_tokens)
                responses.append(rest[:params.max_new_tokens])
            prompt_ids, prompt_mask = left_pad(prompts, 0)
            ids, mask = right_pad(responses, 0, torch.long)
            logprobs, _ = right_pad([[-(self.version + 1) / 10] * len(r) for r in responses], 0.0, torch.float32)
            return Rollout(prompt_ids, prompt_mask, ids, mask, logprobs, torch.tensor(truncated))

    return Engine()


@pytest.mark.parametrize("k,chunk", [(1, 3), (2, 2)])
def test_episodes_continue_their_turns_across_weight_pushes_token_for_token(k, chunk):
    """Partial rollouts of multi-turn episodes: a turn cut by the chunk goes on in a later pass (or collection)
    from its own ids; the episode is the one an unchunked run gives, tool output included; every sampled id
    keeps the version that sampled it, observations are never trained on, and no batch is older than k."""
    from test_envs import PROBLEMS, Config, calculator_script, char_tokenizer

    from rlft.envs import EpisodeSetup

    tokenizer = char_tokenizer()
    problems = [PROBLEMS[i % 2] for i in range(40)]
    reference_engine = continuing_engine(tokenizer, calculator_script)
    reference = EpisodeSetup(Config, tokenizer).runner(reference_engine)
    engine, learner = continuing_engine(tokenizer, calculator_script), VersionLearner()
    runner = EpisodeSetup(Config, tokenizer).runner(engine)
    right = lambda problems, completions, lengths: Scores(  # noqa: E731
        torch.tensor([c == p.answer for p, c in zip(problems, completions)]).float(), torch.zeros(len(problems)), {})
    steps = 6
    c = Collector(engine, PromptSampler(problems, seed=0, shuffle=False), lambda text: tokenizer.encode(text),
                  lambda ids: [""] * ids.shape[0], right, SamplingParams(n=2, max_new_tokens=24), pad_id=0,
                  prompts_per_step=2, max_staleness=k, sync_point=lambda step: step == steps, chunk_tokens=chunk,
                  episodes=runner)
    carried = 0
    try:
        expected = reference.run(PROBLEMS, SamplingParams(n=1, max_new_tokens=24))
        for step in range(1, steps + 1):
            groups = c.collect(step)
            r = groups.rollout
            sampled = r.model_mask.bool()
            assert torch.equal(r.versions[sampled], versions_from_logprobs(r)[sampled])
            assert int(((step - 1) - r.versions[sampled]).max()) <= k
            assert torch.equal(r.logprobs != 0, sampled)  # observation ids: context, no log-prob, no loss
            for row, problem in enumerate(p for p in groups.problems for _ in range(2)):
                want = expected.rollout.select([PROBLEMS.index(problem)])
                width = int(want.response_mask.sum())
                assert r.response_ids[row, :width].tolist() == want.response_ids[0, :width].tolist()
                assert r.sampled_mask[row, :width].tolist() == want.sampled_mask[0, :width].tolist()
                assert int(r.response_mask[row].sum()) == width
            assert groups.scores.total.tolist() == [1.0] * r.size  # scored on the final turn's text
            assert groups.episodes.cut == ["done"] * r.size and groups.episodes.turns.tolist() == [2] * r.size
            carried += groups.carried_groups
            learner.version += 1
            c.push_weights(learner)
        assert carried > 0  # turns really spanned collections
        assert not c.partial.in_flight and not c.partial.finished  # the last step drained the pool
        # the engine continued each turn from the sequence so far: some requests end inside a model turn
        assert any(not tokenizer.decode(q).endswith(("=", "</result>")) for q in engine.requests)
    finally:
        c.close()
        reference.runner.close()


# --- routing replay from the engine (R3) with partial rollouts --------------------------------------------

def test_partial_rollouts_keep_the_routes_of_each_sequences_latest_pass():
    """A real MoE engine generating in chunks of 2 with its routers moved between collections: every token of
    a finished sequence (but the last, never fed) carries the experts a full forward pass under the final
    weights picks, which the last pass's prefill recomputed."""
    from test_routing import RouterTap, nudge_routers, qwen3_moe

    from rlft.rollout.hf_engine import HFEngine
    from rlft.rollout.partial import PartialRollouts

    model = qwen3_moe()
    engine = HFEngine(model, pad_id=0, eos_ids=[1], seed=0, return_routes=True)
    pool = PartialRollouts(engine, lambda text: [int(t) for t in text.split()],
                           SamplingParams(n=2, temperature=1.0, max_new_tokens=8), chunk_tokens=2, pad_id=0)
    problems = [Problem(prompt=" ".join(str(2 + (7 * i + j) % 29) for j in range(2 + i % 4)), answer="")
                for i in range(12)]
    sampler = PromptSampler(problems, seed=0, shuffle=False)
    for step in range(1, 20):  # until a collection leaves a group in flight
        first = pool.collect(sampler, 2, step=step, version=0, oldest_allowed=0, drain=False)
        if pool.in_flight:
            break
    assert pool.in_flight and first.rollout.routes is not None
    nudge_routers(model, scale=2.0)
    second = pool.collect(sampler, 2, step=step + 1, version=1, oldest_allowed=0, drain=True)
    assert any(second.carried)
    r = second.rollout
    ids = torch.cat([r.prompt_ids, r.response_ids], 1)
    mask = torch.cat([r.prompt_mask, r.response_mask], 1)

    def routes_of_a_full_pass(weights):
        tap = RouterTap(weights)
        tap.begin(0, mask, record=True, replay=False, compare=False)
        with torch.no_grad():
            weights(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        return torch.stack([tap.recorded[0][layer] for layer in range(2)], 1).view(r.size, ids.shape[1], 2, 2)

    # each row's last pass ran under the weights of its newest token (a carried group's other rows may have
    # finished under the old ones)
    latest = r.versions.max(1).values.bool()
    assert latest.any() and ((r.versions == 0) & r.response_mask.bool())[latest].any()  # and older tokens
    full = torch.where(latest[:, None, None, None], routes_of_a_full_pass(model), routes_of_a_full_pass(qwen3_moe()))
    scored = mask.clone()
    scored[torch.arange(r.size), r.prompt_ids.shape[1] + r.response_mask.sum(-1) - 1] = 0
    same = (r.routes.long().sort(-1).values == full.sort(-1).values).all(-1).all(-1)
    assert r.routes.shape[:2] == ids.shape and same[scored.bool()].all()
    assert (r.routes[~scored.bool()] == 0).all()  # padding and each last token: expert 0


def test_a_response_the_engine_stops_short_is_finished_not_asked_again():
    """An engine stopping every request after 1 token of a 3-token chunk, truncated (vLLM at its context
    limit): each response is finished, cut, in the first pass, instead of being sent back forever."""
    class Short(ChunkEngine):
        def generate(self, prompts, params):
            out = super().generate(prompts, SamplingParams(n=1, max_new_tokens=1))
            return Rollout(out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask, out.logprobs,
                           torch.ones(len(prompts), dtype=torch.bool))

    c = collector(Short(0), 1, 3, lambda step: False)
    try:
        groups = c.collect(1)
    finally:
        c.close()
    assert groups.passes == 1 and groups.rollout.truncated.all()
    assert groups.rollout.response_mask.sum(-1).tolist() == [1] * groups.rollout.size
