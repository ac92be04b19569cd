"""The built-in environments (`env.environment`): no download, each with a config in conf/env/."""

from __future__ import annotations

from rlft.envs.base import Observation, ToolEnv, ToolResult, Turn
from rlft.envs.tools import calculator, python
from rlft.registry import Registry
from rlft.types import Problem

ENVIRONMENTS: Registry[type] = Registry("environment")


@ENVIRONMENTS.register("calculator")
class Calculator(ToolEnv):
    """Arithmetic the model cannot do in its head (data=calculator: a 4-digit times a 3-digit number), with
    a `calculator` tool; the final answer is scored by the reward functions (exact_match)."""

    tools = [calculator]


@ENVIRONMENTS.register("python")
class PythonTool(ToolEnv):
    """Any task (reasoning-gym's, say) with a `python` tool: the model may run code, in the sandbox, before
    it answers."""

    tools = [python]
    system_prompt = ("You can run Python code with the python tool before you answer; it returns what the "
                     "program prints.")


@ENVIRONMENTS.register("code_repair")
class CodeRepair:
    """Multi-turn code repair (data=humaneval): the model writes the function's body; when the problem's tests
    fail, their output is the next observation and it tries again, until they pass or env.max_turns."""

    tools = None
    timeout_s = 10.0

    def reset(self, problem: Problem) -> list[dict]:
        self.problem = problem
        return [{"role": "user", "content": problem.prompt}]

    def step(self, turn: Turn, results: list[ToolResult]) -> Observation:
        from rlft.rewards.builtin import CODE_STOPS
        from rlft.rewards.sandbox import run_tests
        body = turn.text
        for stop in CODE_STOPS:
            body = body.split(stop)[0]
        fields = self.problem.fields
        result = run_tests(self.problem.prompt, body, fields["test"], fields["entry_point"], timeout_s=self.timeout_s)
        if result.passed:
            return Observation(done=True)
        tail = "\n".join(result.output.strip().splitlines()[-12:])
        return Observation(messages=[{"role": "user", "content": f"The tests failed ({result.status}):\n{tail}\n"
                                                                 f"Write the function body again."}])
