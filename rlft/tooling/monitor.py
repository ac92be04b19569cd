"""Where metrics go: metrics.jsonl in the run directory, the console (progress bar + one line a step) and,
with logger=wandb, Weights & Biases (rlft.tooling.wandb_sink)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm import tqdm

from rlft.errors import UserError
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

    def warn(self, text: str) -> None:
        """On the console whatever logger.console says: something went wrong but the run goes on."""
        tqdm.write(f"rlft: warning: {text}", file=sys.stderr)

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
    """Drop rows logged after `last_step` (a crash after the last checkpoint), so resume appends cleanly;
    a torn last line (a crash while it was written) goes too."""
    if not path.is_file():
        return
    kept = [json.dumps(_jsonable(row)) for row in read_metrics(path, warn=True) if row["step"] <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def read_metrics(path: Path, warn: bool = False) -> list[dict]:
    """The rows of a metrics.jsonl. A torn last line (the process died while writing it) is left out (with a
    warning when `warn`); a damaged line before it is an error naming the file and line."""
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=_non_finite)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and "step" in row:
            rows.append(_numbers(row))
        elif number == len(lines):  # no newline after it: the write was cut short
            if warn:
                print(f"rlft: warning: {path}:{number}: a torn last line (the run was killed while writing it) "
                      "is dropped", file=sys.stderr)
        else:
            raise UserError(f"{path}:{number}: not a metrics row (damaged file?)")
    return rows


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _jsonable(row: dict) -> dict:
    """Non-finite numbers as the strings "nan", "inf", "-inf": valid JSON, and never mistaken for a
    missing value (null)."""
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _numbers(row: dict) -> dict:
    return {k: NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in row.items()}


def _non_finite(name: str) -> float:  # NaN / Infinity written by other tools
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]
