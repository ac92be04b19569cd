"""Learner pass speed: the forward + backward of one step's responses, padded vs prompt-shared vs packed
(padding-free), and both on (the default: each pass takes the one that feeds the model fewer
tokens). Prints a markdown table.

    .venv/bin/python scripts/bench_learner_pass.py                                   # tiny model, CPU
    .venv/bin/python scripts/bench_learner_pass.py --model smollm2_135m --task multistep --max-new-tokens 64

The batch is real: the model's own samples (HF engine, temperature 1) for --prompts prompts of the
default addition task, or of multistep (--task multistep, chat template where the model has one),
x --group-size, so the response lengths are as uneven as they come. With --uneven, the responses are
random tokens instead, of lengths drawn uniformly from 1 to --max-new-tokens (the time of a pass does
not depend on which tokens; reasoning runs look like this: some answers stop early, others run to the
limit). Each mode runs one warm-up step, then --repeats timed ones; the median is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlft.data.arithmetic import split_problems
from rlft.data.multistep import multistep_split
from rlft.data.prompts import PromptEncoder
from rlft.learner.logprobs import model_packing, response_logprobs
from rlft.models.gguf import cache_root
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlft.types import SamplingParams
from rlft.rollout.hf_engine import HFEngine

MODES = {"padded": {}, "prompt-shared": {"share_prompts": True}, "packed": {"padding_free": True},
         "both (rlft picks per pass; the default)": {"share_prompts": True, "padding_free": True}}


def step_seconds(model, rollout, micro_batch: int, mode: dict) -> float:
    start = time.perf_counter()
    for first in range(0, rollout.response_ids.shape[0], micro_batch):
        rows = slice(first, first + micro_batch)
        logp = response_logprobs(model, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                 rollout.response_ids[rows], rollout.response_mask[rows], **mode)
        logp.sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:tiny-adder", help="a path, hub id, builtin: or smollm2_135m")
    parser.add_argument("--task", choices=["addition", "multistep"], default="addition")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--uneven", action="store_true", help="cut responses to uniform random lengths")
    args = parser.parse_args()

    if args.model == "smollm2_135m":  # where `make smollm2` converts it
        args.model = str(cache_root() / "models" / "smollm2-135m-instruct")
    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    encode = PromptEncoder(tokenizer)
    if args.task == "multistep":
        problems, _ = multistep_split(args.prompts, 0, 3, 20, seed=0)
    else:
        problems, _ = split_problems(0, 99, 0, 0)
    prompts = [encode(p.prompt) for p in problems[:args.prompts]]
    engine = HFEngine(load_causal_lm(path, "float32", "cpu"), tokenizer.pad_token_id, [tokenizer.eos_token_id], seed=0)
    with torch.no_grad():  # --uneven: the prompts' rows only, its responses are replaced below
        rollout = engine.generate(prompts, SamplingParams(n=args.group_size, temperature=1.0,
                                                          max_new_tokens=1 if args.uneven else args.max_new_tokens))
    if args.uneven:
        gen = torch.Generator().manual_seed(0)
        rows, width = rollout.response_ids.shape[0], args.max_new_tokens
        lengths = torch.randint(1, width + 1, (rows, 1), generator=gen)
        rollout.response_mask = (torch.arange(width) < lengths).long()
        vocab = engine.model.config.vocab_size
        rollout.response_ids = torch.randint(0, vocab, (rows, width), generator=gen) * rollout.response_mask
    model = load_causal_lm(path, "float32", "cpu").train()
    real = int(rollout.prompt_mask.sum() + rollout.response_mask.sum())
    grid = rollout.prompt_ids.numel() + rollout.response_ids.numel()
    print(f"{args.model}, {args.task}: {rollout.response_ids.shape[0]} responses, "
          f"prompt width {rollout.prompt_ids.shape[1]}, response width {rollout.response_ids.shape[1]}, "
          f"{real} real tokens of {grid} ({1 - real / grid:.0%} padding), micro-batch {args.micro_batch}")
    packed_tokens, packed_passes, passes = 0, 0, 0
    for first in range(0, rollout.response_ids.shape[0], args.micro_batch):
        rows = slice(first, first + args.micro_batch)
        packing = model_packing(model, rollout.prompt_mask[rows], rollout.response_mask[rows])
        passes += 1
        if packing is None:  # not worth it: the packed mode runs this pass padded
            packed_tokens += rollout.prompt_mask[rows].numel() + rollout.response_mask[rows].numel()
        else:
            packed_tokens, packed_passes = packed_tokens + packing.rows * packing.width, packed_passes + 1
    print(f"packed: {packed_passes} of {passes} passes, {packed_tokens} tokens ({packed_tokens / grid:.0%} of padded)")
    times = {}
    for name, mode in MODES.items():
        step_seconds(model, rollout, args.micro_batch, mode)  # warm-up
        times[name] = statistics.median(step_seconds(model, rollout, args.micro_batch, mode)
                                        for _ in range(args.repeats))
    print("\n| pass | forward + backward s | vs padded |\n|---|---:|---:|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.3f} | {times['padded'] / seconds:.2f}x |")


if __name__ == "__main__":
    main()
