"""`rlft compare DIR...`: one figure and one table for several runs (a multirun sweep, or run dirs).

Runs with the same label are one line: the mean over their seeds, with a band from the lowest to the
highest. The label: for runs named by their overrides (a Hydra multirun's `N_key=value,...`), the algorithm
and the overrides that differ between the runs, seeds aside; otherwise the algorithm, unless every run has the same one: then
the run's name without its seed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from rlft.config.compose import saved_options
from rlft.errors import UserError
from rlft.tooling.metrics import PANELS
from rlft.tooling.monitor import read_metrics
from rlft.tooling.sweep import format_table, run_dirs_under, run_label, summarize_run


def override_labels(run_dirs: list[Path]) -> list[str] | None:
    """Runs named by their overrides, as Hydra's multirun names them (`N_key=value,...`): the algorithm (and
    preset), then the overrides that differ between the runs (algo, experiment and seed aside), so that a sweep
    over algo x anything keeps its lines apart and folds only the seeds. None when some run is named otherwise."""
    names = [re.sub(r"^\d+_", "", d.name) for d in run_dirs]
    if not all("=" in name for name in names):
        return None
    parts = [[part for part in name.split(",") if part.split("=")[0] not in ("algo", "experiment", "seed")]
             for name in names]
    shared = set.intersection(*map(set, parts))  # the same in every run: says nothing about a line
    labels = []
    for run_dir, name, own in zip(run_dirs, names, parts):
        options = saved_options(run_dir / "config.yaml")
        named = [part.split("=", 1)[1] for part in name.split(",") if part.startswith("algo=")]
        if named:  # the name's own algorithm (a variant of a preset, say), not only the preset it composed
            options = options | {"algo": named[0]}
        labels.append(" ".join([run_label(options), *(p for p in own if p not in shared)]))
    return labels


def run_labels(run_dirs: list[Path]) -> list[str]:
    labels = override_labels(run_dirs)
    if labels is not None:
        return labels
    algos = [saved_options(d / "config.yaml").get("algo", "?") for d in run_dirs]
    if len(set(algos)) > 1:
        return algos
    # one algorithm: tell runs apart by their directory name, seeds folded together
    return [re.sub(r",?seed=\d+", "", re.sub(r"^\d+_", "", d.name)) or d.name for d in run_dirs]


def curves(run_dir: Path, metric: str, from_eval: bool) -> tuple[np.ndarray, np.ndarray]:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl")
            if (r.get("kind") == "eval") == from_eval and r.get(metric) is not None]
    return np.array([r["step"] for r in rows]), np.array([r[metric] for r in rows], dtype=float)


def plot_comparison(run_dirs: list[Path]):
    """The figure: one panel per metric, one line per label (mean over its runs, min-max band)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    by_label: dict[str, list[Path]] = defaultdict(list)
    for label, run_dir in zip(run_labels(run_dirs), run_dirs):
        by_label[label].append(run_dir)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4), squeeze=False)
    for ax, (metric, title, from_eval) in zip(axes[0], PANELS):
        for label, dirs in by_label.items():
            series = [curves(d, metric, from_eval) for d in dirs]
            series = [(s, v) for s, v in series if len(s)]
            if not series:
                continue
            steps = series[0][0][:min(len(s) for s, _ in series)]  # the steps every seed reached
            values = np.stack([v[:len(steps)] for _, v in series])
            runs = f" ({len(series)} runs)" if len(series) > 1 else ""
            (line,) = ax.plot(steps, values.mean(0), label=label + runs)
            if len(series) > 1:
                ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def compare(paths: list[Path], out: Path | None = None) -> tuple[Path, str]:
    run_dirs = run_dirs_under(paths)
    if not run_dirs:
        raise UserError(f"no run directories (with metrics.jsonl) under {' '.join(map(str, paths))}")
    if out is None:
        out = (paths[0] if len(paths) == 1 and paths[0] not in run_dirs else Path(".")) / "comparison.png"
    fig = plot_comparison(run_dirs)
    fig.savefig(out, dpi=110)
    summaries = [summarize_run(d) for d in run_dirs]
    for summary, label in zip(summaries, override_labels(run_dirs) or []):
        summary["algo"] = label  # the table's rows and means as the figure's lines
    return out, format_table(summaries)
