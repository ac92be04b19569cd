"""A run directory holds one run. A fresh run into a directory that already holds one is refused (`resume=`
continues it), and while a run uses its directory it holds a lock there, so a second rlft process writing
into it fails at once instead of interleaving its metrics and checkpoints. The lock is the kernel's
(flock): a killed run leaves no stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rlft.errors import ConfigError

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "final_model")
LOCK_FILE = ".rlft.lock"


def check_unused(run_dir: Path) -> None:
    """A fresh run's directory holds no earlier run."""
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    if found:
        raise ConfigError(f"{run_dir} already holds a run ({', '.join(found)}): continue it with "
                          f"rlft train resume={run_dir}, or give this run another directory (hydra.run.dir=DIR)")


class RunLock:
    """Held for as long as a run uses `run_dir` (a context manager)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"{self.path.parent} is in use by another rlft run (pid {holder}); wait for it to "
                              "end, or give this run another directory (hydra.run.dir=DIR)") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
