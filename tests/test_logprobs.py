"""response_logprobs: the prompt-shared pass (each distinct prompt once) is the full pass's function."""

import pytest
import torch

from rlft.learner.logprobs import response_logprobs, unique_rows
from rlft.models.loading import load_causal_lm, resolve_model_path


def group_batch(prompts: int = 5, group: int = 4, prompt_len: int = 6, response_len: int = 5):
    """Left-padded prompts repeated `group` times, right-padded random responses."""
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(2, 20, (prompts, prompt_len), generator=gen)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[::2, :2] = 0                       # shorter prompts, left-padded
    prompt_ids[prompt_mask == 0] = 0
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(group, 0), prompt_mask.repeat_interleave(group, 0)
    response_ids = torch.randint(2, 20, (prompts * group, response_len), generator=gen)
    response_mask = torch.ones_like(response_ids)
    response_mask[::3, 2:] = 0                     # responses that stopped early
    response_ids[response_mask == 0] = 0
    return prompt_ids, prompt_mask, response_ids, response_mask


@pytest.fixture(scope="module")
def model():
    return load_causal_lm(resolve_model_path("builtin:tiny-adder"), "float32", "cpu").double()


def logprobs_and_grads(model, batch, share: bool):
    model.zero_grad()
    logp = response_logprobs(model, *batch, temperature=0.7, share_prompts=share)
    (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp).double()).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("response_len", [1, 5])
def test_prompt_shared_pass_equals_the_full_pass_and_its_gradients(model, response_len):
    batch = group_batch(response_len=response_len)
    full, full_grads = logprobs_and_grads(model, batch, share=False)
    shared, shared_grads = logprobs_and_grads(model, batch, share=True)
    assert full.abs().sum() > 0
    assert torch.allclose(shared, full, rtol=0, atol=1e-10)
    # The group's gradients reach the one shared prompt pass. Not to float64 round-off: transformers'
    # RMSNorm computes in float32, and the group's gradients are summed before it here, after it there.
    for name, grad in full_grads.items():
        assert (shared_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max(), name


def test_rows_with_the_same_ids_but_another_mask_are_distinct_prompts():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [0, 5, 6], [7, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])  # row 2: token 0 is real
    distinct_ids, distinct_mask, row_prompt = unique_rows(ids, mask)
    assert len(distinct_ids) == 3
    assert row_prompt[0] == row_prompt[1] != row_prompt[2] != row_prompt[3]
    assert torch.equal(distinct_ids[row_prompt], ids) and torch.equal(distinct_mask[row_prompt], mask)
