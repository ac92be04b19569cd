"""Comparison table of several runs (a Hydra multirun, or any run directories).

After `rlft train -m algo=grpo,dapo,gspo seed=0,1,2` the table is printed and written to the sweep
directory as comparison.md; `rlft compare DIR...` prints it again and plots the runs (rlft.tooling.compare).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

from hydra.experimental.callback import Callback
from rlft.config.compose import saved_config, saved_options
from rlft.tooling.metrics import EVAL_ACCURACY, STEP_SECONDS, TRAIN_REWARD, TRAIN_TOKENS

COLUMNS = ["held-out before", "held-out after", "first eval step >= 0.9", "train reward (last 10 steps)",
           "train time (s)", "tokens trained"]


def run_dirs_under(paths: list[Path]) -> list[Path]:
    """The run directories in `paths`: each path is a run (has metrics.jsonl) or a folder of runs."""
    found = []
    for path in paths:
        if (path / "metrics.jsonl").is_file():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.glob("*/metrics.jsonl")))
    return found


def run_label(options: dict[str, str]) -> str:
    """The algorithm, and the experiment preset when there is one (runs of two presets are not averaged)."""
    algo = options.get("algo", "?")
    return f"{algo} ({options['experiment']})" if "experiment" in options else algo


def summarize_run(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    evals = [r for r in rows if r.get("kind") == "eval"]
    steps = [r for r in rows if r.get("kind") != "eval"]
    rewards = [r[TRAIN_REWARD] for r in steps if TRAIN_REWARD in r][-10:]
    config = saved_config(run_dir / "config.yaml")
    return {
        "run": run_dir.name,
        "algo": run_label(saved_options(run_dir / "config.yaml")),
        "seed": config.seed,
        "held-out before": evals[0][EVAL_ACCURACY] if evals else None,
        "held-out after": evals[-1][EVAL_ACCURACY] if evals else None,
        "first eval step >= 0.9": next((r["step"] for r in evals if r[EVAL_ACCURACY] >= 0.9), None),
        "train reward (last 10 steps)": mean(rewards) if rewards else None,
        "train time (s)": sum(r.get(STEP_SECONDS, 0.0) for r in steps),
        "tokens trained": sum(r.get(TRAIN_TOKENS, 0) for r in steps),
    }


def format_table(summaries: list[dict]) -> str:
    lines = ["| algo | seed | " + " | ".join(COLUMNS) + " |", "|---|---:|" + "---:|" * len(COLUMNS)]
    for s in summaries:
        lines.append(f"| {s['algo']} | {s['seed']} | " + " | ".join(_fmt(s[c]) for c in COLUMNS) + " |")
    by_algo = defaultdict(list)
    for s in summaries:
        by_algo[s["algo"]].append(s)
    if any(len(group) > 1 for group in by_algo.values()):
        lines += ["", "| algo | runs | " + " | ".join(f"mean {c}" for c in COLUMNS) + " |",
                  "|---|---:|" + "---:|" * len(COLUMNS)]
        for algo, group in by_algo.items():
            means = [float(mean(s[c] for s in group)) if all(s[c] is not None for s in group) else None
                     for c in COLUMNS]
            lines.append(f"| {algo} | {len(group)} | " + " | ".join(_fmt(m) for m in means) + " |")
    return "\n".join(lines)


class SweepTable(Callback):
    """Hydra callback: at the end of a multirun, print the comparison table and save it as comparison.md."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = run_dirs_under([sweep_dir])
        if not runs:
            return
        from rlft.tooling.compare import compare
        png, table = compare([sweep_dir])
        (sweep_dir / "comparison.md").write_text(table + "\n")
        print(f"\n{table}\n\ncomparison table: {sweep_dir / 'comparison.md'}; figure: {png}")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
