"""Rollout engine on vLLM (`rollout=vllm`): the same interface as the HF engine.

GPU: `pip install -e '.[vllm]'`; CPU: `make setup-vllm` (vLLM's CPU build). Weights arrive in place through
vLLM's `reload_weights` worker call with the Hugging Face names (vLLM fuses q/k/v and gate/up, and skips
lm_head when embeddings are tied, itself). In process, the learner's tensors are handed over directly;
with the engine core in its own process they travel as safetensors bytes in buckets (rlft.rollout.
vllm_worker), or by broadcast over a torch.distributed group (weight_sync="broadcast"). The prefix cache
is reset after every update so no KV entry of old weights is reused.

With `model.lora` the base weights never change: each sync writes the adapter alone as a peft folder and
loads it under a new adapter id (vLLM caches adapters by id, so an id used before could serve old tensors),
then asks every vLLM worker for a fingerprint of the adapter it holds under that id; a mismatch raises.
Generation uses that adapter; the folder of the one before is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import torch

from rlft.models.lora import adapter_fingerprint, is_adapter_weight, same_adapter, write_adapter

from rlft.rollout.batching import left_pad, place_routes, right_pad
from rlft.types import Rollout, SamplingParams


INSTALL_HINT = ("rollout=vllm needs vLLM installed: `make setup-vllm` (CPU build) or "
                "`pip install -e '.[vllm]'` (GPU)")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMEngine:
    def __init__(self, model_path: str, dtype: str, seed: int, *, pad_id: int, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 enable_sleep_mode: bool = False, in_process: bool = True, sync_bucket_mb: int = 256,
                 weight_sync: str = "rpc", sync_host: str = "127.0.0.1", return_routes: bool = False,
                 lora=None):
        if not vllm_available():
            raise ImportError(INSTALL_HINT)
        if weight_sync == "broadcast" and in_process:
            raise ValueError("weight_sync=broadcast needs the engine in its own process (in_process=false)")
        # vLLM reads this at engine creation: 0 keeps the engine core in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if not torch.cuda.is_available():  # CPU build: a small KV cache is plenty for RL batches (GiB)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # rlft's console line per step, not vLLM's
        from vllm import LLM
        threads = torch.get_num_threads()
        # MoE routing replay from the engine (R3): vLLM returns each token's experts; in 0.32 only with its
        # Model Runner V2, which needs Triton (GPUs; the CPU build refuses it at start-up).
        extra = {"enable_return_routed_experts": True} if return_routes else {}
        if lora is not None:  # one adapter at a time: the current one
            extra |= {"enable_lora": True, "max_lora_rank": lora_rank_slot(lora.r), "max_loras": 1}
        self.return_routes = return_routes
        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                       gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                       enable_sleep_mode=enable_sleep_mode, enforce_eager=True, enable_prefix_caching=True,
                       worker_extension_cls="rlft.rollout.vllm_worker.WeightReceiver",
                       # the learner scores tokens at the sampling temperature: report those log-probs,
                       # not the raw model's
                       logprobs_mode="processed_logprobs", **extra)
        import rlft.rollout.vllm_worker  # noqa: F401  (quiets the reload's expected warnings in this process)
        torch.set_num_threads(threads)  # vLLM lowers them "for serving"; the learner in this process needs them
        self.pad_id = pad_id
        self.in_process = in_process
        self.bucket_bytes = sync_bucket_mb * 2 ** 20
        self.sleep_mode = enable_sleep_mode
        self.asleep: set[str] = set()
        self.broadcaster = None
        self.lora = lora            # rlft.config.model.LoraSettings: syncs carry the adapter alone
        self.adapter = None         # the LoRARequest generate uses; None = the base weights
        self.adapter_syncs = 0      # adapter ids handed out
        if lora is not None:
            self._adapter_root = Path(tempfile.mkdtemp(prefix="rlft-lora-"))
            weakref.finalize(self, shutil.rmtree, self._adapter_root, ignore_errors=True)
        if weight_sync == "broadcast":
            self._join_broadcast_group(sync_host, tensor_parallel_size)

    def _join_broadcast_group(self, host: str, workers: int) -> None:
        """Learner = rank 0, vLLM's workers = ranks 1..workers. A worker call blocks until the collective
        it starts completes, so the engine's side runs on a thread while this one takes part as sender."""
        from rlft.distributed.broadcast import WeightBroadcaster, free_port, open_sync_group
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        port = free_port(host)
        self._rpc_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlft-vllm-sync")
        joined = self._rpc_thread.submit(self.llm.collective_rpc, "rlft_join_sync_group",
                                         args=(host, port, 1 + workers, backend, self.bucket_bytes))
        group = open_sync_group(host, port, 0, 1 + workers, backend)
        joined.result()
        self.broadcaster = WeightBroadcaster(group, src=0, bucket_bytes=self.bucket_bytes,
                                             device="cuda" if backend == "nccl" else "cpu")

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        from vllm import SamplingParams as VLLMSampling
        from vllm.inputs import TokensPrompt
        self.wake_up()
        # logprobs=0: the log-prob of the chosen token only.
        sampling = VLLMSampling(n=params.n, temperature=params.temperature, top_p=params.top_p,
                                max_tokens=params.max_new_tokens, logprobs=0, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False,
                                    lora_request=self.adapter)
        requests, responses, logprobs, truncated, routes = [], [], [], [], []
        for prompt, output in zip(prompts, outputs):
            for completion in output.outputs:  # the n samples of one prompt, adjacent as the interface says
                ids = list(completion.token_ids)
                requests.append(prompt)
                responses.append(ids)
                logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, ids)])
                truncated.append(completion.finish_reason == "length")
                if self.return_routes:  # [prompt + response - 1, layers, k]: the last token was not fed
                    routes.append(torch.from_numpy(completion.routed_experts.astype("int16")))
        prompt_ids, prompt_mask = left_pad(requests, self.pad_id)
        response_ids, response_mask = right_pad(responses, self.pad_id, torch.long)
        response_logprobs, _ = right_pad(logprobs, 0.0, torch.float32)
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                       response_mask=response_mask, logprobs=response_logprobs,
                       truncated=torch.tensor(truncated, dtype=torch.bool),
                       routes=place_routes(routes, [len(r) for r in requests], prompt_ids.shape[1],
                                           response_ids.shape[1]) if routes else None)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.wake_up(tags=["weights"])
        named = [(name, tensor.detach()) for name, tensor in named_tensors]
        if self.lora is not None:
            self._load_adapter(dict(named))
        elif any(is_adapter_weight(name) for name, _ in named):
            raise ValueError("this vLLM engine was started without model.lora and cannot take adapter tensors")
        elif self.broadcaster is not None:
            received = self._rpc_thread.submit(self.llm.collective_rpc, "rlft_receive_broadcast")
            self.broadcaster.send(named)
            received.result()
        elif self.in_process:
            self.llm.collective_rpc("rlft_load_weights", args=(named,))
        else:
            from safetensors.torch import save as to_safetensors

            from rlft.distributed.broadcast import TensorSpec, plan_buckets
            specs = [TensorSpec(n, tuple(t.shape), t.dtype) for n, t in named]
            for bucket in plan_buckets(specs, self.bucket_bytes):
                blob = to_safetensors({named[i][0]: named[i][1].cpu().contiguous() for i in bucket})
                self.llm.collective_rpc("rlft_receive_bucket", args=(blob,))
            self.llm.collective_rpc("rlft_apply_weights")
        self.llm.reset_prefix_cache()

    def _load_adapter(self, tensors: dict[str, torch.Tensor]) -> None:
        """The adapter of a new weights version: written, loaded under a new id, checked, then in use."""
        from vllm.lora.request import LoRARequest
        odd = next((name for name in tensors if not is_adapter_weight(name)), None if tensors else "nothing")
        if odd is not None:
            raise ValueError(f"vLLM with model.lora takes the LoRA adapter's tensors alone, got {odd} "
                             "(what LocalLearner.rollout_weights sends a vLLM engine)")
        self.adapter_syncs += 1
        version = self.adapter_syncs  # never reused, even after a failed sync
        folder = self._adapter_root / f"v{version}"
        write_adapter(folder, tensors, self.lora)
        request = LoRARequest(f"rlft-v{version}", version, str(folder))
        self._deliver(request)
        self._check_served(request, tensors)
        previous, self.adapter = self.adapter, request
        if previous is not None:  # vLLM read it when it loaded it; max_loras=1 evicts it from the cache
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def _deliver(self, request) -> None:
        """Load the adapter into every worker now, not at the first request, so that it can be checked."""
        self.llm.llm_engine.add_lora(request)

    def _check_served(self, request, tensors: dict[str, torch.Tensor]) -> None:
        """Every worker must hold the adapter under this sync's id with the tensors sent (fingerprints, not
        the tensors: three floats per worker). Peers once shipped an adapter that never reached the engine."""
        expected = adapter_fingerprint(tensors, self.lora)
        dtype = next(iter(tensors.values())).dtype
        held = self.llm.collective_rpc("rlft_adapter_fingerprint", args=(request.lora_int_id,))
        for worker, got in enumerate(held):
            if got is None or not same_adapter(got, expected, dtype):
                raise RuntimeError(
                    f"vLLM worker {worker} does not serve LoRA adapter {request.lora_name}, just sent: it holds "
                    f"{'no adapter under that id' if got is None else f'other tensors, fingerprint {got}'}; "
                    f"expected {expected} (sum A, sum |A|, sum |scale x B|)")

    def sleep(self) -> None:
        """Release the GPU memory of weights and KV cache while the learner trains (enable_sleep_mode).
        The next update_weights wakes the weights only, the next generate the KV cache too."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        waking = [tag for tag in (tags or sorted(self.asleep)) if tag in self.asleep]
        if waking:
            self.llm.wake_up(tags=waking)
            self.asleep -= set(waking)

    def rng_state(self) -> torch.Tensor:
        # vLLM's sampler state is not exposed: a resumed vLLM run continues with fresh sampling noise.
        return torch.zeros(0, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor) -> None:
        pass


def lora_rank_slot(r: int) -> int:
    """vLLM sizes its adapter buffers by max_lora_rank, one of a fixed set of values: the least one >= r."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks
    fitting = [rank for rank in get_args(MaxLoRARanks) if rank >= r]
    if not fitting:
        raise ValueError(f"model.lora.r={r}: vLLM takes adapters of rank {max(get_args(MaxLoRARanks))} at most")
    return min(fitting)

