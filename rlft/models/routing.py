"""Mixture-of-experts routing, shared by the learner (routing replay, RouterTap) and the rollout engines
(recording the routes they sample with, RouteRecorder). ALGORITHMS.md, "GSPO and MoE: routing replay".

transformers' MoE blocks (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE) route with a `*TopKRouter` module whose
forward returns (router_logits, top-k weights, top-k expert indices) for the block's flattened tokens. A
forward hook on each router is the whole patch: in the old-policy pass it records the indices; in the
training passes it replaces them with the recorded ones and recomputes their weights from the current
logits (softmax over all experts, gathered at the replayed ones, renormalised as the router does), so the
router still gets gradients. The experts' code is not touched. Outside a learner pass (generation, the
reference model, evaluation) the hooks change nothing.

Per pass it also measures, over the pass's non-padding tokens and every MoE layer:
  drift:        the experts used differ (as a set) from the old pass's  (0 with replay, by construction)
  router drift: the experts the current router would pick differ from the old pass's (what replay removes)
  load balance: the Switch-Transformer auxiliary loss, E * sum_e f_e * P_e, mean over layers, from the
                experts used (f_e: share of routed slots) and the current router probabilities (P_e)
  expert load:  routed slots per expert, summed over layers (the first epoch's passes: each token once)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rlft.types import RoutingStats


def find_routers(model: nn.Module) -> list[nn.Module]:
    """The top-k routers of a transformers MoE model, in layer order (none for a dense model)."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def replayed_weights(router_logits: torch.Tensor, indices: torch.Tensor, normalise: bool) -> torch.Tensor:
    """The gate weights of `indices` [T, k] under the current logits [T, E], computed as the routers do
    for their own choice: softmax in float32 over all experts, then (if the router does) renormalised."""
    probs = torch.softmax(router_logits.float(), dim=-1).gather(-1, indices)
    if normalise:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs.to(router_logits.dtype)


@dataclass
class RoutingCounts:
    """Sums over a step's passes (and ranks): token-layer pairs compared and how many differ; per layer
    and expert, routed slots and router probabilities of the old pass's tokens (each token once)."""
    layers: int
    experts: int
    compared: float = 0.0
    drifted: float = 0.0
    router_drifted: float = 0.0
    tokens: float = 0.0
    slots: torch.Tensor = None   # [layers, experts]
    probs: torch.Tensor = None   # [layers, experts]

    def __post_init__(self):
        shape = (self.layers, self.experts)
        self.slots = torch.zeros(shape, dtype=torch.float64) if self.slots is None else self.slots
        self.probs = torch.zeros(shape, dtype=torch.float64) if self.probs is None else self.probs

    def as_tensor(self) -> torch.Tensor:
        head = torch.tensor([self.compared, self.drifted, self.router_drifted, self.tokens], dtype=torch.float64)
        return torch.cat([head, self.slots.flatten(), self.probs.flatten()])

    def with_tensor(self, flat: torch.Tensor) -> "RoutingCounts":
        """The same counts from as_tensor()'s layout (after an all-reduce over ranks)."""
        size = self.layers * self.experts
        shape = (self.layers, self.experts)
        return RoutingCounts(self.layers, self.experts, *flat[:4].tolist(),
                             slots=flat[4:4 + size].view(shape), probs=flat[4 + size:].view(shape))

    def stats(self) -> RoutingStats:
        """The load balance of the whole step (so it does not depend on how rows split into micro-batches
        or ranks; the loss term itself is per pass, as in transformers)."""
        tokens = max(self.tokens, 1.0)
        balance = self.experts * ((self.slots / tokens) * (self.probs / tokens)).sum(-1).mean()
        per_expert = self.slots.sum(0)
        return RoutingStats(
            routing_drift=self.drifted / self.compared if self.compared else 0.0,
            router_drift=self.router_drifted / self.compared if self.compared else 0.0,
            load_balance_loss=float(balance),
            expert_load_cv=float(per_expert.std(unbiased=False) / per_expert.mean()) if self.tokens else 0.0,
            expert_tokens=[float(n) for n in per_expert.tolist()])


