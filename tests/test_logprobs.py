"""response_logprobs: the prompt-shared pass (each distinct prompt once) and the packed pass (no padding)
compute the full padded pass's function."""

import pytest
import torch

from rlft.learner.logprobs import model_packing, pack, response_logprobs, supports_packing, unique_rows
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


def logprobs_and_grads(model, batch, share: bool = False, packed: bool = False):
    model.zero_grad()
    logp = response_logprobs(model, *batch, temperature=0.7, share_prompts=share, padding_free=packed)
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


def uneven_batch(response_len: int):
    """Distinct prompts of 1 to 6 tokens (left-padded), responses of 1 to response_len (right-padded)."""
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(2, 20, (8, 6), generator=gen)
    response_ids = torch.randint(2, 20, (8, response_len), generator=gen)
    prompt_mask = torch.stack([(torch.arange(6) >= 6 - n).long() for n in [6, 2, 1, 6, 3, 2, 6, 1]])
    response_mask = torch.stack([(torch.arange(response_len) < min(n, response_len)).long()
                                 for n in [6, 1, 2, 6, 1, 3, 1, 2]])
    prompt_ids[prompt_mask == 0], response_ids[response_mask == 0] = 0, 0
    return prompt_ids, prompt_mask, response_ids, response_mask


def test_packing_puts_whole_sequences_end_to_end_in_rows_no_wider_than_the_longest():
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])      # sequences of 5, 4 and 3 tokens
    packing = pack(prompt_mask, response_mask)
    assert (packing.rows, packing.width) == (3, 5)                      # nothing fits beside another
    packing = pack(prompt_mask, response_mask, width=8)
    assert (packing.rows, packing.width) == (2, 8)                      # 5 + 3 | 4 + tail
    assert packing.tokens.tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 5, 6, 7]
    assert packing.positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 1, 2, 3]]
    assert packing.real.tolist() == [[1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]]
    # the token before each response token: the prompt's last, then the response's own
    assert packing.predictors.tolist() == [1, 2, 3, 10, 5, 6]


@pytest.mark.parametrize("response_len", [1, 6])
def test_the_packed_pass_equals_the_padded_pass_and_its_gradients(model, response_len):
    batch = uneven_batch(response_len)
    packing = model_packing(model, batch[1], batch[3])
    assert packing is not None and packing.rows < len(batch[0])  # short sequences share rows
    padded, padded_grads = logprobs_and_grads(model, batch)
    packed, packed_grads = logprobs_and_grads(model, batch, packed=True)
    assert padded.abs().sum() > 0
    assert torch.allclose(packed, padded, rtol=0, atol=1e-10)
    for name, grad in padded_grads.items():
        assert (packed_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max(), name
    _, padded_entropy = response_logprobs(model, *batch, with_entropy=True)
    _, packed_entropy = response_logprobs(model, *batch, with_entropy=True, padding_free=True)
    assert torch.allclose(packed_entropy, padded_entropy, rtol=0, atol=1e-10)


def test_a_model_that_mixes_packed_sequences_is_caught_and_the_learner_pads(model, monkeypatch):
    import transformers.masking_utils
    from rlft.learner.policy import Policy
    assert supports_packing(model)
    # as in attention code that ignores where packed sequences start: one causal mask over the whole row
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda positions: None)
    batch = uneven_batch(6)
    assert not torch.allclose(response_logprobs(model, *batch, padding_free=True), response_logprobs(model, *batch))
    assert not supports_packing(model)
    with pytest.warns(UserWarning, match="compute.layout: .* the learner pads instead of packing"):
        learner = Policy(model, padding_free=True)
    assert not learner.padding_free


def test_each_pass_takes_the_layout_that_feeds_the_model_fewer_tokens(model):
    from rlft.learner.logprobs import plan_pass
    gen = torch.Generator().manual_seed(0)

    def batch(prompt_len, response_lengths):
        width = max(response_lengths)
        prompt_ids = torch.randint(2, 20, (1, prompt_len), generator=gen).repeat(len(response_lengths), 1)
        response_mask = torch.stack([(torch.arange(width) < n).long() for n in response_lengths])
        return prompt_ids, torch.ones_like(prompt_ids), response_mask

    long_prompt = batch(30, [4, 4, 3, 4])            # one 30-token prompt shared by four short answers
    shared, packing = plan_pass(model, *long_prompt, share_prompts=True, padding_free=True)
    assert shared and packing is None
    uneven = batch(2, [40, 1, 2, 1, 3, 40, 1, 2])    # a short prompt, answers from 1 to 40 tokens
    shared, packing = plan_pass(model, *uneven, share_prompts=True, padding_free=True)
    assert not shared and packing is not None and packing.rows < 8
    assert plan_pass(model, *uneven, share_prompts=True, padding_free=False) == (True, None)
    assert plan_pass(model, *long_prompt, share_prompts=False, padding_free=True) == (False, None)  # all alike
