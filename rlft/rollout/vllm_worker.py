"""Runs inside vLLM's worker (`worker_extension_cls`): rlft's weight updates, in process or across one.

In process, tensors are handed over as they are. With the engine core in its own process, `collective_rpc`
arguments are serialised: weights travel as safetensors bytes (compact, dtype-exact) and accumulate until
`rlft_apply_weights`, so vLLM's in-place reload sees one complete set of weights, as it expects. Or
(weight_sync=broadcast) the worker joins a torch.distributed group with the learner and receives the
buckets by broadcast (rlft.distributed.broadcast): NCCL between GPUs, gloo on CPU. With model.lora the
adapter travels as a folder instead, and `rlft_adapter_fingerprint` tells the engine what the worker holds.
"""

from __future__ import annotations

import logging

from safetensors.torch import load as load_safetensors

# Each in-place reload warns that the tied lm_head and the rotary buffers got no tensor: expected.
logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)


def _prepack_on_reload(method):
    """Wrap a CPU fused-MoE method's post-load step so that a reload prepacks the experts as the first load did."""
    original = method.process_weights_after_loading

    def process_weights_after_loading(layer):
        reloading = method.moe_kernel is not None  # set by the first load; a reload finds it
        original(layer)
        if reloading:  # vLLM only prepacks while the kernel is unbuilt: on a reload, run that step here
            method.moe_kernel.fused_experts.process_weights_after_loading(layer)

    process_weights_after_loading._rlft_prepack = True
    return process_weights_after_loading


class WeightReceiver:
    def rlft_load_weights(self, weights: list) -> int:
        self._rlft_prepack_cpu_moe_on_reload()
        self.reload_weights(weights_iterator=weights)
        self._rlft_refresh_tied_lm_head()
        return len(weights)

    def rlft_receive_bucket(self, blob: bytes) -> int:
        pending = self.__dict__.setdefault("_rlft_pending", [])
        pending.extend(load_safetensors(blob).items())
        return len(pending)

    def rlft_apply_weights(self) -> int:
        return self.rlft_load_weights(self.__dict__.pop("_rlft_pending", []))

    def rlft_join_sync_group(self, host: str, port: int, world_size: int, backend: str, bucket_bytes: int) -> int:
        from rlft.distributed.broadcast import WeightBroadcaster, open_sync_group
        rank = 1 + self.rank  # the learner is rank 0; tensor-parallel workers follow it
        group = open_sync_group(host, port, rank, world_size, backend)
        self._rlft_broadcaster = WeightBroadcaster(group, src=0, bucket_bytes=bucket_bytes, device=self.device)
        return rank

    def rlft_receive_broadcast(self) -> int:
        received: list = []
        self._rlft_broadcaster.receive(received.extend)
        return self.rlft_load_weights(received)

    def rlft_adapter_fingerprint(self, lora_id: int) -> tuple[float, float, float] | None:
        """(sum A, sum |A|, sum |scale x B|) over the adapter this worker holds under `lora_id`, in float64, as
        rlft.models.lora.adapter_fingerprint computes it from the tensors sent; None if it holds none."""
        adapter = self.model_runner.lora_manager._adapter_manager.get_adapter(lora_id)
        if adapter is None:
            return None
        a, b = [], []
        for layer in adapter.loras.values():
            # packed layers (q/k/v, gate/up) hold lists, None where a part has no adapter; the scale is 1
            # where vLLM folded it into B already
            packed = isinstance(layer.lora_a, list)
            a += [t.double() for t in (layer.lora_a if packed else [layer.lora_a]) if t is not None]
            b += [s * t.double() for t, s in zip(layer.lora_b if packed else [layer.lora_b],
                                                 layer.scaling if packed else [layer.scaling]) if t is not None]
        return (sum(float(t.sum()) for t in a), sum(float(t.abs().sum()) for t in a),
                sum(float(t.abs().sum()) for t in b))

    def _rlft_refresh_tied_lm_head(self) -> None:
        # vLLM's CPU backend keeps a repacked copy of lm_head for its GEMM; with tied embeddings the reload
        # writes embed_tokens only, and that copy would stay stale (measured: logprob error 0.5 after an
        # embedding change). Re-running the head's post-load step repacks it; on GPU it does nothing.
        model = self.model_runner.get_model()
        head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", None):
            return
        method = getattr(head, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(head)

    def _rlft_prepack_cpu_moe_on_reload(self) -> None:
        # vLLM's CPU fused MoE keeps its expert weights (w13/w2) in a prepacked grouped-GEMM layout, made by
        # CPUUnquantizedExperts.process_weights_after_loading. On a reload, UnquantizedFusedMoEMethod._setup_kernel
        # skips that step (the kernel already exists), so the checkpoint layout would land in the packed storage
        # (measured: logprob error 0.56 after resending unchanged weights). The wrapper runs only for MoE layers
        # that this reload actually loads, so layers it does not send are never packed twice. On GPU it does nothing.
        try:
            from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
        except ImportError:
            return
        for module in self.model_runner.get_model().modules():
            method = getattr(module, "quant_method", None)
            kernel = getattr(method, "moe_kernel", None)
            if (isinstance(getattr(kernel, "fused_experts", None), CPUUnquantizedExperts)
                    and not getattr(method.process_weights_after_loading, "_rlft_prepack", False)):
                method.process_weights_after_loading = _prepack_on_reload(method)
