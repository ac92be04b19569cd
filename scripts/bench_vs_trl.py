"""rlft against TRL's GRPOTrainer on the same work, back to back on this machine (CPU), in one table.

    pip install -e '.[bench]'                     # TRL, pinned (`make bench` installs it and runs this)
    python scripts/bench_vs_trl.py                # tiny_adder: 4 cases x 3 repeats, both frameworks
    python scripts/bench_vs_trl.py --model smollm2_135m --cases grpo_kl0 --steps 4   # after `make smollm2`
    python scripts/bench_vs_trl.py --report runs/bench_vs_trl/tiny_adder   # the table again from results

Both train the same starting model on the same training prompts (rlft's task split), with the same group
size, completion length, prompts per step (one optimizer step each, no gradient accumulation), learning
rate (constant, no warm-up), clip range, KL coefficient (k3 estimator, in the loss) and loss aggregation
(`grpo`: mean over each response's tokens, then over responses; `dapo`: mean over all tokens of the step).
Both score completions with rlft's reward code, and both trained models are evaluated by the same greedy
held-out pass afterwards. Each run is its own process; peak RSS is that process's.

Same work: the two runs must have sampled the same number of responses, and (sampling differs) generated
and trained token counts within --token-tolerance of each other; a case that fails this prints no ratio.
The ratio rlft/TRL is per repeat; the table gives its median and range over the repeats.

Below the table, per case: rlft's step against its floor, the least time this machine's measured peaks
allow for its generate, reference, forward and backward work (rlft.tooling.flops; the peaks are
scripts/measure_peaks.py's cache, measured once here first when there is none).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Per model: the task's overrides (data, reward, prompt format) and the batch of the comparison.
MODELS = {
    "tiny_adder": dict(overrides=[], prompts_per_step=32, group_size=8, max_new_tokens=8, lr=1e-4, steps=20),
    "smollm2_135m": dict(overrides=["data.min_operand=1", "data.max_operand=20", "data.eval_size=100",
                                    "data.system_prompt='Reply with only the final number.'",
                                    "reward.fns=[answer_match]", "reward.accuracy=answer_match"],
                         prompts_per_step=8, group_size=8, max_new_tokens=16, lr=5e-6, steps=4),
}
# loss: rlft algo.loss_agg and TRL loss_type of the same aggregation.
LOSSES = {"grpo": ("seq_mean_token_mean", "grpo"), "dapo": ("token_mean", "dapo")}
CASES = {f"{loss}_kl{kl:g}": (loss, kl) for loss in LOSSES for kl in (0.0, 0.04)}


@dataclass
class Spec:
    """One run of either framework."""

    model: str
    case: str
    seed: int
    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    lr: float
    overrides: list[str]
    out: str


@dataclass
class Result:
    step_seconds: list[float]
    generated_tokens: int
    trained_tokens: int
    responses: int
    train_reward_last: float  # mean sampled reward of the last quarter of the steps
    peak_rss_mb: float = 0.0
    accuracy_before: float = float("nan")
    accuracy_after: float = float("nan")
    floor_seconds: list[float] = field(default_factory=list)  # rlft: each step's floor (perf/step_floor_seconds)

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds)


# ------------------------------------------------------------------------------------------- the runs
def rlft_config(spec: Spec, extra: list[str] = ()):
    """The composed, typed rlft config of a spec (what `rlft train` would run)."""
    from rlft.config.compose import compose, to_run_config

    loss, kl = CASES[spec.case]
    overrides = [f"model={spec.model}", f"seed={spec.seed}", f"trainer.steps={spec.steps}",
                 f"trainer.prompts_per_step={spec.prompts_per_step}", f"algo.group_size={spec.group_size}",
                 f"rollout.max_new_tokens={spec.max_new_tokens}", f"optim.lr={spec.lr}", "optim.warmup_steps=0",
                 f"algo.kl_coef={kl}", f"algo.loss_agg={LOSSES[loss][0]}", "trainer.eval_every=1000000",
                 "trainer.save_every=1000000", "logger.console=false", *spec.overrides, *extra]
    return to_run_config(*compose(overrides))


def run_rlft(spec: Spec) -> Result:
    from rlft.tooling.monitor import read_metrics
    from rlft.trainer import train

    run_dir = Path(spec.out)
    shutil.rmtree(run_dir, ignore_errors=True)  # a rerun starts fresh (rlft refuses a used run directory)
    train(rlft_config(spec), run_dir)
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") != "eval"]
    floor = "perf/step_floor_seconds"  # absent without cached peaks; a step that trained nothing has no work
    return Result(step_seconds=[r["perf/step_seconds"] for r in steps],
                  floor_seconds=[r.get(floor, 0.0) for r in steps] if any(floor in r for r in steps) else [],
                  generated_tokens=sum(r["rollout/tokens"] for r in steps),
                  trained_tokens=sum(int(r["train/tokens"]) for r in steps),
                  responses=len(steps) * spec.prompts_per_step * spec.group_size,
                  train_reward_last=last_quarter_mean([r["train/reward_mean"] for r in steps]))


def run_trl(spec: Spec) -> Result:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlft.data import load_task
    from rlft.data.prompts import PromptEncoder
    from rlft.models.loading import load_tokenizer, resolve_model_path
    from rlft.rewards.scorer import RewardScorer

    cfg = rlft_config(spec)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    train_problems, _ = load_task(cfg.data)
    system_prompt = getattr(cfg.data, "system_prompt", None)
    chat = PromptEncoder(tokenizer, getattr(cfg.data, "chat_template", None), system_prompt).chat
    scorer = RewardScorer(cfg.reward, max_response_tokens=spec.max_new_tokens)

    def prompt_of(problem):  # the prompt rlft's PromptEncoder renders, in TRL's dataset format
        if not chat:  # TRL tokenises plain prompts without special tokens: add the ones rlft's encoding has
            return tokenizer.decode(tokenizer.encode(problem.prompt))
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return system + [{"role": "user", "content": problem.prompt}]

    dataset = Dataset.from_list([{"prompt": prompt_of(p), "index": i} for i, p in enumerate(train_problems)])
    counts = {"generated": 0, "responses": 0, "rewards": []}

    def rlft_reward(prompts, completions, completion_ids, index, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        scores = scorer.score([train_problems[i] for i in index], texts, [len(ids) for ids in completion_ids])
        counts["generated"] += sum(len(ids) for ids in completion_ids)
        counts["responses"] += len(texts)
        counts["rewards"].append(scores.total.mean().item())
        return scores.total.tolist()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.start)

    loss, kl = CASES[spec.case]
    batch = spec.prompts_per_step * spec.group_size
    args = GRPOConfig(
        output_dir=spec.out, seed=spec.seed, max_steps=spec.steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=spec.group_size, max_completion_length=spec.max_new_tokens,
        learning_rate=spec.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=cfg.optim.weight_decay,
        adam_beta1=cfg.optim.betas[0], adam_beta2=cfg.optim.betas[1], adam_epsilon=cfg.optim.eps,
        max_grad_norm=cfg.optim.max_grad_norm, beta=kl, loss_type=LOSSES[loss][1], epsilon=cfg.algo.eps_low,
        epsilon_high=cfg.algo.eps_high, num_iterations=1, scale_rewards="group", temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, top_k=0, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32})
    timer = StepTimer()
    trainer = GRPOTrainer(model=model_path, reward_funcs=rlft_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    trainer.save_model(str(Path(spec.out) / "final_model"))
    tokenizer.save_pretrained(str(Path(spec.out) / "final_model"))
    scorer.close()
    # TRL trains on every completion token up to and including the first EOS (no truncation masking here)
    return Result(step_seconds=timer.seconds, generated_tokens=counts["generated"],
                  trained_tokens=counts["generated"], responses=counts["responses"],
                  train_reward_last=last_quarter_mean(counts["rewards"]))


def held_out_accuracy(spec: Spec, model_dir: str | None) -> float:
    """Greedy accuracy on rlft's held-out split of the task: the starting model (None) or a trained one."""
    from rlft.data import load_task
    from rlft.data.prompts import PromptEncoder
    from rlft.models.loading import load_tokenizer, resolve_model_path
    from rlft.rewards.scorer import RewardScorer
    from rlft.rollout import build_engine
    from rlft.types import SamplingParams

    cfg = rlft_config(spec, [f"model.path={model_dir}"] if model_dir else [])
    path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(path)
    _, held_out = load_task(cfg.data)
    engine = build_engine(cfg.rollout, path, cfg.model.dtype, "cpu", tokenizer, seed=0)
    scorer = RewardScorer(cfg.reward, max_response_tokens=spec.max_new_tokens)
    encode = PromptEncoder(tokenizer, getattr(cfg.data, "chat_template", None), getattr(cfg.data, "system_prompt", None))
    rollout = engine.generate([encode(p.prompt) for p in held_out],
                              SamplingParams(n=1, temperature=0.0, max_new_tokens=spec.max_new_tokens))
    completions = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    return scorer.score(held_out, completions, rollout.response_lengths.tolist()).correct.mean().item()


