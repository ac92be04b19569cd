"""The work of a step, counted: FLOPs and bytes of each phase from its token counts and the model's shape.

The count is a floor, the least work that gives the step's result, so that work / peak is a time no
implementation can beat (Kaplan et al. 2020, arXiv 2001.08361, section 2.1: a forward pass costs 2N FLOPs
per token, a backward 4N):

- `N` is the matrix-multiply weights a token meets: every 2-D (or expert) weight outside the embedding
  tables. The LM head (hidden x vocab) is counted apart, because it runs only at positions whose next
  token is scored; an embedding is a lookup, no FLOPs. Biases and norms are elementwise: left out.
  Mixture of experts: expert weights count at top_k / experts, the share a token is routed through.
- The body runs on each group's prompt once (rlft's engine and learner both share a group's prompt) and
  on every response token but the last (nothing reads its keys or values). Causal attention adds
  4 x layers x (heads x head_dim) per key a position attends to (q.k and the weighted sum of v).
- generate: one forward over those tokens (prefill and decode alike). Batched decode also reads every
  weight once per step, so its floor is max(FLOPs / peak FLOP/s, steps x weight bytes / peak bytes/s).
- reference: one forward, no gradients. forward: one per PPO epoch (the first epoch's passes give the
  old log-probs too). backward: twice the forward (gradients of the activations and of the weights);
  with LoRA the base weights take no gradient, so its matrix products cost one forward, not two.

Not counted: dynamic sampling's dropped groups (the rollout holds the kept ones), tokens a partial rollout
generated in an earlier step, LoRA's adapters, softmax and norms, the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.types import Rollout

PHASES = ("generate", "reference", "forward", "backward")


@dataclass(frozen=True)
class ModelShape:
    """What the count needs of a model."""

    body_params: float     # matrix-multiply weights per token, outside the embeddings and the LM head (MoE: active)
    head_params: int       # hidden x vocab: the LM head, run at each scored position
    layers: int
    attention_width: int   # heads x head_dim: the width of the q.k and attention-times-v products
    weight_bytes: int      # every weight (all experts) in the model's dtype: what one decode step reads


@dataclass(frozen=True)
class Tokens:
    """A rollout's token counts, as the floor needs them."""

    fed: int           # positions through the body: each group's prompt once, every response token but the last
    scored: int        # tokens the policy sampled: one LM-head row each (the engine's, and the learner's log-probs)
    attended: int      # keys attended, summed over the fed positions (causal: position i sees i + 1 keys)
    decode_steps: int  # the longest response: steps of one batched decode


@dataclass(frozen=True)
class Roof:
    """What the devices of a phase can do at best (rlft.tooling.peaks: measured)."""

    flops_per_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class PhaseWork:
    flops: float
    bytes: float

    def floor_seconds(self, roof: Roof) -> float:
        """The roofline: no run of this work is faster than its compute or its memory traffic allows."""
        return max(self.flops / roof.flops_per_s, self.bytes / roof.bytes_per_s)


def model_shape(model: torch.nn.Module, dtype_bytes: int) -> ModelShape:
    """The shape of a Hugging Face causal LM (its weights may be on the meta device: only shapes are read);
    `dtype_bytes`: the size of one weight as the engine holds it."""
    config = model.config
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = model.get_output_embeddings().weight
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    routed = (getattr(config, "num_experts_per_tok", None) or 1) / experts if experts else 1.0
    body, total = 0.0, 0
    for name, p in model.named_parameters():  # tied weights once (named_parameters skips repeats)
        total += p.numel()
        if p.dim() < 2 or id(p) in embeddings or p is head:
            continue
        body += p.numel() * (routed if ".experts." in name else 1.0)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(body_params=body, head_params=head.numel(), layers=config.num_hidden_layers,
                      attention_width=heads * head_dim, weight_bytes=total * dtype_bytes)


def rollout_tokens(rollout: Rollout, groups: int) -> Tokens:
    """The counts of a rollout of `groups` groups (rows of a group adjacent, sharing their prompt)."""
    prompt = rollout.prompt_mask[:: rollout.size // groups].sum(-1).long()   # [groups] each prompt once
    prompt_of_row = rollout.prompt_mask.sum(-1).long()                       # [N]
    fed = (rollout.response_mask.sum(-1).long() - 1).clamp(min=0)            # [N] response positions fed
    # a prompt position i attends to i + 1 keys: p (p + 1) / 2 per prompt; the f fed response positions of a
    # row sit after its p prompt tokens: f p + f (f + 1) / 2
    attended = (prompt * (prompt + 1) // 2).sum() + (fed * prompt_of_row + fed * (fed + 1) // 2).sum()
    lengths = rollout.response_lengths
    return Tokens(fed=int(prompt.sum() + fed.sum()), scored=int(lengths.sum()), attended=int(attended),
                  decode_steps=int(lengths.max()) if lengths.numel() else 0)


def forward_flops(shape: ModelShape, tokens: Tokens) -> tuple[float, float]:
    """(matrix-multiply FLOPs through the weights, attention FLOPs) of one forward over the tokens."""
    weights = 2 * shape.body_params * tokens.fed + 2 * shape.head_params * tokens.scored
    return weights, 4 * shape.layers * shape.attention_width * tokens.attended


def step_work(shape: ModelShape, tokens: Tokens, *, ppo_epochs: int, reference: bool, weight_grads: bool = True
              ) -> dict[str, PhaseWork]:
    """Each phase's floor work. `reference`: a reference pass runs (kl_coef > 0); `weight_grads`: False under
    LoRA (the base weights take no gradient). Bytes: a decode step reads every weight; every other pass
    reads them once (backward also writes a gradient of each, when it computes them)."""
    weights, attention = forward_flops(shape, tokens)
    forward = weights + attention
    backward = (2 if weight_grads else 1) * weights + 2 * attention
    w = shape.weight_bytes
    return {"generate": PhaseWork(forward, tokens.decode_steps * w),
            "reference": PhaseWork(forward, w) if reference else PhaseWork(0.0, 0.0),
            "forward": PhaseWork(ppo_epochs * forward, ppo_epochs * w),
            "backward": PhaseWork(ppo_epochs * backward, ppo_epochs * (2 if weight_grads else 1) * w)}
