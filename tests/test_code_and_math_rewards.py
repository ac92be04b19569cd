"""math-verify answers, and HumanEval tests run on completions in the sandbox (rlft.rewards.sandbox)."""

import os

import pytest

from rlft.data import load_task
from rlft.config import data as schemas
from rlft.rewards.builtin import code_tests, math_verify
from rlft.rewards.sandbox import run_python


@pytest.mark.parametrize("completion,answer,score", [
    ("The answer is \\boxed{0.5}", "1/2", 1.0),
    ("To find the sum of 25 + 60, we add", "85", 0.0),   # restating the question is no answer
    ("The answer is 85", "85", 0.0),                     # neither <answer> nor \boxed{}
    ("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("<answer>\\frac{2}{4}</answer>", "\\frac{1}{2}", 1.0),
    ("<answer>0.6</answer>", "1/2", 0.0),
    ("<answer>17+25 = 32</answer>", "42", 0.0),
    ("I do not know", "42", 0.0),
])
def test_math_verify_accepts_equivalent_forms_only(completion, answer, score):
    assert math_verify(completion, answer) == score


@pytest.fixture(scope="module")
def humaneval():
    train, held_out = load_task(schemas.HumanEvalData(eval_size=64))
    assert len(train) + len(held_out) == 164
    return {p.fields["task_id"]: p for p in train + held_out}


def score(problem, completion):
    return code_tests(problem.prompt, completion, problem.fields["test"], problem.fields["entry_point"],
                      sandbox_timeout_s=5.0, sandbox_memory_mb=512)


def test_canonical_solutions_pass_and_wrong_ones_fail(humaneval):
    for task_id in ("HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/53"):
        problem = humaneval[task_id]
        assert score(problem, problem.answer) == 1.0, task_id
        assert score(problem, "    return None\n") == 0.0, task_id
    # the model writes on past the function: cut at the next top-level definition
    problem = humaneval["HumanEval/53"]
    assert score(problem, problem.answer + "\ndef unrelated():\n    raise SystemExit(1)\n") == 1.0


def test_the_sandbox_stops_or_contains_hostile_code(humaneval, tmp_path):
    problem = humaneval["HumanEval/53"]  # add(x, y)
    forever = "    while True:\n        pass\n"
    memory = "    blob = bytearray(8 * 2**30)\n    return x + y\n"
    forks = "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n"
    outside = tmp_path / "owned_by_the_trainer"
    write = f"    open({str(outside)!r}, 'w').write('x')\n    return x + y\n"
    for completion in (forever, memory, forks, write):
        assert score(problem, completion) == 0.0
    assert not outside.exists()
    # no process of theirs is left behind
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_sandbox_program(pid)]
    assert not left


def test_the_sandbox_has_no_secrets_and_its_own_directory(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    result = run_python("import os\nprint(sorted(os.environ), os.getcwd() == os.environ['HOME'])\n"
                        "assert 'WANDB_API_KEY' not in os.environ\n")
    assert result.passed and "True" in result.output and "secret" not in result.output


def _is_sandbox_program(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"rlft-sandbox-" in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("completion,answer,score", [
    ("The answer is 0.50.", "0.5", 1.0),
    ("25 + 60 = 85", "85", 1.0),
    ("To find the sum of 25 + 60, we need to", "85", 0.0),
    ("<think>2+2</think><answer>4</answer>", "4", 1.0),
    ("<answer>1,234</answer>", "1234", 1.0),
    ("<answer>Paris</answer>", "Paris", 1.0),
    ("no number here", "7", 0.0),
])
def test_answer_match_takes_the_last_number_of_the_final_answer(completion, answer, score):
    from rlft.rewards.builtin import answer_match
    assert answer_match(completion, answer) == score
