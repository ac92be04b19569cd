"""Per-token log-probabilities of a response under a causal LM."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


def response_logprobs(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      response_ids: torch.Tensor, response_mask: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = False, share_prompts: bool = False, padding_free: bool = False,
                      plan: tuple[bool, Packing | None] | None = None
                      ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[N, R] log pi(response token | prefix) at the sampling temperature, 0 on padding;
    with `with_entropy`, also the [N, R] entropy of each position's distribution (no gradient).

    prompt_ids is left-padded and response_ids right-padded ([N, P] and [N, R]), so the response starts
    at column P for every row. Only the positions that predict response tokens are projected onto the
    vocabulary, and the chosen token's log-prob is logit - logsumexp(logits): no full log-softmax tensor
    is kept. `share_prompts`: each distinct prompt goes through the model once, and the responses of its
    group attend to its keys and values (see prompt_shared_logits); `padding_free` packs the sequences
    end to end into fewer rows, no compute on padding (see pack). With both, plan_pass picks per pass;
    `plan`, a plan_pass result made beforehand, is used instead of those two.
    """
    device = model.device
    mask = response_mask.to(device)
    if plan is None:
        plan = plan_pass(model, prompt_ids, prompt_mask, response_mask, share_prompts, padding_free)
    shared, packing = plan
    if shared:
        logits = prompt_shared_logits(model, prompt_ids, prompt_mask, response_ids, response_mask)
    elif packing is not None:
        scored = mask.bool()
        logits = packed_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, packing)  # [K, V]
        out = chosen_logprobs(logits, response_ids.to(device)[scored], temperature, with_entropy)
        # back to [N, R], zeros on padding (masked_scatter keeps the gradient)
        unpacked = [torch.zeros(mask.shape, dtype=part.dtype, device=device).masked_scatter(scored, part)
                    for part in out]
        return tuple(unpacked) if with_entropy else unpacked[0]
    else:
        logits = full_sequence_logits(model, prompt_ids, prompt_mask, response_ids, response_mask)
    out = chosen_logprobs(logits, response_ids.to(device), temperature, with_entropy)
    return tuple(part * mask for part in out) if with_entropy else out[0] * mask


def plan_pass(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
              response_mask: torch.Tensor, share_prompts: bool, padding_free: bool) -> tuple[bool, Packing | None]:
    """(whether to share prompts, the packing or None) for one pass: packed where that feeds the model
    clearly fewer token positions than sharing (or than padding, where no prompt repeats), else shared
    where prompts repeat, else padded. Sharing pays with long prompts, packing with uneven responses."""
    rows, prompt_width = prompt_ids.shape
    distinct = len(unique_rows(prompt_ids, prompt_mask)[0]) if share_prompts else rows
    shared_tokens = distinct * prompt_width + response_mask.numel() if distinct < rows else None
    packing = model_packing(model, prompt_mask, response_mask, shared_tokens) if padding_free else None
    return packing is None and distinct < rows, packing


def chosen_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
                    ) -> tuple[torch.Tensor, ...]:
    """(log-prob of each target token,) and its position's entropy (no gradient) with `with_entropy`;
    logits [..., V] and targets [...]."""
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    log_normaliser = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[..., None])[..., 0] - log_normaliser
    if not with_entropy:
        return (logp,)
    with torch.no_grad():
        entropy = log_normaliser - (logits.softmax(-1) * logits).sum(-1)
    return logp, entropy


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


@dataclass
class Packing:
    """Where a padded batch's real tokens go when packed: rows of `width` tokens, each holding whole
    sequences end to end (first-fit, longest first), positions restarting at 0 for each sequence.

    `tokens`: the flat packed index of each real token, the padded batch's real tokens taken row by row
    (prompt then response); `predictors`: the flat packed index of the token that predicts each real
    response token, in the same order; `real`: [rows, width] 1 on packed real tokens.
    """
    rows: int
    width: int
    tokens: torch.Tensor
    predictors: torch.Tensor
    positions: torch.Tensor
    real: torch.Tensor


