"""Build the shipped models: rlft/models/tiny_adder, the default, a ~1M-parameter Qwen2 with a character
tokenizer, and rlft/models/tiny_moe, a Qwen3-MoE of the same width (8 experts, top-2, in every layer).
Both are SFT-trained on the default addition task by a sloppy teacher that forgets each carry with
probability --forget-carry (see rlft/data/arithmetic.py).

    python scripts/build_tiny_model.py              # writes rlft/models/tiny_adder (deterministic)
    python scripts/build_tiny_model.py --arch moe   # writes rlft/models/tiny_moe

The result knows how to carry but mostly does not: greedy held-out accuracy settles at the share of
problems without a carry, and more SFT does not move it (the curve is saved as sft_curve.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from rlft.data.arithmetic import sloppy_sum, split_problems
from rlft.types import SamplingParams
from rlft.rollout.hf_engine import HFEngine

CHARS = "0123456789+-*/()=,. "
ROOT = Path(__file__).resolve().parent.parent


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1} | {c: i + 2 for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def build_model(vocab_size: int, arch: str = "dense"):
    # head_dim 32: vLLM's CPU attention kernel rejects smaller heads.
    shared = dict(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=64, tie_word_embeddings=True,
                  pad_token_id=0, eos_token_id=1, bos_token_id=None)
    if arch == "dense":
        return Qwen2ForCausalLM(Qwen2Config(intermediate_size=512, **shared))
    # Every layer sparse; experts a quarter of the dense MLP's width, so 2 of 8 active cost about half of it.
    # SFT adds the router's load-balancing loss (router_aux_loss_coef), as MoE pre-training does.
    config = Qwen3MoeConfig(moe_intermediate_size=128, intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                            router_aux_loss_coef=0.01, **shared)
    return Qwen3MoeForCausalLM(config)


def sft_batch(pairs, tokenizer, batch_size: int, forget_carry: float, rng: random.Random):
    rows, prompt_lens = [], []
    for _ in range(batch_size):
        a, b = pairs[rng.randrange(len(pairs))]
        prompt = tokenizer.encode(f"{a}+{b}=")
        answer = tokenizer.encode(sloppy_sum(a, b, forget_carry, rng)) + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        prompt_lens.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.full((batch_size, width), tokenizer.pad_token_id)
    labels = torch.full((batch_size, width), -100)
    for i, (row, p) in enumerate(zip(rows, prompt_lens)):
        ids[i, :len(row)] = torch.tensor(row)
        labels[i, p:len(row)] = torch.tensor(row[p:])  # loss on the answer and EOS only
    return ids, (ids != tokenizer.pad_token_id).long(), labels


def held_out_accuracy(model, tokenizer, held_out) -> float:
    was_training = model.training
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], seed=0)
    rollout = engine.generate([tokenizer.encode(p.prompt) for p in held_out],
                              SamplingParams(n=1, temperature=0.0, max_new_tokens=6))
    texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    if was_training:
        model.train().requires_grad_(True)  # the engine froze the shared model
    return sum(t.strip() == p.answer for t, p in zip(texts, held_out)) / len(held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=["dense", "moe"], default="dense")
    parser.add_argument("--out", type=Path, default=None, help="default: rlft/models/tiny_adder or tiny_moe")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--min-lr-ratio", type=float, default=0.02, help="cosine decay ends at lr x this")
    parser.add_argument("--forget-carry", type=float, default=0.6)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--ema-decay", type=float, default=0.998,
                        help="the shipped weights are this EMA of the SFT weights: the noisy teacher makes single "
                             "steps jitter near its 0.4/0.6 carry decision, the average does not")
    parser.add_argument("--seed", type=int, default=0)
    # These match conf/data/arithmetic.yaml, so SFT never sees the held-out problems.
    parser.add_argument("--min-operand", type=int, default=10)
    parser.add_argument("--max-operand", type=int, default=99)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--split-seed", type=int, default=0)
    args = parser.parse_args()
    args.out = args.out or ROOT / "rlft/models" / ("tiny_adder" if args.arch == "dense" else "tiny_moe")

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)  # fixed, so the build is bitwise reproducible across machines of this size
    rng = random.Random(args.seed)
    train, held_out = split_problems(args.min_operand, args.max_operand, args.eval_size, args.split_seed)
    pairs = [tuple(map(int, p.prompt[:-1].split("+"))) for p in train]
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), args.arch)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 100

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        floor = args.min_lr_ratio
        return args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    moe_kwargs = {"output_router_logits": True} if args.arch == "moe" else {}  # adds the load-balancing loss
    ema = copy.deepcopy(model).requires_grad_(False)
    curve, start = [], time.time()
    model.train()
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step - 1)
        ids, mask, labels = sft_batch(pairs, tokenizer, args.batch_size, args.forget_carry, rng)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, **moe_kwargs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        decay = min(args.ema_decay, step / (step + 10))  # short memory at first, when weights move fast
        with torch.no_grad():
            for avg, param in zip(ema.parameters(), model.parameters()):
                avg.lerp_(param, 1 - decay)
        if step % args.eval_every == 0 or step == args.steps:
            acc = held_out_accuracy(ema, tokenizer, held_out)
            raw = held_out_accuracy(model, tokenizer, held_out)
            curve.append({"step": step, "loss": round(loss.item(), 4), "held_out_accuracy": acc,
                          "held_out_accuracy_raw_weights": raw})
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out accuracy {acc:.3f} (EMA), {raw:.3f} (raw)  "
                  f"({time.time() - start:.0f}s)", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model = ema.eval()
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(args.out)
    build = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    (args.out / "sft_curve.json").write_text(json.dumps({"build_args": build, "curve": curve}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