@dataclass
class _Pass:
    key: object
    token_mask: torch.Tensor        # [T] 1 on real tokens, in the routers' flattened order
    record: bool
    replay: bool
    compare: bool                   # measure drift against the recorded routes
    count_load: bool                # add to the per-expert counts (once per token and step)
    layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class RouterTap:
    """Forward hooks on every router of `model`. Routes are recorded and replayed per key (the learner uses
    the micro-batch's position in the step), so every ppo epoch and micro-batch replays its own old pass;
    a gradient-checkpointing recompute in backward sees the same pass and replays the same routes."""

    def __init__(self, model: nn.Module):
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError("the model has no mixture-of-experts routers")
        self.num_experts = self.routers[0].num_experts
        self.top_k = self.routers[0].top_k
        self.recorded: dict[object, dict[int, torch.Tensor]] = {}
        self._pass: _Pass | None = None
        self._handles = [router.register_forward_hook(self._hook(layer)) for layer, router in enumerate(self.routers)]

    def counts(self) -> RoutingCounts:
        """Empty counts for one step of this model."""
        return RoutingCounts(len(self.routers), self.num_experts)

    def begin(self, key, token_mask: torch.Tensor, *, record: bool, replay: bool, compare: bool,
              count_load: bool = True) -> None:
        """The next forward pass is a learner pass over these tokens (`token_mask` [rows, T])."""
        if replay and key not in self.recorded:
            raise RuntimeError(f"routing replay: no routes recorded for pass {key!r}")
        self._pass = _Pass(key, token_mask.reshape(-1).float(), record, replay, compare, count_load)
        if record:
            self.recorded[key] = {}

    def set_routes(self, key, routes: torch.Tensor) -> None:
        """Routes from elsewhere (the rollout engine): [rows, T, layers, k] in the pass's token order."""
        rows, tokens, layers, k = routes.shape
        if layers != len(self.routers) or k != self.top_k:
            raise ValueError(f"routes for {layers} layers x top-{k}; the model has {len(self.routers)} x "
                             f"top-{self.top_k}")
        flat = routes.reshape(rows * tokens, layers, k)
        self.recorded[key] = {layer: flat[:, layer].long() for layer in range(layers)}

    def end(self, counts: RoutingCounts) -> torch.Tensor:
        """Adds the pass's measurements to `counts`; returns its load-balance loss (differentiable). The
        pass stays current for a backward recompute until the next begin() or clear()."""
        p = self._pass
        if p is None or not p.layers:
            return torch.zeros(())
        mask = p.token_mask
        real = mask.sum().clamp(min=1.0)
        balance = []
        for layer, (logits, used, natural) in sorted(p.layers.items()):
            m = mask.to(logits.device)[:, None]
            probs = torch.softmax(logits.float(), dim=-1) * m
            slots = (torch.zeros(used.shape[0], self.num_experts, device=logits.device).scatter_(1, used, 1.0) * m).sum(0)
            balance.append(self.num_experts * ((slots / real) * (probs.sum(0) / real)).sum())
            if p.count_load:
                counts.slots[layer] += slots.detach().cpu().double()
                counts.probs[layer] += probs.sum(0).detach().cpu().double()
            if p.compare:
                old = self.recorded[p.key][layer].to(used.device).sort(-1).values
                counts.drifted += float(((used.sort(-1).values != old).any(-1)[:, None] * m).sum())
                counts.router_drifted += float(((natural.sort(-1).values != old).any(-1)[:, None] * m).sum())
                counts.compared += float(m.sum())
        if p.count_load:
            counts.tokens += float(mask.sum())
        return torch.stack(balance).mean()

    def idle(self) -> None:
        """The next forward passes are not learner passes (an FSDP filler pass): route as the model does."""
        self._pass = None

    def clear(self) -> None:
        """After a step: the hooks go quiet and the step's routes are dropped."""
        self._pass = None
        self.recorded.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _hook(self, layer: int):
        def hook(router, args, output):
            p = self._pass
            if p is None:
                return None
            logits, weights, natural = output
            used = natural
            if p.replay:
                used = self.recorded[p.key][layer].to(natural.device)
                if used.shape != natural.shape:
                    raise RuntimeError(f"routing replay: layer {layer} has {natural.shape[0]} tokens, the "
                                       f"recorded pass {used.shape[0]}")
                weights = replayed_weights(logits, used, getattr(router, "norm_topk_prob", True))
            if p.record:
                self.recorded[p.key][layer] = used.detach()
            p.layers[layer] = (logits, used.detach(), natural.detach())
            return logits, weights, used
        return hook


class RouteRecorder:
    """The experts a model's routers pick in every forward while recording (an engine's prefill and decode
    steps): `take()` returns them as [rows, tokens, layers, k], the forwards' tokens in order."""

    def __init__(self, model: nn.Module):
        self.routers = find_routers(model)
        self.recording = False
        self._forwards: list[list[torch.Tensor]] = []
        for router in self.routers:
            router.register_forward_hook(self._hook)

    def start(self) -> None:
        self.recording, self._forwards = True, []

    def take(self, rows: int) -> torch.Tensor:
        self.recording = False
        layers = len(self.routers)
        steps = [torch.stack(self._forwards[i:i + layers], dim=1) for i in range(0, len(self._forwards), layers)]
        self._forwards = []
        # each forward routed [rows * tokens, k] per layer: back to [rows, tokens, layers, k]
        return torch.cat([step.view(rows, -1, layers, step.shape[-1]) for step in steps], dim=1)

    def _hook(self, router, args, output):
        if self.recording:
            self._forwards.append(output[2].detach().to(torch.int16).cpu())
