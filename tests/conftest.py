import json
from functools import partial
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A run small enough for a test: 8 prompts x 4 responses, 50 held-out problems.
TINY_RUN = ["trainer.prompts_per_step=8", "algo.group_size=4", "data.eval_size=50", "logger.console=false"]


def run_rlft(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = os.environ | {"TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "rlft.cli", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    if check and proc.returncode != 0:
        raise AssertionError(f"rlft {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_rlft_here(capfd, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """rlft in this process, for commands that train nothing (--cfg job, --help, config errors): seconds
    faster than a fresh interpreter each. Its exit code and what reached file descriptors 1 and 2, Python's
    and C's writes alike."""
    from rlft.cli import main
    capfd.readouterr()
    code = main(list(args))
    out, err = capfd.readouterr()
    if check and code != 0:
        raise AssertionError(f"rlft {' '.join(args)} failed ({code}):\n{out}\n{err}")
    return subprocess.CompletedProcess(["rlft", *args], code, out, err)


def free_port() -> int:
    """A TCP port free now on localhost, for a torch.distributed store in a test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def rlft():
    return run_rlft


@pytest.fixture
def rlft_here(capfd):
    return partial(run_rlft_here, capfd)


def push_weights(model, engine):
    """Every parameter of `model` into `engine` by name (what a learner's push does); (bytes sent)."""
    named = [(name, p.detach()) for name, p in model.named_parameters()]
    engine.update_weights(named)
    return sum(t.numel() * t.element_size() for _, t in named)