def last_quarter_mean(values: list[float]) -> float:
    tail = values[-max(1, len(values) // 4):]
    return sum(tail) / len(tail)


# -------------------------------------------------------------------------------------- orchestration
def in_subprocess(role: str, spec: Spec, model_dir: str | None = None) -> tuple[dict, float]:
    """Run `role` for `spec` in a fresh process: (its JSON answer, its peak RSS in MB)."""
    answer = Path(spec.out) / f"{role}.json"
    answer.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--worker", role, "--spec", json.dumps(asdict(spec)),
               "--answer", str(answer)] + (["--model-dir", model_dir] if model_dir else [])
    process = subprocess.Popen(command, cwd=ROOT, env=os.environ | {"TOKENIZERS_PARALLELISM": "false"})
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_vs_trl: the {role} run of {spec.case} (seed {spec.seed}) failed; "
                         f"see the output above")
    return json.loads(answer.read_text()), usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def run_pair(spec_of, case: str, seed: int, order: tuple[str, str]) -> dict[str, Result]:
    results = {}
    for framework in order:
        spec = spec_of(framework, case, seed)
        answer, rss = in_subprocess(framework, spec)
        result = Result(**answer)
        result.peak_rss_mb = rss
        result.accuracy_after = in_subprocess("eval", spec, str(Path(spec.out) / "final_model"))[0]["accuracy"]
        results[framework] = result
        (Path(spec.out) / "result.json").write_text(json.dumps(asdict(result)))
    return results


