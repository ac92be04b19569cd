"""`rlft train env=calculator` end to end with the built-in tool model: episode metrics, whole-episode samples,
engine/learner agreement on every sampled token of a multi-turn sequence, DAPO/GSPO and async collection on
episodes, and exact resume."""

import pytest
from conftest import read_metrics
from test_train_e2e import assert_same_run

from rlft.envs import EpisodeSetup
from rlft.learner.logprobs import response_logprobs
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlft.rollout.hf_engine import HFEngine
from rlft.types import Problem, SamplingParams

CALCULATOR = ["env=calculator", "data=calculator", "model=tiny_calculator", "trainer.prompts_per_step=8",
              "algo.group_size=4", "data.eval_size=24", "logger.console=false"]


def test_a_calculator_run_logs_episodes_and_the_learner_scores_exactly_the_sampled_tokens(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *CALCULATOR, "trainer.steps=2", "trainer.eval_every=2")
    rows = read_metrics(run)
    steps = [r for r in rows if r.get("kind") != "eval"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    for key in ("episode/turns_mean", "episode/tool_call_rate", "episode/tool_calls_mean", "episode/tool_errors_mean",
                "episode/answer_from_tool", "episode/observation_tokens_mean", "perf/tool_seconds",
                "episode/cut_turns", "episode/cut_tokens", "episode/cut_tool_timeout", "reward/env"):
        assert key in steps[0], key
    assert 0 < steps[0]["episode/tool_call_rate"] < 1  # the shipped model calls only sometimes
    assert steps[0]["episode/observation_tokens_mean"] > 0
    # observation tokens are context for the learner: its log-probs of the sampled tokens match the engine's
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in steps), [r["rollout/logprob_diff_max"] for r in steps]
    assert "eval/episode/tool_call_rate" in evals[0]
    # held-out samples are whole episodes: a tool call, its result and the answer after it
    episodes = [s["completion"] for s in evals[0]["eval/samples"]]
    assert any("<call>" in e and "<result>" in e for e in episodes), episodes


def test_multi_turn_resume_continues_exactly(rlft, tmp_path):
    budget = [*CALCULATOR, "trainer.steps=4", "trainer.eval_every=2", "trainer.save_every=10"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rlft("train", f"hydra.run.dir={straight}", *budget)
    rlft("train", f"hydra.run.dir={resumed}", *budget, "trainer.exit_after_step=2")
    rlft("train", f"resume={resumed}")
    assert_same_run(straight, resumed)


def test_partial_rollouts_of_episodes_train_and_resume_exactly(rlft, tmp_path):
    """Episodes whose turns span weight pushes (rollout.partial_rollouts, 4 tokens a pass, k = 2): carried
    groups are trained on, no token is older than k, and a run stopped at its checkpoint resumes exactly."""
    budget = [*CALCULATOR, "rollout.max_staleness=2", "rollout.partial_rollouts=true", "rollout.chunk_tokens=4",
              "algo.correction.kind=token_tis", "trainer.steps=4", "trainer.eval_every=100", "trainer.save_every=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rlft("train", f"hydra.run.dir={straight}", *budget)
    steps = [r for r in read_metrics(straight) if r.get("kind") != "eval"]
    assert len(steps) == 4 and all(r["rollout/staleness"] <= 2 for r in steps)
    assert sum(r["rollout/carried_groups"] for r in steps) > 0 and all(r["rollout/passes"] > 1 for r in steps)
    assert all(r["episode/turns_mean"] >= 1 and r["episode/observation_tokens_mean"] >= 0 for r in steps)
    rlft("train", f"hydra.run.dir={resumed}", *budget, "trainer.exit_after_step=2")
    rlft("train", f"resume={resumed}")
    assert_same_run(straight, resumed)


@pytest.mark.parametrize("algo", [["algo=dapo", "rollout.async_steps=1", "algo.tis_cap=2"], ["algo=gspo"]],
                         ids=["dapo-async", "gspo"])
def test_dapo_with_collection_ahead_and_gspo_train_on_episodes(rlft, tmp_path, algo):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *CALCULATOR, *algo, "trainer.steps=3", "trainer.eval_every=100")
    steps = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    assert len(steps) == 3 and all(r["episode/turns_mean"] >= 1 for r in steps)
    if "rollout.async_steps=1" in algo:  # collected ahead during the last update: one version behind
        assert [r["rollout/staleness"] for r in steps] == [0, 1, 1]
        assert all(r["rollout/sampling_rounds"] >= 1 for r in steps)  # dynamic sampling on episode rewards
    else:
        assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in steps)


class CalculatorConfig:
    environment = "calculator"
    tools: list = []
    max_turns = 3
    max_tokens = 48
    max_turn_tokens = None
    system_prompt = None
    tool_timeout_s = 5.0
    tool_format = "auto"


def test_real_engine_episodes_are_token_exact_and_the_mask_covers_only_sampled_ids():
    path = resolve_model_path("builtin:tiny-calculator")
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, "float32", "cpu")
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], seed=0)
    calls = []
    generate = engine.generate

    def recording(prompts, params):  # what the engine was asked and what it sampled, per call
        rollout = generate(prompts, params)
        calls.append((prompts, rollout))
        return rollout

    engine.generate = recording
    setup = EpisodeSetup(CalculatorConfig, tokenizer)
    runner = setup.runner(engine)
    problems = [Problem(f"{a}*{b}=", str(a * b)) for a, b in [(1234, 567), (2345, 678), (7777, 111), (1500, 250)]]
    try:
        episodes = runner.run(problems, SamplingParams(n=4, temperature=1.0))
    finally:
        runner.runner.close()
    r = episodes.rollout
    assert episodes.stats.tool_calls.sum() > 0 and r.sampled_mask is not None
    asked: dict[tuple, list[list[int]]] = {}  # each request's ids -> what the engine sampled for it
    for prompts, rollout in calls:
        for i, request in enumerate(prompts):
            asked.setdefault(tuple(request), []).append(rollout.response_ids[i][rollout.response_mask[i].bool()].tolist())
    for row in range(r.size):
        prompt = r.prompt_ids[row][r.prompt_mask[row].bool()].tolist()
        trained = r.response_ids[row][r.response_mask[row].bool()].tolist()
        mask = r.sampled_mask[row][r.response_mask[row].bool()].tolist()
        for start, end, sampled in runs(mask):
            if sampled:  # the engine was asked to continue exactly the sequence so far, and sampled these ids
                samples = asked[tuple(prompt + trained[:start])]
                assert any(s[:end - start] == trained[start:end] for s in samples)
            else:  # an observation: exactly the template's text between turns, never a re-rendered turn
                assert tokenizer.decode(trained[start:end]).startswith("<result>")
    # and the learner, reading observations as context, gives the engine's log-probs on the sampled tokens
    learner = response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    sampled_mask = r.sampled_mask.bool()
    assert (learner - r.logprobs)[sampled_mask].abs().max() < 1e-4


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, value) of each run of equal values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out
