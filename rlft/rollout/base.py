"""What every rollout engine takes and returns, so engines (HF now, vLLM later) are interchangeable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1                  # responses per prompt (the group size)
    temperature: float = 1.0    # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 16


@dataclass
class Rollout:
    """Responses to N = len(prompts) * n requests; the n responses to one prompt are adjacent rows.

    The prompt is left-padded and the response right-padded, so `cat([prompt_ids, response_ids], 1)` is a
    batch the learner can score directly: the response always starts at column P.
    """

    prompt_ids: torch.Tensor      # [N, P] long, left-padded with pad_id
    prompt_mask: torch.Tensor     # [N, P] long, 1 on prompt tokens
    response_ids: torch.Tensor    # [N, R] long, right-padded with pad_id
    response_mask: torch.Tensor   # [N, R] long, 1 on generated tokens (EOS included)
    logprobs: torch.Tensor        # [N, R] float32, the engine's log-prob of each generated token, 0 on padding
    truncated: torch.Tensor       # [N] bool, True where max_new_tokens was hit before EOS

    @property
    def response_lengths(self) -> torch.Tensor:  # [N]
        return self.response_mask.sum(-1)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def rng_state(self) -> torch.Tensor: ...

    def set_rng_state(self, state: torch.Tensor) -> None: ...


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both [len(sequences), longest], padding on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask
