"""Where metrics go: metrics.jsonl in the run directory, the console (progress bar + one line a step) and,
with logger=wandb, Weights & Biases (rlft.tooling.wandb_sink)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tqdm import tqdm

from rlft.tooling.metrics import CONSOLE_COLUMNS, EVAL_ACCURACY


class Monitor:
    def __init__(self, run_dir: Path, total_steps: int, start_step: int, console: bool, wandb=None):
        self.path = run_dir / "metrics.jsonl"
        self.console = console
        self.wandb = wandb
        # disable=None: no bar when stdout is not a terminal (CI logs), the step lines still print
        self.bar = tqdm(total=total_steps, initial=start_step, desc="rlft", unit="step",
                        dynamic_ncols=True, leave=False, disable=None) if console else None

    def log(self, row: dict) -> None:
        """Write one row (it carries 'step'; eval rows also carry "kind": "eval")."""
        with self.path.open("a") as f:
            f.write(json.dumps(_jsonable(row)) + "\n")
        if self.wandb is not None:
            self.wandb.log(row)
        if not self.console:
            return
        if row.get("kind") == "eval":
            self.print(f"eval step {row['step']:>4} | held-out accuracy {row[EVAL_ACCURACY]:.3f}")
            return
        self.print(format_step_line(row))
        if self.bar is not None:
            self.bar.update(1)

    def print(self, text: str) -> None:
        if self.console:
            tqdm.write(text) if self.bar is not None else print(text)

    def log_model(self, path: Path) -> None:
        if self.wandb is not None:
            self.wandb.log_model(path)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def format_step_line(row: dict) -> str:
    parts = [f"step {row['step']:>4}"]
    for key, label, fmt in CONSOLE_COLUMNS:
        if key in row:
            parts.append(f"{label} {fmt.format(row[key])}")
    return " | ".join(parts)


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows logged after `last_step` (a crash after the last checkpoint), so resume appends cleanly."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _jsonable(row: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