def same_work(rlft: Result, trl: Result, tolerance: float) -> str | None:
    """None when the two runs did the same work, else why not."""
    if rlft.responses != trl.responses or len(rlft.step_seconds) != len(trl.step_seconds):
        return f"responses {rlft.responses} vs {trl.responses}, steps {len(rlft.step_seconds)} vs {len(trl.step_seconds)}"
    for what in ("generated_tokens", "trained_tokens"):
        ours, theirs = getattr(rlft, what), getattr(trl, what)
        if abs(ours - theirs) > tolerance * theirs:
            return f"{what} {ours} vs {theirs} (more than {tolerance:.0%} apart)"
    return None


def table(results: dict[str, list[dict[str, Result]]], before: float, tolerance: float) -> str:
    """Median over repeats of each figure, and the ratio rlft/TRL (median and range over repeats)."""
    figures = {  # name -> (value of a result, higher is better)
        "steps/s": (lambda r: len(r.step_seconds) / r.seconds, True),
        "generated tok/s": (lambda r: r.generated_tokens / r.seconds, True),
        "trained tok/s": (lambda r: r.trained_tokens / r.seconds, True),
        "peak RSS (MB)": (lambda r: r.peak_rss_mb, False),
        "train reward (last 1/4)": (lambda r: r.train_reward_last, True),
        "held-out accuracy after": (lambda r: r.accuracy_after, True),
    }
    lines = [f"held-out accuracy of the starting model: {before:.3f}", "",
             "| case | figure | rlft | TRL | rlft/TRL median | range |", "|---|---|---:|---:|---:|---|"]
    problems = []
    for case, pairs in results.items():
        mismatch = [m for m in (same_work(p["rlft"], p["trl"], tolerance) for p in pairs) if m]
        if mismatch:
            problems.append(f"{case}: not the same work, no ratio ({mismatch[0]})")
        for name, (value, _) in figures.items():
            ours = statistics.median(value(p["rlft"]) for p in pairs)
            theirs = statistics.median(value(p["trl"]) for p in pairs)
            ratios = [value(p["rlft"]) / value(p["trl"]) if value(p["trl"]) else float("nan") for p in pairs]
            ratio = "-" if mismatch else f"{statistics.median(ratios):.2f}"
            spread = "-" if mismatch else f"{min(ratios):.2f}-{max(ratios):.2f}"
            lines.append(f"| {case} | {name} | {ours:.4g} | {theirs:.4g} | {ratio} | {spread} |")
        work = pairs[0]
        lines.append(f"| {case} | tokens generated/trained (repeat 1) | {work['rlft'].generated_tokens}/"
                     f"{work['rlft'].trained_tokens} | {work['trl'].generated_tokens}/{work['trl'].trained_tokens}"
                     f" | | |")
    return "\n".join(lines + [""] + floor_lines(results) + problems)


