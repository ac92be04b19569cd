"""Rollout engine on a Hugging Face transformers model: batched sampling with a KV cache.

The engine holds its own copy of the weights, as a vLLM engine would; the learner pushes new weights
through `update_weights` after every optimizer step. Sampling is a plain loop (not `model.generate`) so
that it draws from the engine's own seeded generator, which a checkpoint saves and resume restores.
Sampling runs where the model is (on a GPU, with a CUDA generator), so no logits travel to the CPU.
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import DynamicCache, PreTrainedModel

from rlft.models.routing import RouteRecorder
from rlft.rollout.batching import left_pad, place_routes
from rlft.types import Rollout, SamplingParams


class HFEngine:
    def __init__(self, model: PreTrainedModel, pad_id: int, eos_ids: list[int], seed: int,
                 max_batch_size: int = 1024, return_routes: bool = False):
        self.model = model.eval().requires_grad_(False)
        self.pad_id = pad_id
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long, device=model.device)
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self._tensors = dict(model.named_parameters()) | dict(model.named_buffers())
        self.shares_learner_weights = False  # share_weights: the learner's own tensors, nothing to push
        self.routes = None
        if return_routes:  # MoE: the experts of every prefill and decode step, for routing replay (R3)
            self.routes = RouteRecorder(model)
            if not self.routes.routers:
                raise ValueError("return_routes needs a mixture-of-experts model; this one has no MoE routers")

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        requests = [p for p in prompts for _ in range(params.n)]
        chunks = [self._generate(requests[i:i + self.max_batch_size], params)
                  for i in range(0, len(requests), self.max_batch_size)]
        return Rollout.concat(chunks, self.pad_id)

    def _generate(self, requests: list[list[int]], params: SamplingParams) -> Rollout:
        device = self.model.device
        prompt_ids, prompt_mask = left_pad(requests, self.pad_id)
        batch = len(requests)
        mask = prompt_mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        if self.routes is not None:
            self.routes.start()
        logits = self._prefill(requests, prompt_ids, mask, positions, cache)
        tokens, logprobs = [], []
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        eos_ids = self.eos_ids
        for _ in range(params.max_new_tokens):
            logits = logits.float()                                            # [B, V]
            token, token_logprob = self._sample(logits, params)
            token = torch.where(finished, torch.full_like(token, self.pad_id), token)
            tokens.append(token)
            logprobs.append(torch.where(finished, torch.zeros_like(token_logprob), token_logprob))
            finished = finished | torch.isin(token, eos_ids)
            if finished.all():
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            logits = self.model(input_ids=token[:, None], attention_mask=mask,
                                position_ids=positions, past_key_values=cache, use_cache=True).logits[:, -1]
        response_ids = torch.stack(tokens, dim=1).cpu()                        # [B, R]
        finished = finished.cpu()
        # A token is part of the response up to and including the first EOS.
        is_eos = torch.isin(response_ids, eos_ids.cpu()).long()
        eos_before = is_eos.cumsum(1) - is_eos
        response_mask = (eos_before == 0).long()
        routes = None
        if self.routes is not None:  # [B, P + R - 1, L, k]: the last sampled token was never fed
            recorded = self.routes.take(batch)
            width = prompt_ids.shape[1]
            routes = place_routes(list(recorded), [width] * batch, width, response_ids.shape[1])
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                       response_mask=response_mask, logprobs=torch.stack(logprobs, dim=1).cpu() * response_mask,
                       truncated=~finished, routes=routes)

    def _prefill(self, requests: list[list[int]], prompt_ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Fill the cache with the prompts; the [B, V] logits of each request's first token. Each distinct
        prompt is computed once and its keys/values copied to the n requests of its group (not with MoE
        route recording, which counts every request's prompt tokens)."""
        device = self.model.device
        distinct = list(dict.fromkeys(map(tuple, requests)))
        if self.routes is not None or len(distinct) == len(requests):
            return self.model(input_ids=prompt_ids.to(device), attention_mask=mask, position_ids=positions,
                              past_key_values=cache, use_cache=True).logits[:, -1]
        index = {prompt: i for i, prompt in enumerate(distinct)}
        row_prompt = torch.tensor([index[tuple(r)] for r in requests], device=device)
        distinct_ids, distinct_mask = left_pad([list(p) for p in distinct], self.pad_id)
        distinct_mask = distinct_mask.to(device)
        logits = self.model(input_ids=distinct_ids.to(device), attention_mask=distinct_mask,
                            position_ids=(distinct_mask.cumsum(-1) - 1).clamp(min=0), past_key_values=cache,
                            use_cache=True).logits[:, -1]
        cache.batch_select_indices(row_prompt)
        return logits[row_prompt]

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        if params.temperature == 0:
            token = logits.argmax(-1)
            return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
        if params.temperature != 1.0:
            logits = logits / params.temperature
        log_normaliser = torch.logsumexp(logits, -1, keepdim=True)               # [B, 1]
        if not bool(torch.isfinite(log_normaliser).all()):  # multinomial raised here; the draw below would not
            raise ValueError("the engine's next-token logits are not finite (NaN or infinite): the weights "
                             "or the activations overflowed (a lower precision than float32?)")
        probs = (logits - log_normaliser).exp_()                                 # [B, V]
        if params.top_p < 1.0:
            probs = _top_p_filter(probs, params.top_p)
        token = _inverse_cdf_sample(probs, self.generator)
        # The log-prob of the sampling policy before top-p truncation, as the learner computes it.
        return token, logits.gather(-1, token[:, None])[:, 0] - log_normaliser[:, 0]

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            if name not in self._tensors:
                raise KeyError(f"engine has no weight named '{name}'")
            target = self._tensors[name]
            if target.data_ptr() == tensor.data_ptr():  # a shared weight (share_weights) is already there
                continue
            if self.shares_learner_weights:  # copying would overwrite the learner's own parameters
                raise ValueError(f"this engine samples from the learner's own weights; it takes no other "
                                 f"'{name}'")
            target.copy_(tensor)

    def share_weights(self, model: torch.nn.Module) -> None:
        """Sample from `model`'s own weight storage from now on, instead of a copy: an engine in the
        learner's process that only ever serves the newest weights (on-policy, same dtype and device)
        needs no second copy and no sync (SmolLM2: 540 MB less, docs/bench_vs_trl.md). Tied weights stay
        tied: every module's parameter is replaced by name. The engine's own copy is freed."""
        sources = dict(model.named_parameters(remove_duplicate=False))
        views: dict[int, torch.nn.Parameter] = {}  # one per learner weight: tied names share one
        for module_name, module in self.model.named_modules():
            for name, param in list(module._parameters.items()):
                if param is None:  # an absent bias
                    continue
                full_name = f"{module_name}.{name}" if module_name else name
                source = sources.get(full_name)
                if source is None or (source.shape, source.dtype, source.device) != (
                        param.shape, param.dtype, param.device):
                    raise ValueError(f"cannot share weight '{full_name}': the learner's model has "
                                     f"{'no such weight' if source is None else 'another shape, dtype or device'}")
                if id(source) not in views:
                    views[id(source)] = torch.nn.Parameter(source.detach(), requires_grad=False)
                module._parameters[name] = views[id(source)]
        self._tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        self.shares_learner_weights = True

    def sleep(self) -> None:
        """Nothing to release: the engine's memory is its model's."""

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out the tail of each row outside the smallest set whose mass reaches top_p."""
    sorted_probs, order = probs.sort(-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = torch.where(mass_before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def _inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[B] one index per row of unnormalised, non-negative `probs` [B, V], drawn with probability
    proportional to its entry: one uniform number per row against the row's running sum (in
    float64). The distribution of torch.multinomial, which draws one exponential number per vocabulary
    entry (most of the decode step's sampling time at a 49k vocabulary). A zero entry is never drawn: its running sum equals
    the one before it."""
    cumulative = probs.cumsum(-1, dtype=torch.float64)  # [B, V]; float32 would round away p below ~1e-7
    draw = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64)
    draw = draw * cumulative[:, -1:]
    return torch.searchsorted(cumulative, draw, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
