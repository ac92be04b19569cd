"""Run the default config for several seeds and print held-out accuracy before/after as a table,
next to the last points of the shipped model's SFT curve (which shows the start is a plateau).

    python scripts/learning_table.py                    # seeds 0 1 2, runs under runs/learning/
    python scripts/learning_table.py --no-run           # print the table again from those runs
    python scripts/learning_table.py -- optim.lr=5e-5   # extra overrides for every run
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
SFT_CURVE = ROOT / "rlft/models/tiny_adder/sft_curve.json"


def run(seed: int, run_dir: Path, overrides: list[str]) -> float:
    start = time.time()
    shutil.rmtree(run_dir, ignore_errors=True)  # a rerun starts fresh (rlft refuses a used run directory)
    subprocess.run([sys.executable, "-m", "rlft.cli", "train", f"seed={seed}", f"hydra.run.dir={run_dir}",
                    "logger.console=false", *overrides], check=True)
    seconds = time.time() - start
    (run_dir / "wall_seconds.txt").write_text(f"{seconds:.1f}\n")
    return seconds


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "eval"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs/learning")
    parser.add_argument("--no-run", action="store_true", help="only print the table from existing runs")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    for seed in args.seeds:
        if not args.no_run:
            run(seed, args.out / f"seed{seed}", args.overrides)

    print("| seed | held-out accuracy at step 0 | after | gain (points) | best eval | wall time (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    gains = []
    for seed in args.seeds:
        run_dir = args.out / f"seed{seed}"
        rows = evals(run_dir)
        before, after = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
        best = max(r["eval/accuracy"] for r in rows)
        wall = (run_dir / "wall_seconds.txt").read_text().strip() if (run_dir / "wall_seconds.txt").exists() else "-"
        gains.append(100 * (after - before))
        print(f"| {seed} | {before:.3f} | {after:.3f} | {gains[-1]:+.1f} | {best:.3f} | {wall} |")
    print(f"\nmean gain {sum(gains) / len(gains):+.1f} points, min {min(gains):+.1f}")

    curve = json.loads(SFT_CURVE.read_text())["curve"]
    last_fifth = [c for c in curve if c["step"] >= 0.8 * curve[-1]["step"]]
    accs = [c["held_out_accuracy"] for c in last_fifth]
    print(f"\nSFT curve of the shipped model, last fifth of its {curve[-1]['step']} steps "
          f"(spread {100 * (max(accs) - min(accs)):.1f} points):")
    print("| SFT step | " + " | ".join(str(c["step"]) for c in last_fifth) + " |")
    print("|---|" + "---:|" * len(last_fifth))
    print("| held-out accuracy | " + " | ".join(f"{a:.3f}" for a in accs) + " |")


if __name__ == "__main__":
    main()
