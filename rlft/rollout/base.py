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
    # [N, P+R, layers, k] uint8: the MoE experts each token was routed to (only when asked for, R3 replay).
    # Padding, and the last sampled token (never fed back), hold expert 0: causal attention keeps them
    # out of every scored log-prob.
    routes: torch.Tensor | None = None

    @property
    def response_lengths(self) -> torch.Tensor:  # [N]
        return self.response_mask.sum(-1)

    def select(self, rows: torch.Tensor) -> "Rollout":
        """The rows at `rows` (indices or a bool mask), in order."""
        return Rollout(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows],
                       self.response_mask[rows], self.logprobs[rows], self.truncated[rows],
                       None if self.routes is None else self.routes[rows])


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


def right_pad(sequences: list[list], pad_value, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, mask), both [len(sequences), max(1, longest)], padding on the right."""
    width = max(1, max(len(s) for s in sequences))
    values = torch.full((len(sequences), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        values[row, :len(seq)] = torch.tensor(seq, dtype=dtype)
        mask[row, :len(seq)] = 1
    return values, mask


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts row-wise, re-padding prompts on the left and responses on the right."""
    if len(parts) == 1:
        return parts[0]

    def pad_to(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        fill = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
        return torch.cat([fill, t] if left else [t, fill], dim=1)

    p = max(r.prompt_ids.shape[1] for r in parts)
    w = max(r.response_ids.shape[1] for r in parts)
    routes = None
    if all(r.routes is not None for r in parts):
        def pad_routes(r: Rollout) -> torch.Tensor:
            own_p, own_w = r.prompt_ids.shape[1], r.response_ids.shape[1]
            rows, _, layers, k = r.routes.shape
            out = torch.zeros((rows, p + w, layers, k), dtype=r.routes.dtype)
            out[:, p - own_p:p + own_w] = r.routes
            return out
        routes = torch.cat([pad_routes(r) for r in parts])
    return Rollout(
        prompt_ids=torch.cat([pad_to(r.prompt_ids, p, pad_id, True) for r in parts]),
        prompt_mask=torch.cat([pad_to(r.prompt_mask, p, 0, True) for r in parts]),
        response_ids=torch.cat([pad_to(r.response_ids, w, pad_id, False) for r in parts]),
        response_mask=torch.cat([pad_to(r.response_mask, w, 0, False) for r in parts]),
        logprobs=torch.cat([pad_to(r.logprobs, w, 0.0, False) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        routes=routes,
    )


def place_routes(per_request: list[torch.Tensor], prompt_lens: list[int], prompt_width: int,
                 response_width: int) -> torch.Tensor:
    """Per-request routes [tokens_i, layers, k] (prompt tokens first, then response tokens; an engine may
    leave out the last) -> [N, P+R, layers, k], aligned with cat([prompt_ids, response_ids], 1)."""
    layers, k = per_request[0].shape[1:]
    largest = max((int(r.max()) for r in per_request if r.numel()), default=0)
    dtype = torch.uint8 if largest < 256 else torch.int16  # up to 256 experts in one byte
    out = torch.zeros((len(per_request), prompt_width + response_width, layers, k), dtype=dtype)
    for row, (routes, plen) in enumerate(zip(per_request, prompt_lens)):
        start = prompt_width - plen
        take = min(routes.shape[0], plen + response_width)
        out[row, start:start + take] = routes[:take].to(dtype)
    return out
