"""Build the shipped models: rlft/models/tiny_adder, the default, a ~1M-parameter Qwen2 with a character
tokenizer, and rlft/models/tiny_moe, a Qwen3-MoE of the same width (8 experts, top-2, in every layer).
Both are SFT-trained on the default addition task by a sloppy teacher that forgets each carry with
probability --forget-carry (see rlft/data/arithmetic.py).

    python scripts/build_tiny_model.py                     # writes rlft/models/tiny_adder (deterministic)
    python scripts/build_tiny_model.py --arch moe          # writes rlft/models/tiny_moe
    python scripts/build_tiny_model.py --arch calculator   # writes rlft/models/tiny_calculator

The result knows how to carry but mostly does not: greedy held-out accuracy settles at the share of
problems without a carry, and more SFT does not move it (the curve is saved as sft_curve.json).

tiny_calculator is the dense model with four more tokens (<call> </call> <result> </result>) and a chat
template, SFT-trained on multi-turn tool-calling episodes of the calculator task ("1234*567=", see
rlft/data/calculator.py) by a teacher that calls the tool only some of the time and copies its result
sloppily; the loss is on the model's turns (with their <eos>) only. After the build, episodes on held-out
problems measure accuracy, tool-call rate and copy accuracy, greedy and sampled (saved in sft_curve.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from functools import partial
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from rlft.data import calculator
from rlft.data.arithmetic import sloppy_sum, split_problems
from rlft.types import SamplingParams
from rlft.rollout.hf_engine import HFEngine

CHARS = "0123456789+-*/()=,. "
ROOT = Path(__file__).resolve().parent.parent


def warmup_cosine_lr(args, step: int, warmup: int = 100) -> float:
    """Linear warm-up, then cosine decay to args.min_lr_ratio of args.lr at args.steps."""
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    floor = args.min_lr_ratio
    return args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1} | {c: i + 2 for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def build_model(vocab_size: int, arch: str = "dense"):
    # head_dim 32: vLLM's CPU attention kernel rejects smaller heads. Calculator episodes (up to three
    # turns with tool results) are longer than sums, hence its longer context.
    shared = dict(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=128 if arch == "calculator" else 64,
                  tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    if arch in ("dense", "calculator"):
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


# --- tiny_calculator: multi-turn tool calling ---------------------------------------------------------------

CALCULATOR_STEPS = 1000

# Users' turns are their text, the model's turns end with <eos>, tool results come wrapped in <result></result>;
# a system message renders as nothing, and the generation prompt is empty (the model's turn just follows).
CALCULATOR_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}<eos>"
    "{% elif m['role'] == 'tool' %}<result>{{ m['content'] }}</result>{% endif %}{% endfor %}")


def build_calculator_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer plus <call> </call> <result> </result>, one special token each (ids 22-25)."""
    specials = list(calculator.TOOL_TOKENS)
    vocab = {"<pad>": 0, "<eos>": 1} | {c: i + 2 for i, c in enumerate(CHARS)}
    vocab |= {t: len(vocab) + i for i, t in enumerate(specials)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    # Matched in the text before the per-character split, and dropped by skip_special_tokens=True.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<pad>", "<eos>", *specials]])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                        extra_special_tokens=specials)
    tokenizer.chat_template = CALCULATOR_CHAT_TEMPLATE
    return tokenizer


def episode_tokens(messages: list[dict], tokenizer) -> tuple[list[int], list[int]]:
    """(ids, labels) of one episode as the chat template renders it; labels are -100 except on the model's
    turns (their text and <eos>), so neither the prompt nor a tool result is trained on."""
    ids, labels = [], []
    for m in messages:
        if m["role"] == "assistant":
            part = tokenizer.encode(m["content"]) + [tokenizer.eos_token_id]
            ids += part
            labels += part
        else:
            part = tokenizer.encode(m["content"] if m["role"] == "user" else calculator.tool_observation(m["content"]))
            ids += part
            labels += [-100] * len(part)
    return ids, labels


def calculator_batch(pairs, tokenizer, batch_size: int, teacher: dict, rng: random.Random):
    """A batch of teacher episodes as [(ids, mask, labels)], one tensor triple per episode length class:
    episodes without the tool are half as long as those with it, so padding them together would double the
    compute spent on them."""
    rows = []
    for _ in range(batch_size):
        a, b = pairs[rng.randrange(len(pairs))]
        rows.append(episode_tokens(calculator.teacher_episode(a, b, rng, **teacher), tokenizer))
    groups = []
    for called in (False, True):
        group = [r for r in rows if (tokenizer.convert_tokens_to_ids(calculator.CALL) in r[0]) == called]
        if not group:
            continue
        width = max(len(ids) for ids, _ in group)
        ids = torch.full((len(group), width), tokenizer.pad_token_id)
        labels = torch.full((len(group), width), -100)
        for i, (row, row_labels) in enumerate(group):
            ids[i, :len(row)] = torch.tensor(row)
            labels[i, :len(row)] = torch.tensor(row_labels)
        groups.append((ids, (ids != tokenizer.pad_token_id).long(), labels))
    return groups


def sft_loss(model, groups) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled tokens of all groups."""
    total, count = 0.0, 0
    for ids, mask, labels in groups:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        total = total + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                          ignore_index=-100, reduction="sum")
        count += int((target != -100).sum())
    return total / count


@torch.no_grad()
def run_episodes(model, tokenizer, problems, temperature: float, seed: int = 0, max_turns: int = 3,
                 max_new_tokens: int = 24) -> list[list[str]]:
    """Calculator episodes, batched: the model's turns (text without <eos>) for each problem. A turn
    `<call>EXPR</call>` gets `<result>VALUE</result>` and another turn, up to max_turns; any other turn,
    a call that is not a + - * expression, or a turn cut off before <eos>, ends the episode."""
    was_training = model.training
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], seed=seed)
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=max_new_tokens)
    contexts = [tokenizer.encode(p.prompt) for p in problems]
    turns: list[list[str]] = [[] for _ in problems]
    active = list(range(len(problems)))
    for turn in range(max_turns):
        if not active:
            break
        rollout = engine.generate([contexts[i] for i in active], params)
        still = []
        for row, i in enumerate(active):
            ids = rollout.response_ids[row][rollout.response_mask[row].bool()].tolist()
            contexts[i] += ids
            text = tokenizer.decode([t for t in ids if t != tokenizer.eos_token_id], skip_special_tokens=False)
            turns[i].append(text)
            expression = calculator.parse_call(text)
            value = None if expression is None else calculator.evaluate_expression(expression)
            if value is None or rollout.truncated[row] or turn == max_turns - 1:
                continue
            contexts[i] += tokenizer.encode(calculator.tool_observation(value))
            still.append(i)
        active = still
    if was_training:
        model.train().requires_grad_(True)  # the engine froze the shared model
    return turns


def episode_metrics(problems, turns: list[list[str]]) -> dict:
    """accuracy: the last turn is the answer; call_rate: some turn calls the tool; call_exact: the first
    turn calls it with the problem's expression (share of episodes that call); copy_accuracy: after such a
    call the next turn is the answer (share of those); no_call_accuracy: accuracy without any call."""
    n = len(problems)
    right = [t[-1] == p.answer for p, t in zip(problems, turns)]
    called = [any(calculator.parse_call(x) is not None for x in t) for t in turns]
    exact = [calculator.parse_call(t[0]) == calculator.expression(p) for p, t in zip(problems, turns)]
    copied = [len(t) > 1 and t[1] == p.answer for p, t in zip(problems, turns)]
    n_called, n_exact = sum(called), sum(exact)
    return {
        "accuracy": sum(right) / n,
        "call_rate": n_called / n,
        "call_exact": sum(exact) / n_called if n_called else None,
        "copy_accuracy": sum(c for c, e in zip(copied, exact) if e) / n_exact if n_exact else None,
        "no_call_accuracy": (sum(r for r, c in zip(right, called) if not c) / (n - n_called)
                             if n > n_called else None),
    }


def build_calculator(args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)  # fixed, so the build is bitwise reproducible across machines of this size
    rng = random.Random(args.seed)
    train, held_out = calculator.split_problems(args.eval_size, args.split_seed, args.size)
    pairs = [calculator.operands(p) for p in train]
    measure = held_out[:args.measure_size]
    teacher = dict(call_prob_low=args.call_prob_low, call_prob_high=args.call_prob_high, copy_right=args.copy_right)
    tokenizer = build_calculator_tokenizer()
    for messages in (calculator.teacher_episode(1234, 567, random.Random(i), **teacher) for i in range(20)):
        ids, _ = episode_tokens(messages, tokenizer)  # the SFT rows are the chat template's episodes
        assert ids == tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False)), messages
    model = build_model(len(tokenizer), args.arch)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    lr_at = partial(warmup_cosine_lr, args)

    ema = copy.deepcopy(model).requires_grad_(False)
    curve, start = [], time.time()
    model.train()
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step - 1)
        loss = sft_loss(model, calculator_batch(pairs, tokenizer, args.batch_size, teacher, rng))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        decay = min(args.ema_decay, step / (step + 10))
        with torch.no_grad():
            for avg, param in zip(ema.parameters(), model.parameters()):
                avg.lerp_(param, 1 - decay)
        if step % args.eval_every == 0 or step == args.steps:
            greedy = episode_metrics(measure, run_episodes(ema, tokenizer, measure, temperature=0.0))
            curve.append({"step": step, "loss": round(loss.item(), 4)} | {f"greedy_{k}": v for k, v in greedy.items()})
            print(f"step {step:5d}  loss {loss.item():.4f}  greedy (EMA) accuracy {greedy['accuracy']:.3f}  "
                  f"call rate {greedy['call_rate']:.3f}  call exact {greedy['call_exact']}  "
                  f"copy {greedy['copy_accuracy']}  ({time.time() - start:.0f}s)", flush=True)
    build_seconds = round(time.time() - start)

    model = ema.eval()
    final = {"problems": len(measure), "held_out": "the first measure_size held-out problems (split_seed)",
             "greedy": episode_metrics(measure, run_episodes(model, tokenizer, measure, temperature=0.0)),
             "sampled": episode_metrics(measure, run_episodes(model, tokenizer, measure, temperature=1.0,
                                                              seed=args.seed))}
    for mode in ("greedy", "sampled"):
        print(f"{mode:8s}" + "  ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in final[mode].items()))
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out, save_jinja_files=False)  # the chat template inside tokenizer_config.json
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(args.out)
    build = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    (args.out / "sft_curve.json").write_text(json.dumps(
        {"build_args": build, "sft_seconds": build_seconds, "final": final, "curve": curve}, indent=1) + "\n")
    print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=["dense", "moe", "calculator"], default="dense")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: rlft/models/tiny_adder, tiny_moe or tiny_calculator")
    parser.add_argument("--steps", type=int, default=None, help="default: 5000 (calculator: %d)" % CALCULATOR_STEPS)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--min-lr-ratio", type=float, default=0.02, help="cosine decay ends at lr x this")
    parser.add_argument("--forget-carry", type=float, default=0.6)
    parser.add_argument("--eval-every", type=int, default=None, help="default: 250 (calculator: 100)")
    parser.add_argument("--ema-decay", type=float, default=0.998,
                        help="the shipped weights are this EMA of the SFT weights: the noisy teacher makes single "
                             "steps jitter near its 0.4/0.6 carry decision, the average does not")
    parser.add_argument("--seed", type=int, default=0)
    # These match conf/data/arithmetic.yaml, so SFT never sees the held-out problems.
    parser.add_argument("--min-operand", type=int, default=10)
    parser.add_argument("--max-operand", type=int, default=99)
    parser.add_argument("--eval-size", type=int, default=500,
                        help="held-out problems SFT never sees (calculator: any data.eval_size up to this)")
    parser.add_argument("--split-seed", type=int, default=0)
    calc = parser.add_argument_group("--arch calculator (the teacher: rlft/data/calculator.py)")
    calc.add_argument("--size", type=int, default=200000, help="training problems SFT draws from")
    calc.add_argument("--call-prob-low", type=float, default=calculator.CALL_PROB_LOW,
                      help="the teacher's tool-call probability when a's first digit is 1-3")
    calc.add_argument("--call-prob-high", type=float, default=calculator.CALL_PROB_HIGH,
                      help="... and when it is 4-9")
    calc.add_argument("--copy-right", type=float, default=calculator.COPY_RIGHT,
                      help="probability that the teacher copies the tool's result right")
    calc.add_argument("--measure-size", type=int, default=200, help="held-out episodes measured after the build")
    args = parser.parse_args()
    if args.arch == "calculator":
        args.steps = args.steps or CALCULATOR_STEPS
        args.eval_every = args.eval_every or 100
        args.out = args.out or ROOT / "rlft/models/tiny_calculator"
        for key in ("forget_carry", "min_operand", "max_operand"):
            delattr(args, key)
        return build_calculator(args)
    for key in ("size", "call_prob_low", "call_prob_high", "copy_right", "measure_size"):
        delattr(args, key)
    args.steps = args.steps or 5000
    args.eval_every = args.eval_every or 250
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
    lr_at = partial(warmup_cosine_lr, args)

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
