"""Prompt text -> token ids: through the tokenizer's chat template when it has one (a user turn after an
optional system prompt, then the assistant's turn opened), else the plain text."""

from __future__ import annotations

import functools

from rlft.types import Problem
from rlft.errors import ConfigError


class PromptEncoder:
    def __init__(self, tokenizer, chat_template: bool | None = None, system_prompt: str | None = None):
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template and not has_template:
            raise ConfigError("data.chat_template=true, but the model's tokenizer has no chat template")
        self.tokenizer, self.system_prompt = tokenizer, system_prompt
        self.chat = has_template if chat_template is None else chat_template
        if system_prompt and not self.chat:
            raise ConfigError("data.system_prompt goes into the chat template, but this run renders plain prompts "
                              "(the model's tokenizer has no chat template, or data.chat_template=false)")

    def __call__(self, prompt: str) -> list[int]:
        if not self.chat:
            return self.tokenizer.encode(prompt)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        text = self.tokenizer.apply_chat_template(messages + [{"role": "user", "content": prompt}],
                                                  add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)  # the template has its own specials

    @functools.cached_property
    def longest_token(self) -> int:
        """The longest token of the vocabulary, in characters: no token covers more of a prompt."""
        return max(map(len, self.tokenizer.get_vocab()), default=1)


def context_limit(model_max_positions: int | None, max_new_tokens: int, max_prompt_tokens: int | None) -> int | None:
    """The longest rendered prompt a run keeps: data.max_prompt_tokens, and never more than leaves room in the
    model's context for rollout.max_new_tokens of response (a longer prompt can't fit with its response);
    None: no limit (neither is known)."""
    if model_max_positions is None:
        return max_prompt_tokens
    room = model_max_positions - max_new_tokens
    if room < 1:
        raise ConfigError(f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                          f"context of {model_max_positions} positions")
    return room if max_prompt_tokens is None else min(room, max_prompt_tokens)


def describe_limit(model_max_positions: int | None, max_new_tokens: int, max_prompt_tokens: int | None) -> str:
    """What sets context_limit(...), for messages: "data.max_prompt_tokens=N" or the model's context."""
    limit = context_limit(model_max_positions, max_new_tokens, max_prompt_tokens)
    if limit is None or limit == max_prompt_tokens:
        return f"data.max_prompt_tokens={max_prompt_tokens}"
    return (f"the model's context ({model_max_positions} positions - rollout.max_new_tokens={max_new_tokens} "
            f"= {limit} prompt tokens)")


def drop_long_prompts(problems: list[Problem], encode: PromptEncoder, max_tokens: int | None, what: str,
                      reason: str | None = None) -> tuple[list[Problem], int]:
    """(the problems whose rendered prompt fits, how many were dropped); ConfigError when none fit.
    `reason` names the limit in that message (default: data.max_prompt_tokens)."""
    if max_tokens is None or not problems:
        return problems, 0
    # A prompt longer than max_tokens of the longest token (x4: a normalizer may merge characters) cannot fit,
    # and is not encoded: a tokenizer takes a minute over a 10 MB line.
    longest = getattr(encode, "longest_token", None)
    bound = None if longest is None else 4 * longest * (max_tokens + 1)
    kept = [p for p in problems if (bound is None or len(p.prompt) <= bound) and len(encode(p.prompt)) <= max_tokens]
    if not kept:
        reason = reason or f"data.max_prompt_tokens={max_tokens}"
        raise ConfigError(f"{reason}: every one of the {len(problems)} {what} prompts is longer")
    return kept, len(problems) - len(kept)
