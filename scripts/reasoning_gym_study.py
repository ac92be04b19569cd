"""SmolLM2-135M-Instruct on reasoning-gym tasks (the presets in conf/experiment/), several seeds: held-out strict
accuracy against wall-clock minutes. Runs two at a time, each pinned to its own core (taskset), so the machine's
two cores finish the grid in half the time; a run alone on both cores is faster, so the minutes are an upper
bound. Results are JSONL (resumable: a finished run is not run again), then a markdown table and a figure.

    make smollm2
    .venv/bin/python scripts/reasoning_gym_study.py                     # both presets, seeds 0 1 2 (about 75 min)
    .venv/bin/python scripts/reasoning_gym_study.py --report-only       # the table and figure from the JSONL

Each run is `rlft train experiment=NAME seed=S`; a watcher stamps each metrics row with the minutes since the
run's launch (model loading included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ["smollm2_chain_sum", "smollm2_products"]


def run_pinned(jobs: list[tuple[str, int]], out: Path, cores: list[int]) -> None:
    """Launch the jobs at once, job i on cores[i]; stamp every metrics row as it appears; append to results."""
    launched = []
    for (name, seed), core in zip(jobs, cores):
        run_dir = out / f"{name}_s{seed}"
        if run_dir.exists():  # a run cut short earlier: start it again from nothing
            import shutil
            shutil.rmtree(run_dir)
        log = open(out / f"{name}_s{seed}.log", "w")
        command = ["taskset", "-c", str(core), str(ROOT / ".venv/bin/rlft"), "train", f"experiment={name}",
                   f"seed={seed}", f"hydra.run.dir={run_dir}"]
        launched.append((name, seed, run_dir, time.time(), subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT)))
    seen = {name_seed: 0 for name_seed in [(n, s) for n, s, *_ in launched]}
    rows: dict[tuple[str, int], list[dict]] = {key: [] for key in seen}
    while True:
        running = [p.poll() is None for *_, p in launched]
        for name, seed, run_dir, start, _ in launched:
            metrics = run_dir / "metrics.jsonl"
            if not metrics.exists():
                continue
            lines = metrics.read_text().splitlines()
            for line in lines[seen[(name, seed)]:]:
                if not line.endswith("}"):
                    break  # written half
                row = json.loads(line)
                seen[(name, seed)] += 1
                if row.get("kind") == "eval":
                    rows[(name, seed)].append({"experiment": name, "seed": seed, "step": row["step"],
                                               "accuracy": row["eval/accuracy"],
                                               "minutes": round((time.time() - start) / 60, 2)})
        if not any(running):
            break
        time.sleep(2)
    failed = []
    for (name, seed, run_dir, _, process) in launched:
        if process.returncode != 0:
            failed.append(f"{name} seed {seed} failed: see {out / f'{name}_s{seed}.log'}")
            continue
        with open(out / "results.jsonl", "a") as f:
            for row in rows[(name, seed)]:
                f.write(json.dumps(row) + "\n")
    if failed:
        sys.exit("\n".join(failed))


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def table(results: list[dict], budget_minutes: float) -> str:
    """Per experiment and seed: the start, the last evaluation within the budget (the gain is counted from
    it, not from the best one, which would pick the noise's high points), the best within it, the last."""
    lines = [f"| experiment | seed | start | last within {budget_minutes:g} min (step, minutes) | gain | best within "
             f"{budget_minutes:g} min | at the end (step, minutes) |", "|---|---:|---:|---|---:|---:|---|"]
    for name in sorted({r["experiment"] for r in results}):
        gains = []
        for seed in sorted({r["seed"] for r in results if r["experiment"] == name}):
            rows = sorted((r for r in results if r["experiment"] == name and r["seed"] == seed), key=lambda r: r["step"])
            start = rows[0]["accuracy"]
            within = [r for r in rows if r["minutes"] <= budget_minutes]
            reached, best, last = within[-1], max(r["accuracy"] for r in within), rows[-1]
            gains.append(reached["accuracy"] - start)
            lines.append(f"| {name} | {seed} | {start:.2f} | {reached['accuracy']:.2f} ({reached['step']}, "
                         f"{reached['minutes']:.1f}) | +{100 * gains[-1]:.0f} | {best:.2f} | {last['accuracy']:.2f} "
                         f"({last['step']}, {last['minutes']:.1f}) |")
        lines.append(f"| {name} | mean | | | +{100 * sum(gains) / len(gains):.0f} | | |")
    return "\n".join(lines)


def figure(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted({r["experiment"] for r in results})
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), sharey=True)
    for ax, name in zip([axes] if len(names) == 1 else axes, names):
        for seed in sorted({r["seed"] for r in results if r["experiment"] == name}):
            rows = sorted((r for r in results if r["experiment"] == name and r["seed"] == seed), key=lambda r: r["step"])
            ax.plot([r["minutes"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=f"seed {seed}")
        ax.axvline(20, color="grey", linestyle=":", linewidth=1)
        ax.set_title(name)
        ax.set_xlabel("minutes since launch (one core each)")
        ax.grid(alpha=0.3)
    (axes if len(names) == 1 else axes[0]).set_ylabel("held-out strict accuracy (greedy)")
    (axes if len(names) == 1 else axes[0]).legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "reasoning_gym_study")
    parser.add_argument("--budget-minutes", type=float, default=20.0)
    parser.add_argument("--figure", type=Path, default=None, help="the PNG (default: OUT/curves.png)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.jsonl"
    if not args.report_only:
        done = {(r["experiment"], r["seed"]) for r in read_results(results_path)}
        jobs = [(name, int(seed)) for seed in args.seeds.split(",") for name in args.experiments.split(",")
                if (name, int(seed)) not in done]
        cores = sorted(os.sched_getaffinity(0))
        for first in range(0, len(jobs), len(cores)):
            run_pinned(jobs[first:first + len(cores)], args.out, cores)
    results = read_results(results_path)
    print(table(results, args.budget_minutes))
    figure(results, args.figure or args.out / "curves.png")


if __name__ == "__main__":
    main()
