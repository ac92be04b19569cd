"""Per-token log-probabilities of a response under a causal LM."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


def response_logprobs(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      response_ids: torch.Tensor, response_mask: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = False, share_prompts: bool = False
                      ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[N, R] log pi(response token | prefix) at the sampling temperature, 0 on padding;
    with `with_entropy`, also the [N, R] entropy of each position's distribution (no gradient).

    prompt_ids is left-padded and response_ids right-padded ([N, P] and [N, R]), so the response starts
    at column P for every row. Only the positions that predict response tokens are projected onto the
    vocabulary, and the chosen token's log-prob is logit - logsumexp(logits): no full log-softmax tensor
    is kept. `share_prompts`: each distinct prompt goes through the model once, and the responses of its
    group attend to its keys and values (see prompt_shared_logits).
    """
    device = model.device
    distinct = len(unique_rows(prompt_ids, prompt_mask)[0]) if share_prompts else len(prompt_ids)
    if distinct < len(prompt_ids):
        logits = prompt_shared_logits(model, prompt_ids, prompt_mask, response_ids, response_mask)
    else:
        logits = full_sequence_logits(model, prompt_ids, prompt_mask, response_ids, response_mask)
    logits = logits.float()                                                   # [N, R, V]
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    chosen = logits.gather(-1, response_ids.to(device)[..., None])[..., 0]     # [N, R]
    log_normaliser = torch.logsumexp(logits, dim=-1)
    mask = response_mask.to(device)
    logp = (chosen - log_normaliser) * mask
    if not with_entropy:
        return logp
    with torch.no_grad():
        entropy = log_normaliser - (logits.softmax(-1) * logits).sum(-1)
    return logp, entropy * mask


def full_sequence_logits(model, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
    """[N, R, V]: one pass over every prompt + response row."""
    ids = torch.cat([prompt_ids, response_ids], dim=1)                         # [N, P+R]
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    r, device = response_ids.shape[1], model.device
    return model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                 logits_to_keep=r + 1, use_cache=False).logits[:, :-1]


def prompt_shared_logits(model, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
    """[N, R, V] as full_sequence_logits, with each distinct prompt computed once.

    A group's G responses share one prompt: its pass yields the keys/values every response attends to and
    the logits of the first response token. The keys/values are gathered to one row per response (the
    gather's backward sums the group's gradients into the shared prompt pass), then the responses run
    after them. Same function, less work: the prompt tokens cost 1/G of the full pass.
    """
    device = model.device
    unique_ids, unique_mask, row_prompt = unique_rows(prompt_ids, prompt_mask)
    cache = DynamicCache(config=model.config)
    prompt_positions = (unique_mask.cumsum(-1) - 1).clamp(min=0)
    prompt_out = model(input_ids=unique_ids.to(device), attention_mask=unique_mask.to(device),
                       position_ids=prompt_positions.to(device), past_key_values=cache, use_cache=True,
                       logits_to_keep=1)
    row_prompt = row_prompt.to(device)
    first = prompt_out.logits[:, -1][row_prompt][:, None]                      # [N, 1, V]: left padding
    if response_ids.shape[1] == 1:
        return first
    cache.batch_select_indices(row_prompt)                                     # [U, ...] -> [N, ...]
    inputs = response_ids[:, :-1]           # the last response token predicts nothing that is scored
    mask = torch.cat([prompt_mask, response_mask[:, :-1]], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, prompt_ids.shape[1]:]
    rest = model(input_ids=inputs.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                 past_key_values=cache, use_cache=True).logits                # [N, R-1, V]
    return torch.cat([first, rest], dim=1)


def unique_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct prompt ids [U, P], their masks [U, P], each row's index among them [N])."""
    keyed = torch.cat([prompt_ids, prompt_mask], dim=1)
    distinct, row_prompt = torch.unique(keyed, dim=0, return_inverse=True)
    width = prompt_ids.shape[1]
    return distinct[:, :width], distinct[:, width:], row_prompt
