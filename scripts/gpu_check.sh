#!/usr/bin/env bash
# One short GPU check of rlft (single GPU, the HF engine; bf16 and fp32), printing one table per run:
#   bash scripts/gpu_check.sh [OUT_DIR]        (OUT_DIR default: runs/gpu_check)
# Runs: the default tiny run in bf16 (mixed precision, pure bf16, one step ahead) and fp32 (learning and
# engine-learner mismatch), routing replay on the tiny MoE, and randomly initialised SmolLM2-135M-sized and Qwen2.5-0.5B-shaped models (0.4B with SmolLM2's vocabulary) for step times
# with long responses (random weights never stop early, so every response is max_new_tokens long).
# A multi-turn run (the calculator tool with the built-in tiny tool model) checks episodes on the GPU.
# Each part has its own time limit and the script goes on when one fails. RLFT_GPU_CHECK_DEVICE=cpu and
# RLFT_GPU_CHECK_SCALE=0.1 try the script itself on a CPU; RLFT_GPU_CHECK_PARTS="tiny_bf16_mixed calculator_bf16"
# runs only the parts named (default: all).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_check}
DEVICE=${RLFT_GPU_CHECK_DEVICE:-cuda}
SCALE=${RLFT_GPU_CHECK_SCALE:-1}
PY=${PYTHON:-python3}
PARTS=${RLFT_GPU_CHECK_PARTS:-all}
mkdir -p "$OUT"
export TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1 PYTHONUNBUFFERED=1
n() { $PY -c "print(max(1, round($1 * $SCALE)))"; }

$PY - <<'EOF' | tee "$OUT/env.txt"
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))
EOF

train() {  # name, time limit (s), overrides...
    local name=$1 limit=$2; shift 2
    [[ $PARTS == all || " $PARTS " == *" $name "* ]] || return 0
    echo "== $name: rlft train $*"
    timeout "$limit" $PY -m rlft.cli train "hydra.run.dir=$OUT/$name" hardware.device="$DEVICE" \
        logger.console=false trainer.save_every=1000000 "$@" > "$OUT/$name.log" 2>&1
    echo "   exit $? ($(tail -c 300 "$OUT/$name.log" | tr '\n' ' ' | cut -c1-300))"
}

# Random-weight models of real sizes, with SmolLM2's tokenizer (a folder holding tokenizer.json; default
# the one `make smollm2` converts; RLFT_GPU_CHECK_TOKENIZER names another).
TOKENIZER=${RLFT_GPU_CHECK_TOKENIZER:-${RLFT_CACHE:-$HOME/.cache/rlft}/models/smollm2-135m-instruct}
$PY - "$OUT" "$TOKENIZER" <<'EOF'
import sys
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
import torch
out = Path(sys.argv[1])
tok_dir = Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(tok_dir)
sizes = {  # SmolLM2-135M's shape, and Qwen2.5-0.5B's (0.4B parameters with this vocabulary)
    "random_135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, intermediate_size=1536, tie_word_embeddings=True),
    "random_400m": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
}
for name, shape in sizes.items():
    model_type = shape.pop("model_type")
    cfg = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), max_position_embeddings=2048,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out / name)
    tokenizer.save_pretrained(out / name)
    print(name, sum(p.numel() for p in model.parameters()) / 1e6, "M parameters")
EOF

report() {  # the table of every finished run so far, into OUT/table.md (rewritten after each run)
    $PY - "$OUT" > "$OUT/table.md" <<'EOF'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
keys = ["perf/step_seconds", "perf/generate_seconds", "perf/reward_seconds", "perf/ref_seconds",
        "perf/forward_seconds", "perf/backward_seconds", "perf/optimizer_seconds", "sync/seconds",
        "perf/generate_tokens_per_s", "perf/train_tokens_per_s", "perf/peak_rss_mb", "perf/tool_seconds",
        "perf/step_floor_fraction",
        "episode/turns_mean", "episode/tool_call_rate",
        "rollout/logprob_diff_mean", "rollout/logprob_diff_max", "moe/routing_drift"]
print("Medians over the steps after the first; peak_rss_mb is torch.cuda.max_memory_allocated on a GPU.\n")
print("| run | steps | " + " | ".join(k.replace("sync/", "sync_").split("/")[-1] for k in keys) + " | held-out first -> last | held-out tool calls first -> last |")
print("|---|---:|" + "---:|" * len(keys) + "---|---|")
for run in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").is_file()):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") != "eval"]
    evals = [r["eval/accuracy"] for r in rows if r.get("kind") == "eval"]
    later = train[1:] or train  # step 1 holds one-time warm-up (CUDA context, kernels)
    cells = []
    for k in keys:
        vals = [r[k] for r in later if isinstance(r.get(k), (int, float))]
        cells.append(f"{statistics.median(vals):.4g}" if vals else "")
    calls = [r["eval/episode/tool_call_rate"] for r in rows if "eval/episode/tool_call_rate" in r]
    acc = f"{evals[0]:.3f} -> {evals[-1]:.3f}" if len(evals) > 1 else ""
    tool = f"{calls[0]:.3f} -> {calls[-1]:.3f}" if len(calls) > 1 else ""
    print(f"| {run.name} | {len(train)} | " + " | ".join(cells) + f" | {acc} | {tool} |")
EOF
}

TINY=(trainer.steps=$(n 40) trainer.eval_every=$(n 10))
SMALL_TASK=(data.system_prompt='Reply with only the final number.' reward.fns=[answer_match]
            reward.accuracy=answer_match trainer.eval_every=100 data.eval_size=64 algo.kl_coef=0.04 optim.lr=1e-6)
train tiny_bf16_mixed 55 model.dtype=bfloat16 "${TINY[@]}"; report
train random_135m_bf16 90 model.path="$OUT/random_135m" model.dtype=bfloat16 "${SMALL_TASK[@]}" \
    trainer.prompts_per_step=$(n 32) rollout.max_new_tokens=$(n 256) trainer.steps=4 compute.micro_batch_size=64; report
train random_400m_bf16 100 model.path="$OUT/random_400m" model.dtype=bfloat16 "${SMALL_TASK[@]}" \
    trainer.prompts_per_step=$(n 64) rollout.max_new_tokens=$(n 256) trainer.steps=3 compute.micro_batch_size=64 \
    compute.gradient_checkpointing=true; report
train tiny_fp32 55 model.dtype=float32 "${TINY[@]}"; report
train tiny_bf16_pure 55 model.dtype=bfloat16 model.master_dtype=bfloat16 "${TINY[@]}"; report
train tiny_bf16_async 55 model.dtype=bfloat16 rollout.async_steps=1 algo.tis_cap=2 "${TINY[@]}"; report
train calculator_bf16 75 model=tiny_calculator data=calculator env=calculator model.dtype=bfloat16 \
    trainer.steps=$(n 30) trainer.eval_every=$(n 10); report
train moe_replay_bf16 50 model=tiny_moe model.dtype=bfloat16 algo=gspo algo.routing_replay=true \
    algo.ppo_epochs=4 trainer.steps=$(n 10) trainer.eval_every=100; report
cat "$OUT/table.md"
