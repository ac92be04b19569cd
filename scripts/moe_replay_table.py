"""Routing replay on the built-in MoE model: GRPO and GSPO, replay off and on, several seeds, one table.

    python scripts/moe_replay_table.py                     # runs under runs/moe_replay/, then the table
    python scripts/moe_replay_table.py --no-run            # the table again from those runs
    python scripts/moe_replay_table.py -- optim.lr=3e-4    # extra overrides for every run

Off-policy updates are what make routing drift matter, so every run takes several optimizer steps per
batch (algo.ppo_epochs, micro-batches): the experts chosen in the old pass and in the later training
passes can then differ. Columns, means over the training steps:
  routing drift  share of token-layer pairs whose experts in a training pass differ from the old pass's
                 (the experts actually used: 0 with replay)
  router drift   the same for the experts the current router would pick (what replay overrides)
  clip fraction  tokens (GRPO) or sequences (GSPO) whose ratio was clipped
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ["model=tiny_moe", "trainer.steps=40", "trainer.eval_every=40", "algo.ppo_epochs=4",
        "compute.micro_batch_size=64", "trainer.prompts_per_step=32", "algo.group_size=8", "optim.lr=3e-4"]


def run(run_dir: Path, algo: str, replay: bool, seed: int, overrides: list[str]) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)  # a rerun starts fresh (rlft refuses a used run directory)
    subprocess.run([sys.executable, "-m", "rlft.cli", "train", f"hydra.run.dir={run_dir}", f"algo={algo}",
                    f"algo.routing_replay={str(replay).lower()}", f"seed={seed}", "logger.console=false",
                    *BASE, *overrides], check=True)


def summary(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") != "eval" and "moe/routing_drift" in r]
    evals = [r for r in rows if r.get("kind") == "eval"]
    mean = lambda key: statistics.fmean(r[key] for r in steps)  # noqa: E731
    return {"routing_drift": mean("moe/routing_drift"), "router_drift": mean("moe/router_drift"),
            "clip_frac": mean("train/clip_frac"), "before": evals[0]["eval/accuracy"],
            "after": evals[-1]["eval/accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=["grpo", "gspo"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs/moe_replay")
    parser.add_argument("--no-run", action="store_true", help="only print the table from existing runs")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    cells = [(algo, replay) for algo in args.algos for replay in (False, True)]
    results = {}
    for algo, replay in cells:
        for seed in args.seeds:
            run_dir = args.out / f"{algo}_replay{int(replay)}_seed{seed}"
            if not args.no_run:
                run(run_dir, algo, replay, seed, args.overrides)
            results[algo, replay, seed] = summary(run_dir)

    print(f"model=tiny_moe, {' '.join(BASE[1:] + args.overrides)}\n")
    print("| algo | routing replay | seed | routing drift | router drift | clip fraction | held-out before | after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (algo, replay, seed), r in results.items():
        print(f"| {algo} | {'on' if replay else 'off'} | {seed} | {r['routing_drift']:.4f} | {r['router_drift']:.4f} "
              f"| {r['clip_frac']:.4f} | {r['before']:.3f} | {r['after']:.3f} |")
    print("\n| algo | routing replay | mean routing drift | mean router drift | mean clip fraction | "
          "mean held-out after | range |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for algo, replay in cells:
        rs = [results[algo, replay, s] for s in args.seeds]
        afters = [r["after"] for r in rs]
        print(f"| {algo} | {'on' if replay else 'off'} | {statistics.fmean(r['routing_drift'] for r in rs):.4f} | "
              f"{statistics.fmean(r['router_drift'] for r in rs):.4f} | "
              f"{statistics.fmean(r['clip_frac'] for r in rs):.4f} | {statistics.fmean(afters):.3f} | "
              f"{min(afters):.3f}-{max(afters):.3f} |")


if __name__ == "__main__":
    main()
