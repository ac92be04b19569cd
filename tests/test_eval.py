"""`rlft eval`: a run's final model, any checkpoint, or a model path on the held-out set, with the numbers the
trainer's own evaluation logged for the same weights (one tiny run shared by the tests)."""

import json
import shutil

import pytest

from conftest import read_metrics, run_rlft
from rlft.cli import main
from rlft.evaluate import EvalResult, report

# Steps large enough (lr 3e-3, no warm-up) that each step's weights score differently on the held-out set: a
# checkpoint whose weights were not loaded would give another step's numbers.
RUN = ["trainer.steps=2", "trainer.prompts_per_step=4", "algo.group_size=4", "data.eval_size=32", "seed=2",
       "trainer.eval_every=1", "trainer.save_every=1", "trainer.keep_checkpoints=5", "optim.lr=3e-3",
       "optim.warmup_steps=0", "logger.console=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    run_rlft("train", f"hydra.run.dir={run_dir}", *RUN)
    return run_dir


@pytest.fixture(scope="module")
def evals(run) -> dict[int, dict]:
    """The trainer's eval rows by step."""
    rows = {r["step"]: r for r in read_metrics(run) if r.get("kind") == "eval"}
    assert sorted(rows) == [0, 1, 2]
    assert len({rows[step]["eval/accuracy"] for step in rows}) == 3, "the steps' weights must score differently"
    return rows


def rlft_eval(capsys, *args) -> tuple[int, str, str]:
    code = main(["eval", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_value(out: str, metric: str) -> str:
    return next(line.split()[1] for line in out.splitlines() if line.split()[:1] == [metric])


def same_as_the_trainer(result: dict, row: dict) -> None:
    """The JSON's numbers are the eval row's, and its first completions the row's samples."""
    for key in ("eval/accuracy", "eval/reward_mean", "eval/size"):
        assert result["metrics"][key] == row[key], key
    logged = [(s["prompt"], s["completion"], s["reward"]) for s in row["eval/samples"]]
    assert [(p["prompt"], p["completion"], p["reward"]) for p in result["problems"][:len(logged)]] == logged


def test_a_run_directory_is_its_final_model_scored_as_the_trainer_scored_it_last(run, evals, capsys):
    code, out, _ = rlft_eval(capsys, run)
    assert code == 0
    result = json.loads((run / "eval.json").read_text())  # the default JSON of a run directory
    same_as_the_trainer(result, evals[2])
    assert result["weights"] == str(run / "final_model") and len(result["problems"]) == 32
    assert f"json: {run / 'eval.json'}" in out
    assert table_value(out, "eval/accuracy") == f"{evals[2]['eval/accuracy']:.4f}"
    assert "prompt" in out and "completion" in out and out.count(" | ") >= 6 * 3  # header + 5 problems


@pytest.mark.parametrize("step", [1, 2])
def test_a_checkpoint_is_scored_as_the_trainer_scored_its_step(run, evals, capsys, step):
    code, _, _ = rlft_eval(capsys, run / "checkpoints" / f"step_{step:06d}")
    assert code == 0
    result = json.loads((run / f"eval_step_{step:06d}.json").read_text())
    assert result["step"] == step
    same_as_the_trainer(result, evals[step])


def test_a_run_without_a_final_model_is_its_newest_checkpoint(run, evals, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished, ignore=shutil.ignore_patterns("final_model", "eval*.json"))
    code, out, _ = rlft_eval(capsys, unfinished, "--show", 0)
    assert code == 0 and "completion" not in out
    same_as_the_trainer(json.loads((unfinished / "eval_step_000002.json").read_text()), evals[2])


def test_the_built_in_model_is_scored_as_the_trainers_step_0(evals, tmp_path, capsys):
    out = tmp_path / "base.json"
    code, _, _ = rlft_eval(capsys, "model.path=builtin:tiny-adder", "data.eval_size=32", "--out", out)
    assert code == 0
    result = json.loads(out.read_text())
    assert result["step"] is None and result["weights"] == "builtin:tiny-adder"
    same_as_the_trainer(result, evals[0])


def test_samples_give_pass_at_k_reproducibly(run, evals, tmp_path, capsys):
    results = []
    for name in ("a.json", "b.json"):
        code, out, _ = rlft_eval(capsys, run / "checkpoints" / "step_000001", "--samples", 4, "--out", tmp_path / name)
        assert code == 0 and "eval/pass@4" in out
        results.append(json.loads((tmp_path / name).read_text()))
    metrics = results[0]["metrics"]
    assert results[1]["metrics"] == metrics  # the engine's sampling is seeded by the run's seed
    assert 0 <= metrics["eval/sampled_accuracy"] <= metrics["eval/pass@4"] <= 1
    assert 0 <= metrics["eval/sampled_reward_mean"] <= 1 and metrics["eval/samples_per_problem"] == 4
    same_as_the_trainer(results[0], evals[1])  # sampling after the greedy pass leaves it as it was


ERRORS = {  # name: (arguments, words of the error), "RUN" standing for the trained run
    "no such target": (["/nonexistent/run"], "no such run directory or checkpoint: /nonexistent/run"),
    "neither run nor checkpoint": (["EMPTY"], "neither a run directory"),
    "nothing to evaluate": (["BARE"], "no final_model and no checkpoint"),
    "negative samples": (["--samples", "-1"], "--samples takes a whole number >= 0 (got '-1')"),
    "samples not a number": (["--samples=two"], "--samples takes a whole number >= 0"),
    "samples without a value": (["--samples"], "--samples takes a value"),
    "too many samples": (["--samples", "5000"], "--samples takes at most 1024 (got 5000)"),
    "show not a number": (["--show", "1.5"], "--show takes a whole number >= 0"),
    "unknown flag": (["--bogus"], "rlft eval does not take '--bogus'"),
    "two targets": (["RUN", "RUN"], "takes one TARGET"),
    "unknown key": (["nosuch.key=1"], "nosuch"),
    "unknown key of a run": (["RUN", "trainer.nosuch=1"], "nosuch"),
    "a wrong type": (["RUN", "data.eval_size=many"], "data.eval_size"),
    "another group for a run": (["RUN", "algo=dapo"], "rlft eval keeps its config groups"),
    "no such model": (["model.path=/nonexistent/model"], "does not exist"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_a_mistake_is_one_error_line(run, tmp_path, capsys, name):
    args, words = ERRORS[name]
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "BARE").mkdir()
    shutil.copy(run / "config.yaml", tmp_path / "BARE" / "config.yaml")  # a run stopped before its first checkpoint
    paths = {"RUN": str(run), "EMPTY": str(tmp_path / "EMPTY"), "BARE": str(tmp_path / "BARE")}
    code, _, err = rlft_eval(capsys, *[paths.get(a, a) for a in args])
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("rlft: error:")] == err.strip().splitlines(), err
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_the_table_keeps_each_problem_on_one_readable_line():
    long = EvalResult(weights="w", step=3, metrics={"eval/accuracy": 0.5, "eval/size": 2}, problems=[
        {"prompt": "Solve:\n" + "x" * 200 + " what is 2+2?", "completion": "four", "answer": "4", "reward": 0.0,
         "correct": False}])
    text = report(long, show=5)
    assert "weights: w (step 3)" in text and table_value(text, "eval/accuracy") == "0.5000"
    line = text.splitlines()[-1]
    assert "…" in line and line.split(" | ")[0].endswith("what is 2+2?") and len(line) < 100
