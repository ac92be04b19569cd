"""Runs untrusted Python (a model's completion) in a throwaway subprocess, never in the trainer's process.

Limits, set in the child before it starts: wall-clock timeout (the whole process group is killed), CPU
seconds, address space (memory), file size, and, when the trainer runs as root, the unprivileged user
`nobody` (so it cannot write outside its working directory, and the process limit holds; as another
user, run the trainer in a container for that). The child gets a
fresh temporary directory as cwd and HOME, an environment of PATH only (no inherited secrets), no stdin,
and Python's isolated mode (-I: no user site, no PYTHON* variables).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

NOBODY = 65534


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str        # passed | failed | timeout
    output: str        # the tail of stdout + stderr


def run_python(program: str, timeout_s: float = 10.0, memory_mb: int = 1024, max_processes: int = 16,
               max_file_mb: int = 16) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="rlft-sandbox-")
    python = _interpreter()
    drop_privileges = python is not None
    python = python or sys.executable
    try:
        path = os.path.join(workdir, "program.py")
        with open(path, "w") as f:
            f.write(program)
        if drop_privileges:
            os.chown(workdir, NOBODY, NOBODY)
            os.chown(path, NOBODY, NOBODY)

        def limit() -> None:  # in the child, before exec
            cpu = max(1, int(timeout_s) + 1)
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            memory = memory_mb * 2 ** 20
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            size = max_file_mb * 2 ** 20
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if drop_privileges:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))  # per user: nobody's

        process = subprocess.Popen([python, "-I", path], cwd=workdir, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=limit,
                                   start_new_session=True, env={"PATH": "/usr/bin:/bin", "HOME": workdir,
                                                                "TMPDIR": workdir})
        try:
            output, _ = process.communicate(timeout=timeout_s)
            status = "passed" if process.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
            output = b""
        finally:
            _kill_group(process.pid)
            process.wait()
        return SandboxResult(status == "passed", status, output.decode(errors="replace")[-2000:])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.cache
def _interpreter() -> str | None:
    """As root: a Python that `nobody` may run (this one may live in root's home; the system one then
    serves, the programs need the standard library only). None: not root, or no such interpreter, and
    the sandbox runs as this user (its other limits still hold)."""
    if os.geteuid() != 0:
        return None
    def as_nobody() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            if subprocess.run([candidate, "-I", "-c", "pass"], preexec_fn=as_nobody, cwd="/",
                              capture_output=True, timeout=30).returncode == 0:
                return candidate
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def _kill_group(pid: int) -> None:
    """Every process the program started in its session (forks included), not just the first."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
