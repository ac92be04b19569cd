"""Per-token log-probabilities of a response under a causal LM."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def response_logprobs(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      response_ids: torch.Tensor, response_mask: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[N, R] log pi(response token | prefix) at the sampling temperature, 0 on padding;
    with `with_entropy`, also the [N, R] entropy of each position's distribution (no gradient).

    prompt_ids is left-padded and response_ids right-padded ([N, P] and [N, R]), so the response starts
    at column P for every row. Only the R + 1 last positions are projected onto the vocabulary, and the
    chosen token's log-prob is logit - logsumexp(logits): no full log-softmax tensor is kept.
    """
    ids = torch.cat([prompt_ids, response_ids], dim=1)                       # [N, P+R]
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    r = response_ids.shape[1]
    device = model.device
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                   logits_to_keep=r + 1, use_cache=False).logits[:, :-1]         # [N, R, V]
    logits = logits.float()
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
