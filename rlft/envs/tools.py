"""Tools: plain Python functions whose signature and docstring are their schema, and the runner that
executes a turn's calls for the whole batch at once, each with a deadline.

Where a call runs:
- built-in tools (this module's TOOLS: `calculator`, `python`) in a thread of this process: they are
  trusted code; `python` runs the model's program in the code sandbox (rlft.rewards.sandbox);
- user tools (`module:function`) in the reward worker pool (rlft.rewards.pool): a process per worker, the
  per-call deadline, memory cap and process-group cleanup of reward functions.
A call past `timeout_s` is a timed-out result at `timeout_s` (the episode is cut there), whatever the
others do: the batch never waits on one slow tool longer than that.
"""

from __future__ import annotations

import ast
import inspect
import operator
import re
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, get_type_hints

from rlft.envs.base import ToolCall, ToolResult
from rlft.errors import ConfigError
from rlft.registry import Registry, import_function
from rlft.rewards import as_tool_output

TOOLS: Registry[Callable] = Registry("tool")


@TOOLS.register("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: integers with + - * / // % ** and parentheses, e.g. "1234*567".
    """
    return _format_number(_evaluate(ast.parse(expression.strip(), mode="eval").body))


@TOOLS.register("python")
def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it prints.

    Args:
        code: a complete Python program; print the values you need.
    """
    from rlft.rewards.sandbox import run_python
    result = run_python(code, timeout_s=python.timeout_s)
    suffix = {"timeout": "\n[timed out]", "failed": "\n[exit status not 0]"}.get(result.status, "")
    return result.output + suffix


python.timeout_s = 10.0  # the sandbox's own deadline; the runner sets it to env.tool_timeout_s


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10 ** 6):
            raise ValueError("exponent too large")  # 9**9**9 would take the trainer's memory
        if max(abs(left), abs(right)) > 10 ** 100:
            raise ValueError("number too large")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError("only numbers, + - * / // % ** and parentheses")


def _format_number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# ---- schemas ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable | None         # a built-in, run in this process
    import_path: str | None     # a user tool, run in the worker pool
    schema: dict[str, Any]      # {"type": "function", "function": {name, description, parameters}}

    @property
    def parameters(self) -> list[str]:
        return list(self.schema["function"]["parameters"]["properties"])


def resolve_tools(names: list[str]) -> list[Tool]:
    """Built-in names or `module:function` paths; ConfigError naming a name that resolves to nothing."""
    tools = []
    for name in names:
        if ":" in name:
            fn = import_function(name, "tool")
            tools.append(Tool(fn.__name__, None, name, tool_schema(fn)))
        else:
            fn = TOOLS.get(name)
            tools.append(Tool(name, fn, None, tool_schema(fn)))
    seen = [t.name for t in tools]
    if len(set(seen)) != len(seen):
        raise ConfigError(f"env.tools names a tool twice: {seen}")
    return tools


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The JSON schema chat templates expect (OpenAI's function format), from the signature's type hints and
    a Google-style docstring (a summary, then `Args:` with `name: description` lines)."""
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n")[0].strip()
    described = dict(re.findall(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", doc.split("Args:", 1)[1], re.M)) \
        if "Args:" in doc else {}
    hints = get_type_hints(fn)
    properties, required = {}, []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        kind = _JSON_TYPES.get(getattr(hints.get(name), "__origin__", hints.get(name)), "string")
        properties[name] = {"type": kind} | ({"description": described[name]} if name in described else {})
        if parameter.default is parameter.empty:
            required.append(name)
    return {"type": "function", "function": {"name": fn.__name__, "description": summary,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


# ---- running a batch of calls -----------------------------------------------------------------------

class ToolRunner:
    def __init__(self, tools: list[Tool], timeout_s: float, threads: int = 8):
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        python.timeout_s = timeout_s
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="rlft-tool")
        self._pool = None
        if any(t.import_path for t in tools):
            import os
            from rlft.rewards.pool import RewardPool
            self._pool = RewardPool(min(4, len(os.sched_getaffinity(0))), timeout_s)

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Every call at once; the results in the calls' order."""
        started = time.perf_counter()
        results: list[ToolResult | None] = [None] * len(calls)
        futures, pooled = {}, []
        for index, call in enumerate(calls):
            tool = self.tools.get(call.name)
            problem = _argument_problem(tool, call, list(self.tools))
            if problem is not None:
                results[index] = ToolResult(call, f"error: {problem}", error=True)
            elif tool.fn is not None:
                futures[self._threads.submit(_call_builtin, tool.fn, call.arguments)] = index
            else:
                pooled.append(index)
        if pooled:  # user tools: the worker pool, while the built-ins run in threads
            outcomes = self._pool.run_tools({i: (self.tools[calls[i].name].import_path, calls[i].arguments)
                                             for i in pooled})
            for index, outcome in outcomes.items():
                timed_out = (outcome.error or "").startswith("TimeoutError")
                results[index] = ToolResult(calls[index], f"error: {outcome.error}" if outcome.error else outcome.value,
                                            error=outcome.error is not None, timed_out=timed_out)
        remaining = self.timeout_s - (time.perf_counter() - started)
        done, _ = wait(futures, timeout=max(0.0, remaining))
        for future, index in futures.items():
            if future in done:
                output, error = future.result()
                results[index] = ToolResult(calls[index], output, error=error)
            else:  # the thread finishes on its own (a built-in's work is bounded); its result is dropped
                future.cancel()
                results[index] = ToolResult(calls[index], f"error: no result within {self.timeout_s:g} s",
                                            error=True, timed_out=True)
        seconds = time.perf_counter() - started
        return [ToolResult(r.call, r.output, r.error, r.timed_out, seconds) for r in results]

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._pool is not None:
            self._pool.close()


def _argument_problem(tool: Tool | None, call: ToolCall, names: list[str]) -> str | None:
    if tool is None:
        return f"unknown tool {call.name!r} (tools: {', '.join(names)})"
    if not isinstance(call.arguments, dict):
        return f"{call.name}: arguments must be an object"
    unknown = sorted(set(call.arguments) - set(tool.parameters))
    missing = [p for p in tool.schema["function"]["parameters"]["required"] if p not in call.arguments]
    if unknown or missing:
        return f"{call.name}: " + "; ".join(([f"unknown argument(s) {', '.join(unknown)}"] if unknown else []) +
                                            ([f"missing {', '.join(missing)}"] if missing else []))
    return None


def _call_builtin(fn: Callable, arguments: dict[str, Any]) -> tuple[str, bool]:
    try:
        return as_tool_output(fn(**arguments)), False
    except Exception as err:  # the model's mistake (bad expression, ...): it reads the error and may retry
        return f"error: {type(err).__name__}: {err}", True
