"""Padding between lists of token ids and the rectangular tensors of a Rollout (rlft.types)."""

from __future__ import annotations

import torch


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
