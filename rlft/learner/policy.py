"""The policy being trained: its weights, AdamW, and the update on one batch of trajectories
(ppo_epochs optimizer steps over micro-batches, data parallel over a group of ranks, or FSDP2)."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import asdict

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from rlft.algos.corrections import ratio_quantiles
from rlft.algos.losses import policy_loss
from rlft.distributed.ranks import rank_rows
from rlft.errors import ConfigError, NonFiniteWeights
from rlft.learner.logprobs import Packing, plan_pass, response_logprobs, supports_packing
from rlft.models.routing import RouterTap, find_routers
from rlft.types import LossSettings, TrainBatch, UpdateStats


class Policy:
    """`group`: a torch.distributed group of learner ranks (data parallel). Every rank is handed the whole
    batch and trains on its share of the rows; the loss is normalised by the whole batch's token and
    sequence counts, so summing the ranks' gradients gives exactly the one-rank gradient, and every rank
    takes the same optimizer step.

    `fsdp`: shard parameters, gradients and optimizer state over the group (FSDP2 `fully_shard`, one unit
    per decoder layer); gradients are then reduce-scattered by FSDP itself, summed as above.

    `ppo_epochs` optimizer steps per batch, each accumulating gradients over passes of `micro_batch_size`
    rows (None: the whole batch); log-probs at the sampling `temperature`.

    `share_prompts` (compute.layout shared_prompts): each pass computes every distinct prompt once, and the
    responses of its group attend to its keys and values (rlft.learner.logprobs.prompt_shared_logits).
    `padding_free` (compute.layout packed): sequences packed end to end, so no compute goes to padding; with
    both (auto), each pass takes the cheaper (rlft.learner.logprobs.plan_pass).

    Mixture-of-experts policies (rlft.models.routing): every pass's routing is measured; `routing_replay`
    makes the training passes use the experts of the old-policy pass (or of the rollout engine, when the
    batch carries its routes); `router_aux_loss_coef` adds the load-balancing loss.
    """

    def __init__(self, model: PreTrainedModel, *, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, max_grad_norm: float = 1.0,
                 ppo_epochs: int = 1, micro_batch_size: int | None = None, temperature: float = 1.0, group: dist.ProcessGroup | None = None, fsdp: bool = False,
                 routing_replay: bool = False, router_aux_loss_coef: float = 0.0, share_prompts: bool = False,
                 padding_free: bool = False, compute_dtype: torch.dtype | None = None):
        if fsdp and group is None:
            raise ValueError("fsdp needs a group of learner ranks")
        self.model = model
        self.routing = RouterTap(model) if find_routers(model) else None
        if routing_replay and self.routing is None:
            raise ConfigError(f"algo.routing_replay needs a mixture-of-experts model; {type(model).__name__} has no "
                              "MoE routers that rlft.models.routing knows (*TopKRouter modules)")
        self.routing_replay = routing_replay
        self.router_aux_loss_coef = router_aux_loss_coef
        self.share_prompts = share_prompts and shares_prompts_safely(model, self.routing)
        self.group = group
        self.fsdp = fsdp
        self.rank, self.world = (dist.get_rank(group), dist.get_world_size(group)) if group else (0, 1)
        for module in model.modules():  # RL ratios assume the same function in every pass
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        self.model.train()
        self.param_names = [name for name, p in model.named_parameters() if p.requires_grad]
        self.compute_dtype = compute_dtype
        # before sharding: a forward under FSDP2 leaves the root's parameters gathered for the optimizer
        self.padding_free = padding_free and supports_packing(model)
        if padding_free and not self.padding_free:
            warnings.warn(f"compute.layout: {type(model).__name__} mixes packed sequences in its attention, so "
                          "the learner pads instead of packing", stacklevel=2)
        if fsdp:
            _shard(model, group, compute_dtype)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # fused: one kernel over all parameters, 4-5x faster than the per-tensor loop on CPU (135M weights:
        # 0.11 s against 0.42 s); FSDP's sharded parameters keep torch's default implementation
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, weight_decay=weight_decay, betas=betas, eps=eps,
                                           fused=False)
        self.max_grad_norm = max_grad_norm
        self.ppo_epochs, self.micro_batch_size, self.temperature = ppo_epochs, micro_batch_size, temperature

    def update(self, batch: TrainBatch, loss: LossSettings, lr: float) -> UpdateStats:
        """`ppo_epochs` optimizer steps at learning rate `lr`, each accumulating gradients over all micro-batches.

        The old-policy log-probs are those of the first epoch's forward passes: no optimizer step has
        happened yet when they are computed, so they equal a separate old-policy pass and cost nothing.
        """
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ppo_epochs, temperature = self.ppo_epochs, self.temperature
        micro_batch_size = min(self.micro_batch_size or batch.size, batch.size)
        batch = batch.to(next(self.model.parameters()).device)  # the batch comes from the CPU
        rollout = batch.rollout
        num_tokens = int(batch.loss_mask.sum())
        num_sequences = int((batch.loss_mask.sum(-1) > 0).sum())
        if batch.size < self.world:
            raise ValueError(f"a batch of {batch.size} rows cannot feed {self.world} learner ranks")
        mine = rank_rows(batch.size, self.rank, self.world)
        share = len(rank_rows(batch.size, 0, self.world))  # the largest share
        old_logp = torch.zeros_like(rollout.logprobs)
        token_mask = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1)  # the model's input tokens
        routing = self.routing.counts() if self.routing is not None else None
        totals = _StepMetrics()
        grad_norms, entropy_sum = [], 0.0
        epoch_losses, skipped, nonfinite = [], 0, None  # optimizer steps not applied, and why (the first)
        seconds = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        clock = _clock(self.model)
        # FSDP gathers weights in every forward: each rank must run as many passes as the largest share
        passes = -(-share // micro_batch_size) if self.fsdp else -(-len(mine) // micro_batch_size)
        plans = {}  # each micro-batch's layout (shared, packed or padded), the same in every epoch
        for epoch in range(ppo_epochs):
            for index in range(passes):
                start = mine.start + index * micro_batch_size
                rows = slice(start, min(start + micro_batch_size, mine.stop))
                if self.fsdp:  # reduce-scatter the accumulated gradients once, after the last pass
                    self.model.set_requires_gradient_sync(index == passes - 1)
                if rows.start >= rows.stop:  # a rank with fewer rows: a pass that adds nothing
                    self._empty_pass(rollout, temperature)
                    continue
                first_epoch = epoch == 0
                started = clock()
                if index not in plans:
                    plans[index] = plan_pass(self.model, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                             rollout.response_mask[rows], self.share_prompts, self.padding_free)
                if self.routing is not None:
                    self._begin_routing(index, rows, token_mask, plans[index][1], rollout.routes, first_epoch)
                with self._precision():
                    out = response_logprobs(self.model, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                            rollout.response_ids[rows], rollout.response_mask[rows], temperature,
                                            with_entropy=first_epoch, plan=plans[index])
                logp = out[0] if first_epoch else out
                if first_epoch:
                    old_logp[rows] = logp.detach()
                pass_loss, metrics = policy_loss(
                    logp, old_logp[rows], batch.advantages[rows], batch.loss_mask[rows],
                    num_sequences=num_sequences, num_tokens=num_tokens,
                    ref_logp=None if batch.ref_logprobs is None else batch.ref_logprobs[rows],
                    rollout_logp=rollout.logprobs[rows], **asdict(loss))
                if self.routing is not None:
                    balance = self.routing.end(routing)
                    if self.router_aux_loss_coef:  # a token-weighted mean over the step's passes
                        token_share = token_mask[rows].sum() / token_mask.sum()
                        pass_loss = pass_loss + self.router_aux_loss_coef * balance * token_share
                forward_done = clock()
                # under FSDP the reduce-scatter averages: scaled so that it sums, as _sum_gradients does
                (pass_loss * self.world if self.fsdp else pass_loss).backward()
                backward_done = clock()
                seconds["forward"] += forward_done - started
                seconds["backward"] += backward_done - forward_done
                if first_epoch:
                    entropy_sum += float((out[1] * batch.loss_mask[rows]).sum())
                epoch_losses.append(pass_loss.item())
                totals.add(metrics | {"loss": epoch_losses[-1]}, tokens=float(batch.loss_mask[rows].sum()))
            started = clock()
            if self.group is not None and not self.fsdp:
                self._sum_gradients()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            bad = self._first_nonfinite(epoch_losses, grad_norm)
            if bad is None:
                grad_norms.append(grad_norm)
                self.optimizer.step()
                self._check_weights_finite()
            else:  # not applied: one bad batch must not poison the weights (or their checkpoint)
                skipped += 1
                nonfinite = nonfinite or bad
            self.optimizer.zero_grad(set_to_none=True)
            epoch_losses = []
            seconds["optimizer"] += clock() - started
        mask = rollout.model_mask[mine.start:mine.stop].bool()  # observation tokens have no engine log-prob
        diff = (old_logp - rollout.logprobs)[mine.start:mine.stop].abs()[mask]
        diff_sum, diff_count = float(diff.sum()), float(diff.numel())
        diff_max = float(diff.max()) if diff.numel() else 0.0
        if self.group is not None:
            totals.reduce(self.group)
            entropy_sum, diff_sum, diff_count = _all_reduce([entropy_sum, diff_sum, diff_count], self.group)
            (diff_max,) = _all_reduce([diff_max], self.group, dist.ReduceOp.MAX)
        stats = totals.result(ppo_epochs)
        if "offpolicy/ratio_p50" in stats:  # the micro-batches' quantiles were averaged: the step's own instead
            stats |= self._step_ratio_quantiles(old_logp, rollout.logprobs, batch.loss_mask, mine)
        routing_stats = None
        if self.routing is not None:
            self.routing.clear()
            flat = routing.as_tensor()
            if self.group is not None:
                dist.all_reduce(flat, group=self.group)
            routing_stats = routing.with_tensor(flat).stats()
        return UpdateStats(
            loss=stats["loss"], pg_loss=stats["pg_loss"], approx_kl=stats["approx_kl"],
            entropy=entropy_sum / max(num_tokens, 1),  # of the old policy, over the loss tokens
            grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"), tokens=num_tokens,
            logprob_diff_mean=diff_sum / diff_count if diff_count else 0.0, logprob_diff_max=diff_max,
            # this rank's time: forward (log-probs and loss; the first epoch's are the old log-probs too),
            # backward, optimizer (gradient reduction, clipping, AdamW)
            forward_seconds=seconds["forward"], backward_seconds=seconds["backward"],
            optimizer_seconds=seconds["optimizer"],
            kl_ref=stats.get("kl_ref"), clip_frac_low=stats.get("clip_frac_low"),
            clip_frac_high=stats.get("clip_frac_high"), ratio_mean=stats.get("ratio_mean"),
            ratio_min=stats.get("ratio_min"), ratio_max=stats.get("ratio_max"), routing=routing_stats,
            skipped_updates=skipped, nonfinite=nonfinite,
            # the objective's and the rollout correction's metrics, named by policy_loss ("offpolicy/...")
            named=_named_metrics(stats))

    def _step_ratio_quantiles(self, old_logp: torch.Tensor, engine_logp: torch.Tensor, loss_mask: torch.Tensor,
                              mine) -> dict[str, float]:
        """Quantiles of old / engine probability ratios over the step's loss tokens, on every rank alike."""
        rows = slice(mine.start, mine.stop)
        log_rho = (old_logp - engine_logp)[rows][loss_mask[rows].bool()].detach().double().cpu()
        if self.group is not None:
            parts = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(parts, log_rho, group=self.group)
            log_rho = torch.cat(parts)
        return ratio_quantiles(log_rho) if log_rho.numel() else {}

    def _first_nonfinite(self, losses: list[float], grad_norm: float) -> str | None:
        """'loss = nan' or 'gradient norm = inf' when this optimizer step must not be applied, agreed by
        every rank (a loss is per rank; the gradient norm is the whole batch's)."""
        bad_loss = next((value for value in losses if not math.isfinite(value)), None)
        flags = [float(bad_loss is not None), float(not math.isfinite(grad_norm))]
        if self.group is not None:
            flags = _all_reduce(flags, self.group, dist.ReduceOp.MAX)
        if flags[0]:
            return f"loss = {bad_loss if bad_loss is not None else 'not finite on another rank'}"
        if flags[1]:
            return f"gradient norm = {grad_norm}"
        return None

    def _check_weights_finite(self) -> None:
        """Finite gradients can still step to infinite weights (a huge learning rate): stop then, before
        the engine samples from them or a checkpoint keeps them."""
        local = [t for t in (p.to_local() if hasattr(p, "to_local") else p for p in self.params) if t.numel()]
        # one fused norm per tensor (what clip_grad_norm_ uses), no full-size temporaries; NaN or inf show
        finite = float(bool(torch.isfinite(torch.stack(torch._foreach_norm(local))).all())) if local else 1.0
        if self.group is not None:
            (finite,) = _all_reduce([finite], self.group, dist.ReduceOp.MIN)
        if not finite:
            raise NonFiniteWeights("the weights are not finite after the optimizer step (the update diverged: "
                                   "lower optim.lr or optim.max_grad_norm)")

    def _begin_routing(self, index: int, rows: slice, token_mask: torch.Tensor, packing: Packing | None,
                       engine_routes, first_epoch: bool):
        """The routing of one pass. Old routes are the first epoch's own (the old-policy pass), or the
        engine's when the batch has them; later epochs, and every pass against the engine's routes, are
        compared with them, and replay them when routing_replay is on."""
        token_mask = token_mask[rows]
        if engine_routes is not None:
            engine_routes = engine_routes[rows]
        # the routers see the tokens as the pass feeds them (with routers, prompts are never shared): padded
        # rows, or the `packing`'s rows, and then the engine's routes go where their tokens go
        if packing is not None:
            if engine_routes is not None:
                placed = engine_routes.new_zeros((packing.rows * packing.width, *engine_routes.shape[2:]))
                placed[packing.tokens.to(placed.device)] = engine_routes[token_mask.bool()]
                engine_routes = placed.view(packing.rows, packing.width, *engine_routes.shape[2:])
            token_mask = packing.real.to(token_mask.device)
        if engine_routes is not None:
            if first_epoch:
                self.routing.set_routes(index, engine_routes)
            self.routing.begin(index, token_mask, record=False, replay=self.routing_replay, compare=True,
                               count_load=first_epoch)
        else:
            self.routing.begin(index, token_mask, record=first_epoch,
                               replay=self.routing_replay and not first_epoch, compare=not first_epoch,
                               count_load=first_epoch)

    def _empty_pass(self, rollout, temperature: float) -> None:
        if self.routing is not None:
            self.routing.idle()
        with self._precision():
            logp = response_logprobs(self.model, rollout.prompt_ids[:1], rollout.prompt_mask[:1],
                                     rollout.response_ids[:1], rollout.response_mask[:1], temperature)
        (logp.sum() * 0.0).backward()

    def _precision(self):
        """Mixed precision: the passes' matrix products in compute_dtype, the weights and their updates in
        float32 (AdamW steps far below bfloat16's resolution of the weights still count)."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(next(self.model.parameters()).device.type, dtype=self.compute_dtype)

    def _keep_kernel_choice(self) -> None:
        """load_state_dict takes the saved fused/foreach flags: keep the ones this optimizer was built with
        (a checkpoint from before the fused optimizer would otherwise resume on the slower loop)."""
        for group in self.optimizer.param_groups:
            group["fused"], group["foreach"] = self.optimizer.defaults["fused"], self.optimizer.defaults["foreach"]

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Trained parameter name -> full tensor (tied weights once). Under FSDP a collective: every rank
        calls it, rank 0 gets the tensors (on CPU), the others an empty dict."""
        if not self.fsdp:
            params = dict(self.model.named_parameters())
            return {name: params[name].detach() for name in self.param_names}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {name: full[name] for name in self.param_names if name in full}

    def full_optimizer_state(self) -> dict:
        """The optimizer's state_dict() as one unsharded rank would have it (collective under FSDP)."""
        if not self.fsdp:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        full = get_optimizer_state_dict(self.model, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        index = {name: i for i, name in enumerate(self.param_names)}  # FSDP keys by name, torch by position
        return {"state": {index[name]: slots for name, slots in full.get("state", {}).items()},
                "param_groups": [g | {"params": [index[n] for n in g["params"]]} for g in full.get("param_groups", [])]}

    def load_full_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict) -> None:
        """The inverse of full_weights + full_optimizer_state; every rank passes the same full state."""
        if not self.fsdp:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in weights.items():
                    params[name].copy_(tensor)
            self.optimizer.load_state_dict(optimizer_state)
            self._keep_kernel_choice()
            return
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True, strict=False)  # tied lm_head comes with the embedding
        set_model_state_dict(self.model, weights, options=options)
        names = self.param_names
        by_name = {"state": {names[i]: slots for i, slots in optimizer_state["state"].items()},
                   "param_groups": [g | {"params": [names[i] for i in g["params"]]}
                                    for g in optimizer_state["param_groups"]]}
        set_optimizer_state_dict(self.model, self.optimizer, by_name, options=options)
        self._keep_kernel_choice()

    def _sum_gradients(self) -> None:
        """Each rank's loss is its share of the whole batch's loss: the gradients add up (not average)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat, group=self.group)
        for p, g in zip(self.params, flat.split([p.numel() for p in self.params])):
            p.grad.copy_(g.view_as(p))


def _clock(model):
    """perf_counter, after the GPU's queued work when the model is on one (else the split would lie)."""
    on_gpu = next(model.parameters()).device.type == "cuda"

    def now() -> float:
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter()
    return now