def floor_lines(results: dict[str, list[dict[str, Result]]]) -> list[str]:
    """Per case, rlft's summed step floors over its summed step time (median over repeats): the share of
    the machine's peak its step reaches. At least that share: the floor counts the least work (2N FLOPs
    per generated or reference token, 6N per trained token, and attention)."""
    lines = []
    for case, pairs in results.items():
        runs = [p["rlft"] for p in pairs if p["rlft"].floor_seconds]
        if runs:
            share = statistics.median(sum(r.floor_seconds) / r.seconds for r in runs)
            floor = statistics.median(sum(r.floor_seconds) / len(r.floor_seconds) for r in runs)
            step = statistics.median(r.seconds / len(r.step_seconds) for r in runs)
            lines.append(f"{case}: rlft, the step at >= {100 * share:.1f}% of its FLOP floor on this machine "
                         f"(floor {floor:.4f} s a step, step {step:.4f} s; medians over {len(runs)} repeats)")
    return lines + [""] if lines else []


def peaks_line() -> str:
    """This machine's cached peaks, measured first (once) when there are none."""
    from rlft.tooling.peaks import load_peaks, peaks_file

    if load_peaks("cpu") is None:
        print(f"bench_vs_trl: no peaks cached for this machine ({peaks_file('cpu')}): measuring them once "
              "(scripts/measure_peaks.py)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "scripts/measure_peaks.py")], check=True)
    peaks = load_peaks("cpu")
    return (f"peaks of this machine (scripts/measure_peaks.py, {peaks.date}): "
            f"{peaks.matmul_gflops.get('float32', float('nan')):.1f} GFLOP/s float32 matmul, "
            f"{peaks.read_gbps:.2f} GB/s memory read, {peaks.threads} threads")


def load_results(out: Path) -> tuple[dict[str, list[dict[str, Result]]], float]:
    results: dict[str, list[dict[str, Result]]] = {}
    for case_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name in CASES):
        for seed_dir in sorted(case_dir.iterdir()):
            pair = {f: Result(**json.loads((seed_dir / f / "result.json").read_text())) for f in ("rlft", "trl")
                    if (seed_dir / f / "result.json").is_file()}
            if len(pair) == 2:
                results.setdefault(case_dir.name, []).append(pair)
    return results, json.loads((out / "before.json").read_text())["accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny_adder")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, help="steps per run (default: the model's)")
    parser.add_argument("--token-tolerance", type=float, default=0.1)
    parser.add_argument("--out", type=Path, help="default: runs/bench_vs_trl/MODEL")
    parser.add_argument("--report", type=Path, help="print the table from a finished benchmark directory")
    parser.add_argument("--worker", choices=["rlft", "trl", "eval"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--answer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:  # one run, in its own process
        spec = Spec(**json.loads(args.spec))
        if args.worker == "eval":
            answer = {"accuracy": held_out_accuracy(spec, args.model_dir)}
        else:
            answer = asdict((run_rlft if args.worker == "rlft" else run_trl)(spec))
        args.answer.write_text(json.dumps(answer))
        return
    if args.report:
        results, before = load_results(args.report)
        print(table(results, before, args.token_tolerance))
        return

    preset = MODELS[args.model]
    out = args.out or ROOT / "runs/bench_vs_trl" / args.model

    def spec_of(framework: str, case: str, seed: int) -> Spec:
        return Spec(model=args.model, case=case, seed=seed, steps=args.steps or preset["steps"],
                    prompts_per_step=preset["prompts_per_step"], group_size=preset["group_size"],
                    max_new_tokens=preset["max_new_tokens"], lr=preset["lr"], overrides=preset["overrides"],
                    out=str(out / case / f"seed{seed}" / framework))

    peaks = peaks_line()  # before the runs: rlft's runs read the cache for their floors
    before = in_subprocess("eval", spec_of("start", args.cases[0], 0))[0]["accuracy"]
    (out / "before.json").write_text(json.dumps({"accuracy": before}))
    results: dict[str, list[dict[str, Result]]] = {}
    for seed in range(args.repeats):
        for case in args.cases:
            order = ("rlft", "trl") if seed % 2 == 0 else ("trl", "rlft")  # neither always runs first
            results.setdefault(case, []).append(run_pair(spec_of, case, seed, order))
            print(f"bench_vs_trl: {case} repeat {seed + 1}/{args.repeats} done", flush=True)
    report = table(results, before, args.token_tolerance) + "\n" + peaks
    command = "python scripts/bench_vs_trl.py " + " ".join(sys.argv[1:])
    (out / "table.md").write_text(f"`{command.strip()}`\n\n{report}\n")
    print(report)


if __name__ == "__main__":
    main()
