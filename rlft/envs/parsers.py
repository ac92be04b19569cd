"""Tool-call formats: a model family writes its calls in its own syntax; a parser reads them from the raw
text of a turn (special tokens kept). `env.tool_format` picks one; `auto` reads it off the tokenizer.

    hermes   <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>
             (Qwen2.5/3, Hermes, SmolLM, most chat templates with tool support; several calls per turn)
    tiny     <call>2*3</call>: the built-in tool model's compact form, a call of the environment's first
             tool with its first parameter
"""

from __future__ import annotations

import json
import re
from typing import Callable

from rlft.envs.base import ToolCall
from rlft.envs.tools import Tool
from rlft.registry import Registry

# raw turn text, the environment's tools -> (calls, what failed to parse)
Parser = Callable[[str, list[Tool]], tuple[list[ToolCall], list[str]]]
PARSERS: Registry[Parser] = Registry("tool format")

HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
TINY = re.compile(r"<call>(.*?)(?:</call>|$)", re.S)


@PARSERS.register("hermes")
def parse_hermes(text: str, tools: list[Tool]) -> tuple[list[ToolCall], list[str]]:
    calls, errors = [], []
    for body in HERMES.findall(text):
        try:
            payload = json.loads(body.strip())
        except json.JSONDecodeError as err:
            errors.append(f"the tool call is not valid JSON ({err.msg} at character {err.pos})")
            continue
        name = payload.get("name") if isinstance(payload, dict) else None
        arguments = payload.get("arguments", {}) if isinstance(payload, dict) else None
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            errors.append('a tool call is {"name": str, "arguments": {...}}')
            continue
        calls.append(ToolCall(name, arguments))
    return calls, errors


@PARSERS.register("tiny")
def parse_tiny(text: str, tools: list[Tool]) -> tuple[list[ToolCall], list[str]]:
    bodies = TINY.findall(text)
    if not bodies:
        return [], []
    if not tools or not tools[0].parameters:
        return [], ["this environment has no tool with a parameter to call"]
    first = tools[0]
    return [ToolCall(first.name, {first.parameters[0]: body}) for body in bodies], []


def pick_format(name: str, tokenizer) -> str:
    """`auto`: the format whose opening tag the tokenizer knows as one token (else hermes)."""
    if name != "auto":
        PARSERS.get(name)  # an unknown name: one line listing the formats
        return name
    vocab = tokenizer.get_vocab()
    return "tiny" if "<call>" in vocab and "<tool_call>" not in vocab else "hermes"
