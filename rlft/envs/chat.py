"""Token ids for an episode's non-model parts, from the tokenizer's chat template, without ever rendering
(or re-tokenising) what the model generated.

The prompt is the template applied to the first messages (with the tools' schemas and the generation
prompt). An observation is the template's text *between* the end of a model turn and the start of the
next one: rlft renders a fixed placeholder conversation with and without the observation messages and
takes the difference. So a template that rewrites earlier turns (Qwen3 drops old <think> blocks, some
templates re-indent tool calls) changes nothing: earlier turns are never rendered again, the episode's
ids are the sampled ids plus these deltas.
"""

from __future__ import annotations

import json

from rlft.envs.base import Message
from rlft.errors import ConfigError

PLACEHOLDER = "\u2063rlft-turn\u2063"  # invisible separators: text no real turn contains

HERMES_TOOLS_PROMPT = (
    "You may call these tools. To call one, write on its own line\n"
    '<tool_call>{{"name": NAME, "arguments": {{...}}}}</tool_call>\n'
    "and wait for the result. Tools:\n{tools}")


class EpisodeTokenizer:
    def __init__(self, tokenizer, tools: list[dict], tool_format: str):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("env: multi-turn episodes need a chat template, and this model's tokenizer has none "
                              "(use a chat model, or the built-in model=tiny_calculator)")
        self.tokenizer, self.tools = tokenizer, tools or None
        # A template that ignores `tools` would hide them from the model: then they go in a system message.
        self.tools_in_system = bool(tools) and tool_format == "hermes" and "tools" not in tokenizer.chat_template
        base = [{"role": "user", "content": "?"}, {"role": "assistant", "content": PLACEHOLDER}]
        self._base = base
        self._head = self._render(base, generation_prompt=False)
        end = self._head.rfind(PLACEHOLDER)
        if end < 0:
            raise ConfigError("env: the chat template does not render an assistant message's content as it is")
        self._turn_end = self._head[end + len(PLACEHOLDER):]  # e.g. "<|im_end|>\n": the template's turn end

    def check(self) -> None:
        """At start-up: the template can append a tool message after a model turn."""
        try:
            self.observation_ids([{"role": "tool", "name": "tool", "content": "1"}], "")
        except ValueError as err:
            raise ConfigError(f"env: {err}") from None

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        if self.tools_in_system:
            messages = _with_tools_system(messages, self.tools)
        text = self._render(messages, generation_prompt=True, tools=self.tools)
        return self.tokenizer.encode(text, add_special_tokens=False)  # the template has its own specials

    def observation_ids(self, messages: list[Message], turn_end_text: str) -> list[int]:
        """The ids that follow a model turn: the rest of the template's turn end (`turn_end_text` is what the
        model itself wrote of it, its stop token's text), the observation messages, the next generation
        prompt."""
        full = self._render(self._base + messages, generation_prompt=True)
        if not full.startswith(self._head):
            raise ValueError("the chat template renders the earlier turns differently once an observation "
                             "follows: rlft cannot append one without re-rendering the episode")
        glue = self._turn_end[len(turn_end_text):] if turn_end_text and self._turn_end.startswith(turn_end_text) \
            else self._turn_end
        return self.tokenizer.encode(glue + full[len(self._head):], add_special_tokens=False)

    def _render(self, messages: list[Message], generation_prompt: bool, tools: list[dict] | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                                      tokenize=False)
        except Exception as err:  # jinja's errors: roles the template refuses (some allow no `tool` role)
            raise ConfigError(f"env: the model's chat template cannot render this conversation: "
                              f"{type(err).__name__}: {err}") from None


def _with_tools_system(messages: list[Message], tools: list[dict]) -> list[Message]:
    described = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t["function"]) for t in tools))
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + described}] + messages[1:]
    return [{"role": "system", "content": described}] + messages
