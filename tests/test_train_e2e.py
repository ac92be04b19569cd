"""`rlft train` end to end on a tiny budget: what a run writes, and that resume continues exactly."""

import json
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from conftest import TINY_RUN, read_metrics
from rlft.models.loading import resolve_model_path

VOLATILE = ("perf/", "sync/seconds")  # wall-clock numbers differ between any two runs
# The engine-vs-learner gap is float round-off of two kernels (KV-cached decode vs a full forward); its
# last digits move with the memory alignment BLAS gets in each process, so it is compared with a tolerance.
ROUNDOFF = ("rollout/logprob_diff",)


def deterministic(rows):
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE + ROUNDOFF)} for row in rows]


def roundoff(rows):
    return [[v for k, v in row.items() if k.startswith(ROUNDOFF)] for row in rows]


def test_a_tiny_run_writes_metrics_checkpoints_and_a_loadable_final_model(rlft, tmp_path):
    run = tmp_path / "run"
    proc = rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=4", "trainer.eval_every=2",
                "trainer.save_every=2", "logger.console=true")
    rows = read_metrics(run)
    train_rows = [r for r in rows if r.get("kind") != "eval"]
    eval_rows = [r for r in rows if r.get("kind") == "eval"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert [r["step"] for r in eval_rows] == [0, 2, 4]
    for key in ("train/loss", "train/kl_ref", "train/clip_frac", "train/reward_mean", "rollout/response_len_mean",
                "rollout/logprob_diff_mean", "sync/seconds", "sync/bytes", "perf/peak_rss_mb", "perf/generate_seconds",
                "perf/reward_seconds", "perf/ref_seconds", "perf/forward_seconds", "perf/backward_seconds",
                "perf/optimizer_seconds", "train/lr", "train/eps_high"):
        assert key in train_rows[0], key
    # the on-policy HF engine samples from the learner's own weights: nothing to push, and every step's
    # batch comes from exactly the weights the learner scores it with
    assert all(r["sync/bytes"] == 0 for r in train_rows)
    assert all(r["rollout/logprob_diff_mean"] < 1e-4 for r in train_rows)
    assert [r["train/eps_high"] for r in train_rows] == [0.2] * 4  # the bound in use (constant without a schedule)
    assert all(r["rollout/staleness"] == 0 for r in train_rows)  # on-policy unless rollout.async_steps=1
    assert (run / "checkpoints" / "latest").read_text() == "step_000004"
    state = json.loads((run / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["sampler_position"] == 4 * 8
    # The final model loads with plain transformers and its weights moved away from the start.
    final = AutoModelForCausalLM.from_pretrained(run / "final_model")
    start = load_file(f"{resolve_model_path('builtin:tiny-adder')}/model.safetensors")
    moved = [name for name, p in final.named_parameters() if not torch.equal(p, start[name])]
    assert moved, "training changed no weight"
    assert "step    4 | reward" in proc.stdout and "held-out accuracy:" in proc.stdout
    assert f"run directory: {run}" in proc.stdout
    assert "16 prompts/step" not in proc.stdout and "8 prompts/step x group_size 4 = 32 responses/step" in proc.stdout


def test_a_bfloat16_run_trains_float32_master_weights_and_samples_in_bfloat16(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "model.dtype=bfloat16", "algo.kl_coef=0.04",
         "trainer.steps=2", "trainer.eval_every=100")
    weights = load_file(run / "checkpoints" / "step_000002" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}
    final = load_file(run / "final_model" / "model.safetensors")  # the learner's float32, as checkpoints
    assert {t.dtype for t in final.values()} == {torch.float32}
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    # the engines get bfloat16 weights (2 bytes each), and their log-probs differ from the learner's
    # bfloat16 passes over float32 weights by rounding only
    assert all(r["sync/bytes"] == 2 * sum(t.numel() for t in weights.values()) for r in rows)
    assert all(r["rollout/logprob_diff_mean"] < 0.02 for r in rows), [r["rollout/logprob_diff_mean"] for r in rows]
    assert 0 <= rows[0]["train/kl_ref"] < 0.01


def test_resume_continues_exactly_where_the_run_stopped(rlft, tmp_path):
    budget = [*TINY_RUN, "trainer.steps=6", "trainer.eval_every=2", "trainer.save_every=10"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rlft("train", f"hydra.run.dir={straight}", *budget)
    rlft("train", f"hydra.run.dir={resumed}", *budget, "trainer.exit_after_step=3")
    assert (resumed / "checkpoints" / "latest").read_text() == "step_000003"
    assert not (resumed / "final_model").exists()
    # Rows a crash could have logged after the checkpoint must not survive the resume.
    with (resumed / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "train/loss": 123.0}) + "\n")
    rlft("train", f"resume={resumed}")
    assert_same_run(straight, resumed)


def assert_same_run(straight, resumed) -> None:
    """Every metric row (wall-clock ones aside; round-off ones within 1e-5) and every final weight bit equal."""
    assert deterministic(read_metrics(resumed)) == deterministic(read_metrics(straight))
    for theirs, ours in zip(roundoff(read_metrics(straight)), roundoff(read_metrics(resumed)), strict=True):
        assert ours == pytest.approx(theirs, abs=1e-5)
    a = load_file(straight / "final_model" / "model.safetensors")
    b = load_file(resumed / "final_model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


# k = 1 (by its older name): step 1 has nothing collected ahead; no batch is collected across the checkpoint
# of step 3. k = 2: batches 2-4 come from weights 0, 0, 1; none across the checkpoint of step 4; batches 5-7
# from the step-4 weights (the evaluation of step 6 does not change a queued batch).
@pytest.mark.parametrize("ahead,steps,eval_every,save_every,staleness", [
    ("rollout.async_steps=1", 5, 2, 3, [0, 1, 1, 0, 1]),
    ("rollout.max_staleness=2", 7, 3, 4, [0, 1, 2, 2, 0, 1, 2]),
    # partial rollouts, k = 2: new tokens one version behind, carried ones two; the checkpoint of step 4
    # drains the responses in flight, so step 5 starts fresh from the step-4 weights
    ("rollout.max_staleness=2 rollout.partial_rollouts=true rollout.chunk_tokens=1", 6, 3, 4, [0, 1, 2, 2, 0, 1]),
])
def test_generating_ahead_keeps_its_schedule_and_resumes_exactly(rlft, tmp_path, ahead, steps, eval_every, save_every,
                                                                 staleness):
    budget = [*TINY_RUN, f"trainer.steps={steps}", f"trainer.eval_every={eval_every}",
              f"trainer.save_every={save_every}", *ahead.split(), "algo.tis_cap=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rlft("train", f"hydra.run.dir={straight}", *budget)
    rows = [r for r in read_metrics(straight) if r.get("kind") != "eval"]
    assert [r["rollout/staleness"] for r in rows] == staleness
    # A batch versions behind came from other weights than the learner's: their log-probs differ by far
    # more than the round-off between engine and learner on the same weights.
    fresh = [r["rollout/logprob_diff_mean"] for r in rows if r["rollout/staleness"] == 0]
    stale = [r["rollout/logprob_diff_mean"] for r in rows if r["rollout/staleness"] == max(staleness)]
    assert max(fresh) < 1e-4 and min(stale) > 10 * max(fresh), (fresh, stale)
    assert all(r["sync/bytes"] > 0 for r in rows)  # an engine generating ahead keeps its own copy
    if "partial" in ahead:  # responses continued across a weight push, and the token ages say so
        assert sum(r["rollout/carried_groups"] for r in rows) > 0
        assert all(r["staleness/tokens_2"] > 0 for r in rows if r["rollout/staleness"] == 2)

    rlft("train", f"hydra.run.dir={resumed}", *budget, f"trainer.exit_after_step={save_every}")
    rlft("train", f"resume={resumed}")
    assert deterministic(read_metrics(resumed)) == deterministic(read_metrics(straight))


def test_a_reward_error_while_collecting_ahead_stops_the_run_with_its_checkpoint(rlft, tmp_path):
    # Fails from the 147th call on: after the step-0 eval (50) and steps 1-3 (32 each), i.e. on step 4's
    # batch, which is collected in the background during step 3.
    (tmp_path / "counted.py").write_text(textwrap.dedent('''
        import os

        def fails_late(completion):
            fd = os.open("calls", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(fd, b"x")
            os.close(fd)
            if os.path.getsize("calls") > 146:
                raise RuntimeError("late failure")
            return 0.0
    '''))
    run = tmp_path / "run"
    proc = rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=6", "trainer.save_every=2",
                "trainer.eval_every=100", "rollout.async_steps=1", "reward.fns=[counted:fails_late]",
                "reward.accuracy=counted:fails_late", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "late failure" in proc.stderr
    assert f"[step 4; the checkpoint of step 2 is intact: rlft train resume={run}]" in proc.stderr, proc.stderr
    assert (run / "checkpoints" / "latest").read_text() == "step_000002"


def test_resume_refuses_to_switch_config_groups(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=2", "trainer.exit_after_step=1")
    proc = rlft("train", f"resume={run}", "model=tiny_adder", check=False)
    assert proc.returncode == 2 and "resume keeps its config groups" in proc.stderr


@pytest.mark.slow
def test_the_default_run_learns(rlft, tmp_path):
    """`make train`'s run, full length: +20 points of held-out accuracy (the issue's bar), and the collapse rule
    (rlft.tooling.collapse) quiet all along: its drop stays well below trainer.collapse_drop."""
    run = tmp_path / "run"
    proc = rlft("train", f"hydra.run.dir={run}", "logger.console=false")
    rows = read_metrics(run)
    evals = [r for r in rows if r.get("kind") == "eval"]
    before, after = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    assert after - before >= 0.20, (before, after)
    steps = [r for r in rows if r.get("kind") != "eval"]
    assert not any(r["collapse/fired"] for r in steps) and "collapse:" not in proc.stderr
    assert "train/approx_kl" not in proc.stderr  # nor the early warning
    assert max(r["collapse/reward_drop"] for r in steps) < 0.25


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dapo", "gspo"])
def test_dapo_and_gspo_learn(rlft, tmp_path, algo):
    run = tmp_path / algo
    rlft("train", f"algo={algo}", f"hydra.run.dir={run}", "logger.console=false", "trainer.steps=30")
    rows = read_metrics(run)
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"] >= 0.20, evals
    steps = [r for r in rows if r.get("kind") != "eval"]
    for key in ("train/entropy", "train/clip_frac_low", "train/clip_frac_high", "train/ratio_mean",
                "train/approx_kl", "rollout/truncated_frac", "rollout/sampling_rounds", "rollout/dropped_groups"):
        assert key in steps[0], key
    if algo == "dapo":  # dynamic sampling at work: all-right/all-wrong groups were dropped and re-sampled
        assert sum(r["rollout/dropped_groups"] for r in steps) > 0
        assert max(r["rollout/sampling_rounds"] for r in steps) >= 2
        assert "train/kl_ref" not in steps[0]  # kl_coef 0 loads no reference model


def test_mask_truncated_drops_cut_off_responses_from_the_loss(rlft, tmp_path):
    # max_new_tokens=2 cuts off every answer of two or more digits before its EOS.
    common = [*TINY_RUN, "trainer.steps=2", "rollout.max_new_tokens=2"]
    rlft("train", f"hydra.run.dir={tmp_path / 'kept'}", *common)
    rlft("train", f"hydra.run.dir={tmp_path / 'masked'}", *common, "algo.mask_truncated=true")
    kept = [r for r in read_metrics(tmp_path / "kept") if r.get("kind") != "eval"]
    masked = [r for r in read_metrics(tmp_path / "masked") if r.get("kind") != "eval"]
    assert all(r["train/tokens"] == r["rollout/tokens"] for r in kept)
    assert all(r["rollout/truncated_frac"] > 0.5 for r in masked)
    # Only the responses that ended with EOS count: each of those has at most 2 tokens.
    for r in masked:
        stopped = round((1 - r["rollout/truncated_frac"]) * 32)
        assert r["train/tokens"] <= 2 * stopped < r["rollout/tokens"]


@pytest.mark.parametrize("source", ["learner", "rollout"])
def test_routing_replay_on_the_moe_model_leaves_no_drift(rlft, tmp_path, source):
    """model=tiny_moe, 3 ppo epochs: without replay some tokens change experts between the old pass and
    the training passes; with replay (of the learner's old pass, or of the HF engine's routes) none do."""
    drift = {}
    for replay in ("false", "true"):
        run = tmp_path / replay
        rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "model=tiny_moe", "trainer.steps=3", "trainer.eval_every=3",
             "algo.ppo_epochs=3", "compute.micro_batch_size=8", "optim.lr=1e-3",
             f"algo.routing_replay={source if replay == 'true' else 'false'}")
        rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
        drift[replay] = [(r["moe/routing_drift"], r["moe/router_drift"]) for r in rows]
        assert all(r["moe/load_balance_loss"] > 0 and sum(r[f"moe/expert_tokens/{e}"] for e in range(8)) > 0
                   for r in rows)
    assert any(used > 0 for used, _ in drift["false"])
    assert all(used == router for used, router in drift["false"])
    assert all(used == 0.0 for used, _ in drift["true"]) and any(router > 0 for _, router in drift["true"])


def test_engine_routes_are_replayed_on_partial_rollouts(rlft, tmp_path):
    """R3 with partial rollouts: sequences continued under newer weights still carry the engine's routes for
    every token, so the learner's passes use exactly the recorded experts."""
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "model=tiny_moe", "trainer.steps=3", "trainer.eval_every=3",
         "algo.ppo_epochs=2", "optim.lr=1e-3", "algo.routing_replay=rollout", "rollout.max_staleness=1",
         "rollout.partial_rollouts=true", "rollout.chunk_tokens=1")
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    assert sum(r["rollout/carried_groups"] for r in rows) > 0
    assert all(r["moe/routing_drift"] == 0.0 for r in rows) and any(r["moe/router_drift"] > 0 for r in rows)


def test_profile_writes_a_trace_of_step_two_and_the_time_split_adds_up(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", "--profile", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=2", "trainer.eval_every=2")
    assert sorted(p.name for p in (run / "profile").iterdir()) == ["step_000002.json", "step_000002.txt"]
    assert json.loads((run / "profile" / "step_000002.json").read_text())["traceEvents"]
    assert "aten::" in (run / "profile" / "step_000002.txt").read_text()
    for row in (r for r in read_metrics(run) if r.get("kind") != "eval"):
        parts = row["perf/forward_seconds"] + row["perf/backward_seconds"] + row["perf/optimizer_seconds"]
        assert 0 < parts <= row["perf/train_seconds"] < row["perf/step_seconds"]