def pack(prompt_mask: torch.Tensor, response_mask: torch.Tensor, width: int | None = None) -> Packing:
    """The packing of a left-padded prompt / right-padded response batch into rows of `width` tokens
    (default: the longest sequence's length, so no packed row costs more attention than a padded one)."""
    prompt_mask, response_mask = prompt_mask.cpu(), response_mask.cpu()  # a layout: built on the CPU
    real = torch.cat([prompt_mask, response_mask], dim=1).bool()
    lengths = real.sum(-1).tolist()
    width = width or max(lengths)
    room: list[int] = []                                   # free tokens left in each packed row
    row_of, offset_of = [0] * len(lengths), [0] * len(lengths)
    for seq in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, free in enumerate(room) if free >= lengths[seq]), None)
        if row is None:
            row = len(room)
            room.append(width)
        row_of[seq], offset_of[seq] = row, width - room[row]
        room[row] -= lengths[seq]
    place = torch.tensor(row_of) * width + torch.tensor(offset_of)            # where each sequence starts
    within = real.cumsum(-1) - 1                                              # each token's position
    tokens = (place[:, None] + within)[real]
    # response token j is predicted by the sequence's token before it: the prompt's last for j = 0
    prompt_lengths = prompt_mask.sum(-1)
    response_positions = prompt_lengths[:, None] + torch.arange(response_mask.shape[1]) - 1
    predictors = (place[:, None] + response_positions)[response_mask.bool()]
    packed_real = torch.zeros(len(room) * width, dtype=torch.long)
    packed_real[tokens] = 1
    # padding at the end of a row counts 0, 1, 2...: a sequence of its own that no real token attends to
    tail = (1 - packed_real).view(len(room), width)
    positions = torch.zeros(len(room) * width, dtype=torch.long)
    positions[tokens] = within[real]
    positions = torch.where(packed_real.bool(), positions, (tail.cumsum(-1) - 1).flatten())
    return Packing(len(room), width, tokens, predictors, positions.view(len(room), width),
                   packed_real.view(len(room), width))


def packed_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, packing: Packing) -> torch.Tensor:
    """[K, V] for the K real response tokens (row by row), padding-free: each packed row holds whole
    sequences end to end, with positions restarting at 0 for each and no attention mask, and
    transformers keeps the sequences apart from the positions alone (a block-diagonal causal mask;
    variable-length kernels under flash attention). supports_packing() checks a model does.
    """
    device = model.device
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    real = torch.cat([prompt_mask, response_mask], dim=1).bool()
    packed = ids.new_zeros(packing.rows * packing.width)
    packed[packing.tokens.to(ids.device)] = ids[real]
    head = model.get_output_embeddings()
    predictors = packing.predictors.to(device)

    def project_predictors_only(module, args):  # logits_to_keep takes one index set for all rows
        hidden = args[0]
        return (hidden.reshape(-1, hidden.shape[-1])[predictors][None],) + args[1:]

    handle = head.register_forward_pre_hook(project_predictors_only)
    try:
        return model(input_ids=packed.view(packing.rows, packing.width).to(device),
                     position_ids=packing.positions.to(device), use_cache=False).logits[0]
    finally:
        handle.remove()


# A packed pass pays for its explicit block mask: run one only where it feeds the model at most this
# share of the token positions of the alternative (measured on CPU, scripts/bench_learner_pass.py).
PACKING_WORTH = 0.8


def model_packing(model: PreTrainedModel, prompt_mask: torch.Tensor, response_mask: torch.Tensor,
                  alternative_tokens: int | None = None) -> Packing | None:
    """The packing this model runs fastest, or None where the alternative (`alternative_tokens`
    positions; default the padded batch) is as fast. Flash attention runs packed sequences by their
    lengths: one row for the whole batch. Other attention (sdpa, eager) computes each row's full square
    under a mask: rows as wide as the longest sequence.
    """
    alternative_tokens = alternative_tokens or prompt_mask.numel() + response_mask.numel()
    if "flash" in str(getattr(model.config, "_attn_implementation", "")):
        packing = pack(prompt_mask, response_mask, int(prompt_mask.sum() + response_mask.sum()))
    else:
        packing = pack(prompt_mask, response_mask)
    return packing if packing.rows * packing.width <= PACKING_WORTH * alternative_tokens else None


@torch.no_grad()
def supports_packing(model: PreTrainedModel) -> bool:
    """Whether `model` keeps packed sequences apart (see packed_logits). Two short sequences go in packed
    and one alone; the second's logits must match its own pass far more closely than when it attends to
    the first. Models whose attention ignores the packed positions (older or custom code) fail."""
    vocab = model.get_input_embeddings().num_embeddings
    first, second = torch.arange(1, 6) % vocab, torch.arange(7, 10) % vocab
    device = model.device

    def logits(ids, positions, attention_mask=None):
        return model(input_ids=ids[None].to(device), position_ids=positions[None].to(device),
                     attention_mask=None if attention_mask is None else attention_mask[None].to(device),
                     use_cache=False).logits[0, -len(second):].float()

    both = torch.cat([first, second])
    restarted = torch.cat([torch.arange(len(first)), torch.arange(len(second))])
    alone = logits(second, torch.arange(len(second)))
    packed_gap = (logits(both, restarted) - alone).abs().max()
    mixed_gap = (logits(both, restarted, torch.ones(len(both), dtype=torch.long)) - alone).abs().max()
    return bool(packed_gap <= 0.01 * mixed_gap) or bool(packed_gap < 1e-6)


def unique_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct prompt ids [U, P], their masks [U, P], each row's index among them [N])."""
    keyed = torch.cat([prompt_ids, prompt_mask], dim=1)
    distinct, row_prompt = torch.unique(keyed, dim=0, return_inverse=True)
    width = prompt_ids.shape[1]
    return distinct[:, :width], distinct[:, width:], row_prompt
