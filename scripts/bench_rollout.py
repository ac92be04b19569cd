"""Rollout speed: the HF engine vs rlft's vLLM engine vs vLLM on its own (`LLM.generate`, no rlft), on the
same prompts and sampling, and the time of one learner -> engine weight sync. Prints a markdown table.

    .venv/bin/python scripts/bench_rollout.py                        # default tiny model, CPU
    .venv/bin/python scripts/bench_rollout.py --model PATH --dtype bfloat16 --device cuda   # on a GPU

Needs vLLM (`make setup-vllm` on CPU). Each engine first runs one warm-up batch; then --repeats timed
batches of --prompts prompts x --group-size samples. tokens/s counts generated tokens (EOS included).
"""

from __future__ import annotations

import argparse
import time

import torch

from rlft.data.arithmetic import addition_problem
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlft.rollout.hf_engine import HFEngine
from rlft.rollout.vllm_engine import VLLMEngine
from rlft.types import SamplingParams


def timed(fn, repeats: int) -> tuple[float, int]:
    fn()  # warm-up
    tokens, start = 0, time.perf_counter()
    for _ in range(repeats):
        tokens += fn()
    return time.perf_counter() - start, tokens



def push_seconds(model, engine) -> float:
    """Seconds to hand every weight of `model` to `engine` (what a learner's weight push costs)."""
    start = time.perf_counter()
    engine.update_weights([(name, p.detach()) for name, p in model.named_parameters()])
    return time.perf_counter() - start

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:tiny-adder")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-own-process", action="store_true", help="skip the engine-in-its-own-process rows")
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    rng = torch.Generator().manual_seed(0)
    prompts = [tokenizer.encode(addition_problem(int(a), int(b)).prompt)
               for a, b in torch.randint(10, 100, (args.prompts, 2), generator=rng)]
    params = SamplingParams(n=args.group_size, temperature=1.0, max_new_tokens=args.max_new_tokens)
    learner_model = load_causal_lm(path, args.dtype, args.device)
    rows = []

    def add(name: str, seconds: float, tokens: int, sync_seconds: float | None) -> None:
        rows.append((name, tokens / seconds, args.repeats / seconds, sync_seconds))

    hf = HFEngine(load_causal_lm(path, args.dtype, args.device), tokenizer.pad_token_id,
                  [tokenizer.eos_token_id], seed=0)
    seconds, tokens = timed(lambda: int(hf.generate(prompts, params).response_mask.sum()), args.repeats)
    add("hf engine (rlft)", seconds, tokens, min(push_seconds(learner_model, hf) for _ in range(3)))

    variants = [("in process", True, "rpc")]  # (label, in_process, weight_sync)
    if not args.skip_own_process:
        variants += [("own process", False, "rpc"), ("own process, broadcast sync", False, "broadcast")]
    for label, in_process, weight_sync in variants:
        engine = VLLMEngine(str(path), args.dtype, seed=0, pad_id=tokenizer.pad_token_id, in_process=in_process,
                            weight_sync=weight_sync)
        seconds, tokens = timed(lambda: int(engine.generate(prompts, params).response_mask.sum()), args.repeats)
        sync = min(push_seconds(learner_model, engine) for _ in range(3))
        add(f"vllm engine (rlft, {label})", seconds, tokens, sync)
        if weight_sync == "broadcast":  # same engine as the row above; only the sync differs
            engine.llm.llm_engine.engine_core.shutdown()
            continue

        from vllm import SamplingParams as VLLMSampling
        from vllm.inputs import TokensPrompt
        raw = VLLMSampling(n=args.group_size, temperature=1.0, max_tokens=args.max_new_tokens, logprobs=0,
                           detokenize=False)
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        def standalone() -> int:
            outputs = engine.llm.generate(requests, raw, use_tqdm=False)
            return sum(len(c.token_ids) for o in outputs for c in o.outputs)
        seconds, tokens = timed(standalone, args.repeats)
        add(f"vllm LLM.generate alone ({label})", seconds, tokens, None)
        engine.llm.llm_engine.engine_core.shutdown()
        del engine

    params_mb = sum(p.numel() * p.element_size() for p in learner_model.parameters()) / 2 ** 20
    print(f"\n{args.prompts} prompts x {args.group_size} samples, <= {args.max_new_tokens} new tokens, "
          f"{args.model} ({params_mb:.1f} MB of weights), {args.device}, {torch.get_num_threads()} threads\n")
    print("| engine | generated tokens/s | batches/s | weight sync (s) |")
    print("|---|---:|---:|---:|")
    for name, tps, bps, sync in rows:
        print(f"| {name} | {tps:,.0f} | {bps:.2f} | {'' if sync is None else f'{sync:.4f}'} |")


if __name__ == "__main__":
    main()