def shares_prompts_safely(model: PreTrainedModel, routing) -> bool:
    """Whether the prompt-shared pass computes the same function here: not with gradient checkpointing
    (transformers turns the cache off under it), nor with the MoE router hooks (they count every row's
    prompt tokens, and replay routes by row)."""
    return routing is None and not getattr(model, "is_gradient_checkpointing", False)


def _shard(model: PreTrainedModel, group: dist.ProcessGroup, compute_dtype: torch.dtype | None = None) -> None:
    """FSDP2: one shard unit per decoder layer, then the rest (embeddings, norm, head) at the root.
    FSDP averages the ranks' gradients; the learner scales its loss by the world size to make that a sum
    (a divide factor of 1 would need PREMUL_SUM, which gloo lacks). Under mixed precision the layers are
    gathered in compute_dtype (half the bytes) and the gradients reduced in float32."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    device = next(model.parameters()).device.type
    mesh = DeviceMesh.from_group(group, device)
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype else None)
    for layer in getattr(getattr(model, "model", None), "layers", []):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def _named_metrics(stats: dict[str, float]) -> dict[str, float]:
    """The metrics policy_loss names with their namespace, logged under those names."""
    return {key: value for key, value in stats.items() if "/" in key}


class _StepMetrics:
    """Combines micro-batch metrics: losses add up (each is already a share of the step's loss),
    extremes take min/max, everything else is a token-weighted mean."""

    SUMMED = ("loss", "pg_loss")

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.tokens = 0.0

    def add(self, metrics: dict[str, float], tokens: float) -> None:
        self.tokens += tokens
        for key, value in metrics.items():
            if key.endswith("_min"):
                self.extremes[key] = min(self.extremes.get(key, value), value)
            elif key.endswith("_max"):
                self.extremes[key] = max(self.extremes.get(key, value), value)
            else:
                weight = 1.0 if key in self.SUMMED else tokens
                self.sums[key] = self.sums.get(key, 0.0) + value * weight

    def reduce(self, group: dist.ProcessGroup) -> None:
        """Combine the ranks' partial metrics (every rank trains on at least one row: same keys)."""
        sums = sorted(self.sums)
        lows = sorted(k for k in self.extremes if k.endswith("_min"))
        highs = sorted(k for k in self.extremes if k.endswith("_max"))
        *summed, self.tokens = _all_reduce([self.sums[k] for k in sums] + [self.tokens], group)
        self.sums = dict(zip(sums, summed))
        low = _all_reduce([self.extremes[k] for k in lows], group, dist.ReduceOp.MIN)
        high = _all_reduce([self.extremes[k] for k in highs], group, dist.ReduceOp.MAX)
        self.extremes = dict(zip(lows, low)) | dict(zip(highs, high))

    def result(self, epochs: int) -> dict[str, float]:
        out = {k: v / epochs if k in self.SUMMED else v / max(self.tokens, 1.0) for k, v in self.sums.items()}
        return out | self.extremes


def _all_reduce(values: list[float], group: dist.ProcessGroup, op=dist.ReduceOp.SUM) -> list[float]:
    if not values:
        return []
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=op, group=group)
    return tensor.tolist()
