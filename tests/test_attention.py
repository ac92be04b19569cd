"""The grouped sdpa variant (rlft.models.attention) computes what transformers' sdpa computes."""

import torch

from rlft.learner.logprobs import pack, packed_logits, prompt_shared_logits
from rlft.models.attention import GROUPED_SDPA, grouped_sdpa_forward
from rlft.models.loading import load_causal_lm, resolve_model_path

PATH = resolve_model_path("builtin:tiny-adder")  # 4 query heads over 2 key/value heads


def both():
    grouped = load_causal_lm(PATH, "float32", "cpu")
    plain = load_causal_lm(PATH, "float32", "cpu", attn_implementation="sdpa")
    assert grouped.config._attn_implementation == GROUPED_SDPA
    assert plain.config._attn_implementation == "sdpa"
    assert grouped.config.num_key_value_heads < grouped.config.num_attention_heads
    return grouped, plain


def batch():
    torch.manual_seed(0)
    prompt_ids = torch.randint(3, 20, (4, 6))
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[0, :2] = 0       # left padding
    prompt_ids[2:] = prompt_ids[0]  # rows 2 and 3 share row 0's prompt
    prompt_mask[2:] = prompt_mask[0]
    response_ids = torch.randint(3, 20, (4, 5))
    response_mask = torch.ones_like(response_ids)
    response_mask[1, 3:] = 0     # right padding
    return prompt_ids, prompt_mask, response_ids, response_mask


def test_grouped_heads_equal_repeated_heads_under_a_mask():
    class Attention(torch.nn.Module):
        num_key_value_groups = 3

    query, key, value = torch.randn(2, 6, 4, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    mask = torch.ones(2, 1, 4, 7, dtype=torch.bool)
    mask[0, ..., :3] = False
    out, _ = grouped_sdpa_forward(Attention(), query, key, value, mask, scaling=0.3)
    repeated = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), attn_mask=mask, scale=0.3)
    assert out.shape == (2, 4, 6, 8)  # [B, Q, H, D], as transformers' sdpa returns it
    assert torch.allclose(out, repeated.transpose(1, 2), atol=1e-6)


def test_logits_and_gradients_equal_transformers_sdpa_padded_shared_and_packed():
    grouped, plain = both()
    prompt_ids, prompt_mask, response_ids, response_mask = batch()
    ids = torch.cat([prompt_ids, response_ids], 1)
    mask = torch.cat([prompt_mask, response_mask], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    packing = pack(prompt_mask, response_mask)
    passes = {
        "padded": lambda m: m(input_ids=ids, attention_mask=mask, position_ids=positions).logits,
        "shared prompts (a KV cache, a mask)": lambda m: prompt_shared_logits(
            m, prompt_ids, prompt_mask, response_ids, response_mask),
        "packed (positions restart, no mask)": lambda m: packed_logits(
            m, prompt_ids, prompt_mask, response_ids, response_mask, packing),
    }
    for name, run in passes.items():
        ours, theirs = run(grouped), run(plain)
        assert torch.allclose(ours, theirs, atol=1e-5), name
        weight = lambda m: m.model.layers[0].self_attn.k_proj.weight  # noqa: E731
        (ours * torch.linspace(-1, 1, ours.shape[-1])).sum().backward()
        (theirs * torch.linspace(-1, 1, theirs.shape[-1])).sum().backward()
        assert torch.allclose(weight(grouped).grad, weight(plain).grad, atol=1e-4), name
        grouped.zero_grad(), plain.zero_grad()


def test_an_explicit_attention_choice_is_kept():
    assert load_causal_lm(PATH, "float32", "cpu", attn_implementation="eager").config._attn_implementation == "eager"
