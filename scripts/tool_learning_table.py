"""The calculator environment's learning table: the built-in tool model (model=tiny_calculator) trained with
env=calculator for several seeds; held-out accuracy, the share of episodes that call the tool, the share
that answer with the tool's output, and turns per episode at the chosen steps (greedy held-out episodes).

    python scripts/tool_learning_table.py                     # seeds 0 1 2, runs under runs/tool_learning/
    python scripts/tool_learning_table.py --no-run            # print the table again from those runs
    python scripts/tool_learning_table.py -- optim.lr=3e-4    # extra overrides for every run
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESET = ["env=calculator", "data=calculator", "model=tiny_calculator"]


def run(seed: int, run_dir: Path, steps: int, eval_every: int, overrides: list[str]) -> None:
    start = time.time()
    shutil.rmtree(run_dir, ignore_errors=True)  # rlft refuses a fresh run into a used directory
    subprocess.run([sys.executable, "-m", "rlft.cli", "train", *PRESET, f"seed={seed}", f"trainer.steps={steps}",
                    f"trainer.eval_every={eval_every}", f"trainer.save_every={steps}", f"hydra.run.dir={run_dir}",
                    "logger.console=false", *overrides], check=True)
    (run_dir / "wall_seconds.txt").write_text(f"{time.time() - start:.1f}\n")


def evals(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r.get("kind") == "eval"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--at", type=int, nargs="+", default=[0, 25, 50, 100], help="steps in the table")
    parser.add_argument("--out", type=Path, default=ROOT / "runs/tool_learning")
    parser.add_argument("--no-run", action="store_true", help="only print the table from existing runs")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    eval_every = min(b - a for a, b in zip(args.at, args.at[1:]))
    for seed in args.seeds:
        if not args.no_run:
            run(seed, args.out / f"seed{seed}", args.steps, eval_every, args.overrides)

    print("| seed | step | held-out accuracy | tool-call rate | answer = tool output | turns/episode | wall (s) |")
    print("|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        folder = args.out / f"seed{seed}"
        rows, wall = evals(folder), (folder / "wall_seconds.txt").read_text().strip()
        for step in args.at:
            r = rows.get(step)
            if r is None:
                continue
            print(f"| {seed} | {step} | {r['eval/accuracy']:.3f} | {r['eval/episode/tool_call_rate']:.3f} | "
                  f"{r['eval/episode/answer_from_tool']:.3f} | {r['eval/episode/turns_mean']:.2f} | "
                  f"{wall if step == args.at[-1] else ''} |")


if __name__ == "__main__":
    main()
