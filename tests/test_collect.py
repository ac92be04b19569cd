"""Phases 1-3 with DAPO's dynamic sampling, on the real engine with rewards that make some groups all-equal."""

import pytest
import torch

from rlft.algos.shaping import mixed_groups
from rlft.data.arithmetic import split_problems
from rlft.data.sampler import PromptSampler
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlft.rollout.collect import Collector, Overlong
from rlft.rollout.hf_engine import HFEngine
from rlft.types import SamplingParams, Scores

PATH = resolve_model_path("builtin:tiny-adder")
TOKENIZER = load_tokenizer(PATH)


def first_operand_is_even(prompt):
    return int(prompt.split("+")[0]) % 2 == 0


def half_constant_reward(prompts, completions, answers):
    """Groups of prompts with an even first operand all score 1 (no gradient); the rest score by length."""
    return [1.0 if first_operand_is_even(p) else float(len(c) % 2) for p, c in zip(prompts, completions)]


def as_score_fn(rewards):
    """A ScoreFn from (prompts, completions, answers) -> rewards; correct = reward 1."""
    def score(problems, completions, response_tokens):
        total = torch.tensor(rewards([p.prompt for p in problems], completions, [p.answer for p in problems]))
        return Scores(total=total, correct=(total >= 1).float(), parts={"test": total}, errors=0)
    return score


def collect(score, prompts_per_step=6, rounds=3, dynamic=True, overlong=None, seed=0):
    problems, _ = split_problems(10, 99, 500, 0)
    sampler = PromptSampler(problems, seed=seed)
    engine = HFEngine(load_causal_lm(PATH, "float32", "cpu"), TOKENIZER.pad_token_id, [TOKENIZER.eos_token_id], seed)
    collector = Collector(engine, sampler, TOKENIZER.encode,
                          lambda ids: TOKENIZER.batch_decode(ids, skip_special_tokens=True), as_score_fn(score),
                          SamplingParams(n=4, temperature=1.0, max_new_tokens=6), TOKENIZER.pad_token_id,
                          prompts_per_step=prompts_per_step, dynamic_sampling=dynamic, max_sampling_rounds=rounds,
                          overlong=overlong)
    return collector.collect(1), sampler


def test_dynamic_sampling_keeps_only_mixed_groups_and_counts_what_it_dropped():
    scored, sampler = collect(half_constant_reward)
    assert scored.num_groups == 6 and scored.rollout.response_ids.shape[0] == 24
    assert mixed_groups(scored.rewards, 4).all()
    assert not any(first_operand_is_even(p.prompt) for p in scored.problems)
    # Every prompt dealt was either dropped or is (or would have been, past the batch) kept.
    dealt = sampler.position
    assert dealt == 6 * scored.rounds and scored.rounds >= 2  # about half the groups are dropped
    assert scored.dropped_groups >= dealt - 6 - 6 and scored.dropped_groups <= dealt - 6
    # The kept rows are the kept groups' own responses, re-scored identically.
    completions = TOKENIZER.batch_decode(scored.rollout.response_ids, skip_special_tokens=True)
    prompts = [p.prompt for p in scored.problems for _ in range(4)]
    assert half_constant_reward(prompts, completions, None) == scored.rewards.tolist()
    assert scored.scores.parts["test"].tolist() == scored.rewards.tolist()  # the parts follow the kept rows


def test_dynamic_sampling_stops_after_max_rounds_and_may_keep_nothing():
    scored, sampler = collect(lambda prompts, completions, answers: [0.0] * len(prompts), rounds=3)
    assert scored.rounds == 3 and sampler.position == 18
    assert scored.num_groups == 0 and scored.dropped_groups == 18 and scored.rollout.response_ids.shape[0] == 0
    assert scored.generated_reward_mean == 0.0


def test_the_generated_reward_counts_the_groups_dynamic_sampling_dropped():
    """The collapse rule's input (rlft.tooling.collapse): every response generated, not only the kept ones,
    so a run whose groups all fail is seen failing even when dynamic sampling keeps nothing."""
    even_right = lambda prompts, completions, answers: [float(first_operand_is_even(p)) for p in prompts]  # noqa: E731
    scored, _ = collect(even_right, rounds=1)
    problems, _ = split_problems(10, 99, 500, 0)
    dealt = PromptSampler(problems, seed=0).next(6)  # the same six prompts, dealt again
    share_even = sum(first_operand_is_even(p.prompt) for p in dealt) / 6
    assert scored.num_groups == 0 and 0 < share_even < 1  # every group all-equal: all dropped
    assert scored.generated_reward_mean == pytest.approx(share_even)


def test_without_dynamic_sampling_every_group_is_kept_in_one_round():
    scored, sampler = collect(lambda prompts, completions, answers: [0.0] * len(prompts), dynamic=False)
    assert scored.rounds == 1 and scored.num_groups == 6 and scored.dropped_groups == 0 and sampler.position == 6


def test_overlong_shaping_is_added_to_the_reward():
    zero = lambda prompts, completions, answers: [0.0] * len(prompts)  # noqa: E731
    scored, _ = collect(zero, dynamic=False, overlong=Overlong(max_len=6, buffer=3, penalty=1.0))
    lengths = scored.rollout.response_lengths.float()
    expected = torch.where(lengths <= 3, torch.zeros_like(lengths), (3 - lengths) / 3)
    assert torch.allclose(scored.rewards, expected)


class CountingEngine:
    """A stand-in engine that records what the collector asked of it, in order."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, params):
        self.calls.append("generate")
        return self.engine.generate(prompts, params)

    def update_weights(self, named):
        self.calls.append("update_weights")

    def sleep(self):
        self.calls.append("sleep")

    def rng_state(self):
        return self.engine.rng_state()


def test_a_colocated_engine_sleeps_after_collecting_and_gets_weights_only_between_collections():
    problems, held_out = split_problems(10, 99, 500, 0)
    engine = CountingEngine(HFEngine(load_causal_lm(PATH, "float32", "cpu"), TOKENIZER.pad_token_id,
                                     [TOKENIZER.eos_token_id], 0))

    class Learner:
        def push_weights(self, target):
            target.update_weights([])
            return "synced"

    for ahead in (False, True):
        engine.calls.clear()
        collector = Collector(engine, PromptSampler(problems, seed=0), TOKENIZER.encode,
                              lambda ids: TOKENIZER.batch_decode(ids, skip_special_tokens=True),
                              as_score_fn(half_constant_reward), SamplingParams(n=2, max_new_tokens=4),
                              TOKENIZER.pad_token_id, prompts_per_step=2, max_staleness=int(ahead), sleep=not ahead,
                              sync_point=lambda step: step == 2)
        first = collector.collect(1)
        sync, waited = collector.push_weights(Learner())
        second = collector.collect(2)
        collector.close()
        assert sync == "synced" and waited >= 0
        if ahead:  # the second batch was generated before the push, with the weights of version 0
            assert engine.calls == ["generate", "generate", "update_weights"]
            assert (first.staleness, second.staleness, second.weights_version) == (0, 1, 0)
        else:  # colocated: sleep after every collection, weights in between
            assert engine.calls == ["generate", "sleep", "update_weights", "generate", "sleep"]
            assert (first.staleness, second.staleness, second.weights_version) == (0, 0, 1)
