"""Runs untrusted Python (a model's completion) in a throwaway sandbox, never in the trainer's process.

Two kinds, chosen once per process; `sandbox_kind()` says which (RLFT_SANDBOX=bwrap|rlimits forces one):

`bwrap` (bubblewrap, `apt-get install bubblewrap`): the program gets its own PID, network, IPC, UTS and
mount namespaces. It sees a read-only /usr (the interpreter and its standard library), its program
(read-only, /program), small private tmpfs mounts for its home (/sandbox), /tmp, /var/tmp and /dev/shm,
a minimal /dev and the /proc of its own PID namespace; not the project, /work, /root, /home, /etc, the
trainer's processes (their environment, signals) or any network. When its main process ends or its time
is up, the PID namespace ends and every process in it with it (double forks included).

`rlimits` (the fallback, with one warning, where bwrap is missing or cannot create namespaces here): a
new session killed as a whole, a private working directory removed afterwards, and as root a user id of
its own (below), whose every process is killed and whose files in /tmp, /var/tmp and /dev/shm are removed
after the call. The program is killed when the trainer dies (a parent-death signal; bwrap has its own).

Both kinds: a launcher sets the limits in the child before the program starts: CPU seconds, address space,
file size, open files, processes, no core files. As root, the program runs as an unprivileged user id of
its own per call (from a range no account uses, a block of it per trainer or worker process; `nobody`
where the system refuses such ids), so it cannot signal or read the trainer and its process limit is its
own. Where the machine is x86-64 or arm64, a seccomp filter refuses network sockets (all but AF_UNIX),
new namespaces (unshare, setns), io_uring, bpf, userfaultfd, perf events, keyrings, ptrace and other
processes' memory and fds (process_vm_readv/writev, pidfd_getfd). The environment is PATH, HOME and
TMPDIR; stdin is what the caller passes, written as the program reads it. Output (stdout and stderr) is
read as it comes and only its last `tail_kib` KiB are kept (the rest is counted), so a program that floods
output costs the trainer neither memory nor its time limit.

What it does not contain: kernel exploits (this is not a VM; seccomp narrows the surface only); load on
the machine within the limits (no cgroup: each program, and each at once, gets them; a tmpfs caps bytes,
not the number of empty files, which only the time limit bounds). Under `rlimits`: the program reads every
world-readable file (the project's source too), writes into world-writable directories other than the
three swept, fills the disk there (file size is capped, the number of files is not), reaches the host's
unix sockets (abstract ones included) and, where seccomp is unavailable, the network; with `nobody`
instead of an id of its own, nothing is swept and a double fork that calls setsid outlives the call; when
the trainer is not root it also runs as the trainer's user (it may signal and read the trainer's
processes). A trainer killed with SIGKILL leaves the call's working directory behind.
Tests (`run_tests`) run in a process the solution cannot reach: see HARNESS.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace

log = logging.getLogger(__name__)

NOBODY = 65534
# Per-call user ids: above systemd's container range (524288..0x6FFFFFFF), below 2**31, unused by accounts.
# Each process takes them from a block of its own, at its pid (below 2**22, the kernel's limit): the reward
# workers, processes of their own, never share one (random ids did, now and then).
UID_BASE, UID_SLOTS = 0x7B000000, 16
HOME = "/sandbox"
PROGRAM_DIR = "/program"
SWEPT = ("/tmp", "/var/tmp", "/dev/shm")
INSTALL = "apt-get install bubblewrap"


@dataclass(frozen=True)
class SandboxResult:
    passed: bool            # exit status 0 within the time (run_tests: and the harness's own report)
    status: str             # passed | failed | timeout
    output: str             # the tail of stdout + stderr
    dropped_bytes: int = 0  # output read before that tail and thrown away


@dataclass(frozen=True)
class _Plan:
    kind: str                      # bwrap | rlimits
    python: str                    # the interpreter, by the path the program sees
    bwrap: str = ""                # the bwrap binary (kind bwrap)
    as_root: bool = False          # bwrap runs as root, the launcher then changes to the sandbox user
    binds: tuple[str, ...] = ()    # read-only binds besides /usr (an interpreter living elsewhere)
    own_uids: bool = False         # as root: a user id of its own per call (else nobody)
    seccomp: bool = False          # the probe saw the seccomp filter refuse a network socket


def sandbox_kind() -> str:
    """`bwrap` or `rlimits`: the sandbox that programs run in (probed once per process)."""
    return _plan_for(None).kind


def run_python(program: str, timeout_s: float = 10.0, memory_mb: int = 1024, max_processes: int = 16,
               max_file_mb: int = 16, *, stdin: bytes = b"", max_open_files: int = 64, tail_kib: int = 16,
               kind: str | None = None) -> SandboxResult:
    """Runs `program` with `python -I` in the sandbox. `max_file_mb` also sizes each private tmpfs (bwrap).
    `stdin` is written to its stdin as it reads, then closed; `kind` forces a sandbox."""
    # checked here: a NaN or a string would otherwise fail deep inside, or as the program's own failure
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds above 0, not {timeout_s!r}")
    for name, value in (("memory_mb", memory_mb), ("max_processes", max_processes), ("max_file_mb", max_file_mb),
                        ("max_open_files", max_open_files), ("tail_kib", tail_kib)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number above 0, not {value!r}")
    limits = _Limits(timeout_s, memory_mb, max_processes, max_file_mb, max_open_files)
    return _run(_plan_for(kind), program, limits, stdin, tail_kib * 1024)


# ---- verified tests ---------------------------------------------------------------------------------

# Two processes. The harness (this program's main process) runs the tests and never runs a line of the
# solution: before it reads the token and the tests from stdin it forks a child, which runs the solution and
# answers calls through pipes, values crossing as data (builtin types only: an object whose == always holds
# cannot cross). So nothing the solution does in its interpreter (frames, gc, /proc/self/mem, tracers,
# monkeypatching builtins or the modules the tests import, exits, signal handlers, threads) reaches the
# verdict, the token or the tests' source. The harness makes itself non-dumpable first: its child, the same
# user, can then neither read nor write its memory (/proc/PID/mem, ptrace) nor open its fds (/proc/PID/fd).
# The verdict is the harness's own exit status 0 and the token as the last line.
HARNESS = r"""
import builtins, ctypes, json, os, signal, sys, traceback

_DEPTH = 100


def _rlft_encode(value, depth=0):
    # builtin values as JSON, ints and floats as strings (exact, and no limit on an int's digits)
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if depth > _DEPTH:
        raise ValueError("a value nested more than %d deep" % _DEPTH)
    if kind is int:
        return ["i", format(value, "x")]
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", [repr(value.real), repr(value.imag)]]
    if kind is bytes:
        return ["b", value.hex()]
    for tag, each in (("l", list), ("t", tuple), ("s", set), ("z", frozenset)):
        if kind is each:
            return [tag, [_rlft_encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [_rlft_encode(part, depth + 1) for pair in value.items() for part in pair]]
    raise TypeError("a %s: only builtin values (None, bool, int, float, complex, str, bytes, list, tuple, "
                    "set, frozenset, dict) cross between the tests and the solution" % kind.__name__)


def _rlft_decode(data, depth=0):
    # strict: what the solution's process sends is data of these types or nothing
    if data is None or type(data) is bool or type(data) is str:
        return data
    if depth > _DEPTH or type(data) is not list or len(data) != 2 or type(data[0]) is not str:
        raise ValueError("not a value")
    tag, body = data
    if type(body) is str:
        if tag == "i":
            return int(body, 16)
        if tag == "f":
            return float(body)
        if tag == "b":
            return bytes.fromhex(body)
    elif type(body) is list:
        if tag == "c" and len(body) == 2 and type(body[0]) is str and type(body[1]) is str:
            return complex(float(body[0]), float(body[1]))
        items = [_rlft_decode(item, depth + 1) for item in body]
        if tag == "l":
            return items
        if tag == "t":
            return tuple(items)
        if tag == "s":
            return set(items)
        if tag == "z":
            return frozenset(items)
        if tag == "d" and len(items) % 2 == 0:
            return dict(zip(items[0::2], items[1::2]))
    raise ValueError("not a value")


def _rlft_serve(solution, entry_point, calls, answers):
    # the child: from the solution's first line on, nothing in this process is trusted. Dumpable again (its
    # own /proc/self as usual): there is nothing secret in its memory, forked before the harness read stdin.
    ulong = ctypes.c_ulong
    ctypes.CDLL(None, use_errno=True).prctl(4, ulong(1), ulong(0), ulong(0), ulong(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    reader, writer = os.fdopen(calls, "rb"), os.fdopen(answers, "wb")

    def send(reply):
        try:  # its output goes ahead of the harness's
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        writer.write(json.dumps(reply).encode() + b"\n")
        writer.flush()

    try:
        namespace = {"__name__": "__main__"}
        exec(compile(solution, "solution.py", "exec", dont_inherit=True, optimize=0), namespace)
        function = namespace[entry_point]
        send("ready")
        for line in reader:
            args, kwargs = [_rlft_decode(part) for part in json.loads(line)]
            try:
                value = function(*args, **kwargs)
            except BaseException as error:
                traceback.print_exc()
                try:
                    message = str(error)[:1000]
                except BaseException:
                    message = ""
                send(["raised", [[kind.__name__ for kind in type(error).__mro__], message]])
                continue
            try:
                value = _rlft_encode(value)
            except BaseException as error:
                sys.stderr.write("harness: the solution returned %s\n" % error)
                break
            send(["value", value])
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _rlft_main(solution, entry_point):
    ulong = ctypes.c_ulong
    if ctypes.CDLL(None, use_errno=True).prctl(4, ulong(0), ulong(0), ulong(0), ulong(0)) != 0:
        sys.exit("harness: prctl(PR_SET_DUMPABLE) failed: the solution could read the harness's memory")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a KeyboardInterrupt sent by the solution: tests could catch it
    calls_read, calls_write = os.pipe()
    answers_read, answers_write = os.pipe()
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        os.close(calls_write)
        os.close(answers_read)
        _rlft_serve(solution, entry_point, calls_read, answers_write)
    os.close(calls_read)
    os.close(answers_write)
    sender, answers = os.fdopen(calls_write, "wb"), os.fdopen(answers_read, "rb")

    def leave(status, why=None, token=None):
        try:
            if why:
                sys.stderr.write("harness: %s\n" % why)
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            if token:
                os.write(1, b"\n" + token + b"\n")
        finally:
            os._exit(status)

    def answer():
        # ("value", v) or ("raised", an exception to raise in the tests). A failure here ends the run at once:
        # raised into the tests, an `except` there could swallow it.
        try:
            line = answers.readline()
            if not line:
                leave(1, "the solution's process ended")
            reply = json.loads(line)
            if reply == "ready":
                return reply, None
            kind, body = reply
            if kind == "value":
                return kind, _rlft_decode(body)
            names, message = body
            if kind == "raised" and type(names) is list and type(message) is str:
                for name in names:  # the nearest builtin class: the tests' `except ValueError` catches a subclass
                    error = getattr(builtins, name, None) if type(name) is str else None
                    if isinstance(error, type) and issubclass(error, BaseException):
                        if not issubclass(error, Exception):  # SystemExit, KeyboardInterrupt, their like
                            leave(1, "the solution raised %s" % name)
                        try:
                            return kind, error(message)
                        except Exception:
                            continue
        except BaseException as error:
            leave(1, "the solution's process sent something other than a value (%s)" % type(error).__name__)
        leave(1, "the solution's process sent something other than a value")

    def candidate(*args, **kwargs):
        try:
            sender.write(json.dumps([_rlft_encode(list(args)), _rlft_encode(kwargs)]).encode() + b"\n")
            sender.flush()
        except BaseException as error:
            leave(1, "could not call the solution: %s: %s" % (type(error).__name__, error))
        kind, value = answer()
        if kind == "raised":
            raise value
        if kind != "value":
            leave(1, "the solution's process sent something other than a value")
        return value

    try:
        token = sys.stdin.buffer.readline().strip()
        definitions, test = json.loads(sys.stdin.buffer.readline())
        if answer()[0] != "ready":
            leave(1, "the solution did not load")
        # the tests see the prompt's own definitions (its helpers), and the entry point by name (HumanEval/33)
        tests = {"__name__": "__main__"}
        exec(compile(definitions, "prompt.py", "exec", dont_inherit=True, optimize=0), tests)
        tests[entry_point] = candidate
        exec(compile(test, "test.py", "exec", dont_inherit=True, optimize=0), tests)
        tests["check"](candidate)
    except BaseException:
        traceback.print_exc()
        leave(1)
    leave(0, token=token)
"""


def run_tests(prompt: str, body: str, test: str, entry_point: str, timeout_s: float = 10.0,
              memory_mb: int = 1024, *, kind: str | None = None) -> SandboxResult:
    """Runs HumanEval-style tests (`test` defines check(candidate)) on prompt + body, and passes only when the
    harness itself reports that `check` returned: its exit status 0 AND, as the last output line, a random
    token given on stdin.

    Threat model (see HARNESS): the solution runs in a process of its own, forked before the token and the
    tests arrive, and only answers calls with builtin values; the tests run in the harness's process, which
    it cannot read, write or steer. The tests' source is never in the program file or the solution's
    memory. Rewards for behaviour the tests accept (a lookup table of their expected answers guessed or
    memorised, say) are the tests' matter."""
    token = secrets.token_hex(16)
    program = HARNESS + f"\n_rlft_main({prompt + body!r}, {entry_point!r})\n"
    secret = token.encode() + b"\n" + json.dumps([_definitions(prompt), test]).encode() + b"\n"
    result = run_python(program, timeout_s=timeout_s, memory_mb=memory_mb, stdin=secret, kind=kind)
    lines = result.output.strip().splitlines()
    reported = result.passed and bool(lines) and lines[-1].strip() == token
    status = "passed" if reported else ("timeout" if result.status == "timeout" else "failed")
    return replace(result, passed=reported, status=status)


def _definitions(prompt: str) -> str:
    """The prompt as code of its own, for the tests' helpers: as it is where it compiles (HumanEval's end in
    a docstring), else with a body added, else nothing (the tests then see the entry point only)."""
    for code in (prompt, prompt.rstrip() + "\n    pass\n"):
        try:
            compile(code, "prompt.py", "exec", dont_inherit=True)
            return code
        except (SyntaxError, ValueError):
            continue
    return ""


# ---- choosing the sandbox -----------------------------------------------------------------------------

_detect_lock = threading.Lock()


def _plan_for(kind: str | None) -> _Plan:
    kind = kind or os.environ.get("RLFT_SANDBOX") or "auto"
    if kind == "rlimits":
        with _detect_lock:
            return _rlimits_plan()
    if kind not in ("auto", "bwrap"):
        raise ValueError(f"RLFT_SANDBOX/kind must be auto, bwrap or rlimits, not {kind!r}")
    with _detect_lock:
        plan = _detect()
    if kind == "bwrap" and plan.kind != "bwrap":
        raise RuntimeError(f"the bwrap sandbox was asked for but does not work here ({INSTALL})")
    return plan


@functools.cache
def _detect() -> _Plan:
    """The first bwrap set-up that runs a probe here, else the rlimits one, with the one warning."""
    reason = "is not installed"
    bwrap = _find_bwrap()
    if bwrap:
        for plan in _bwrap_plans(bwrap):
            works, detail = _probe(plan)
            if works is not None:
                return works
            reason = f"cannot run here ({detail})"
    log.warning("code sandbox: bubblewrap (bwrap) %s, so programs run with rlimits only (no namespaces: they "
                "can read the machine's world-readable files). For the stronger sandbox: %s", reason, INSTALL)
    return _rlimits_plan()


def _find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _bwrap_plans(bwrap: str) -> list[_Plan]:
    """As root, bwrap itself as root first (no user namespace needed: Ubuntu and others restrict them),
    then as the sandbox user in a user namespace of its own (the only way when not root)."""
    python, binds = _bwrap_python()
    root = os.geteuid() == 0
    own = root and _python_for(UID_BASE) is not None
    userns = _Plan("bwrap", python, bwrap, as_root=False, binds=binds, own_uids=own)
    return [replace(userns, as_root=True), userns] if root else [userns]


def _bwrap_python() -> tuple[str, tuple[str, ...]]:
    """The system interpreter under /usr where there is one (a venv or pyenv under /work or /root would
    need those visible); else this interpreter's base installation, bound read-only."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.realpath(candidate).startswith("/usr/") and os.access(candidate, os.X_OK):
            return candidate, ()
    python = os.path.join(sys.base_prefix, "bin", os.path.basename(sys.executable) or "python3")
    return python, (os.path.realpath(sys.base_prefix),)


@functools.cache
def _rlimits_plan() -> _Plan:
    root = os.geteuid() == 0
    own = root and _python_for(UID_BASE) is not None
    python = _python_for(UID_BASE if own else NOBODY if root else None)
    plan = _Plan("rlimits", python or sys.executable, own_uids=own)
    works, _ = _probe(plan)
    return works or plan


@functools.lru_cache(maxsize=None)
def _python_for(uid: int | None) -> str | None:
    """An interpreter this user id may run (this one may live in root's home; the system one then serves,
    programs need the standard library only); None: there is none."""
    if uid is None:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            if subprocess.run([candidate, "-I", "-S", "-c", "pass"], cwd="/", capture_output=True, timeout=30,
                              **_as_user(uid)).returncode == 0:
                return candidate
        except (OSError, subprocess.SubprocessError):
            continue
    return None


PROBE = """import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    print("probe-ok")
except PermissionError:
    print("probe-ok seccomp")
"""


def _probe(plan: _Plan) -> tuple[_Plan | None, str]:
    """The plan with what the probe saw, or None and the last line of what went wrong."""
    try:
        result = _run(plan, PROBE, _Limits(30.0, 1024, 16, 16, 64), b"", 4096)
    except OSError as error:
        return None, str(error)
    lines = result.output.strip().splitlines()
    if not result.passed or not lines or not lines[-1].startswith("probe-ok"):
        return None, lines[-1] if lines else result.status
    return replace(plan, seccomp=lines[-1].endswith("seccomp")), ""


# ---- one run ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_mb: int
    max_processes: int
    max_file_mb: int
    max_open_files: int


def _run(plan: _Plan, program: str, limits: _Limits, stdin: bytes, tail_bytes: int) -> SandboxResult:
    uid = _take_uid(plan)
    try:
        workdir = tempfile.mkdtemp(prefix="rlft-sandbox-")
        try:
            path = os.path.join(workdir, "program.py")
            with open(path, "wb") as f:  # surrogatepass: a lone surrogate is the program's SyntaxError, not ours
                f.write(program.encode("utf-8", "surrogatepass"))
            if uid is not None:
                os.chown(workdir, uid, uid)
                os.chown(path, uid, uid)
            argv, cwd, env, user = _command(plan, workdir, uid, limits)
            deadline = time.monotonic() + limits.timeout_s
            process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True, **user)
            try:
                tail, dropped, timed_out = _collect(process, stdin, deadline, tail_bytes)
            finally:
                _end(process, plan, uid)
            status = "timeout" if timed_out else "passed" if process.returncode == 0 else "failed"
            return SandboxResult(status == "passed", status, tail.decode(errors="replace"), dropped)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if uid is not None and plan.own_uids and plan.kind == "rlimits":
                _sweep(uid)  # under bwrap its files were on tmpfs mounts that are gone
    finally:
        _release_uid(uid)


def _command(plan: _Plan, workdir: str, uid: int | None, limits: _Limits):
    """(argv, cwd, env, user arguments for Popen)."""
    inside = os.path.join(PROGRAM_DIR if plan.kind == "bwrap" else workdir, "program.py")
    drop = uid if plan.kind == "bwrap" and plan.as_root else None
    parent = None if plan.kind == "bwrap" else os.getpid()  # the launcher's parent: this process
    launch = [plan.python, "-I", "-S", "-c", LAUNCHER, *_launcher_args(drop, parent, limits, plan.python, inside)]
    env = {"PATH": "/usr/bin:/bin"}
    if plan.kind == "bwrap":
        argv = _bwrap_argv(plan, workdir, limits.max_file_mb * 2 ** 20) + ["--", *launch]
        return argv, "/", env, {} if plan.as_root else _as_user(uid)
    return launch, workdir, {**env, "HOME": workdir, "TMPDIR": workdir}, _as_user(uid)


def _bwrap_argv(plan: _Plan, workdir: str, tmpfs_bytes: int) -> list[str]:
    argv = [plan.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if plan.as_root:  # the launcher needs these two to become the sandbox user (which drops them); no others
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):  # merged-/usr symlinks or real dirs
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in plan.binds:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for place in (HOME, "/tmp", "/var/tmp", "/dev/shm"):
        argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", place]
    return argv + ["--ro-bind", workdir, PROGRAM_DIR, "--remount-ro", "/", "--chdir", HOME, "--clearenv",
                   "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", HOME, "--setenv", "TMPDIR", "/tmp"]


# Sets the limits, then becomes the program (exec: same process). Runs as the sandbox user, or as root
# with CAP_SETUID/CAP_SETGID only under a root bwrap. Seccomp and the parent-death signal are best effort
# (no ctypes, other arch).
LAUNCHER = r'''
import os, resource, sys
uid, parent, cpu, memory, size, processes, files, bpf, python, path = sys.argv[1:]
if uid != "-":
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
except Exception:
    libc = None
if libc is not None and parent != "-":
    # dies with the trainer (bwrap has --die-with-parent); set after the user change, which clears it
    libc.prctl(1, ulong(9), ulong(0), ulong(0), ulong(0))  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != int(parent):  # the trainer died before that
        os._exit(1)
if libc is not None and bpf != "-":
    try:
        code = ctypes.create_string_buffer(bytes.fromhex(bpf))
        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
        program = Program(len(bpf) // 16, ctypes.addressof(code))
        if libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) == 0:   # PR_SET_NO_NEW_PRIVS
            libc.prctl(22, ulong(2), ctypes.byref(program), ulong(0), ulong(0))  # PR_SET_SECCOMP, FILTER
    except Exception:
        pass
for name, value in (("CORE", 0), ("CPU", cpu), ("FSIZE", size), ("NOFILE", files), ("NPROC", processes),
                    ("AS", memory)):  # the address space last: the lines above need memory
    limit = getattr(resource, "RLIMIT_" + name)
    hard = resource.getrlimit(limit)[1]
    value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
    resource.setrlimit(limit, (value, value))
os.execv(python, [python, "-I", path])
'''


def _launcher_args(drop_to: int | None, parent: int | None, limits: _Limits, python: str,
                   path: str) -> list[str]:
    cpu = max(1, int(limits.timeout_s) + 1)
    bpf = _seccomp_filter()
    return ["-" if drop_to is None else str(drop_to), "-" if parent is None else str(parent), str(cpu),
            str(limits.memory_mb * 2 ** 20), str(limits.max_file_mb * 2 ** 20), str(limits.max_processes),
            str(limits.max_open_files), bpf.hex() if bpf else "-", python, path]


def _as_user(uid: int | None) -> dict:
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def _collect(process: subprocess.Popen, stdin: bytes, deadline: float,
             tail_bytes: int) -> tuple[bytes, int, bool]:
    """Writes stdin as the program reads it (a full pipe never blocks the caller) and reads output as it comes
    until the process ends or the deadline passes; keeps the last tail_bytes. (tail, bytes dropped, timed
    out). Does not wait for EOF: a leftover child may hold the pipe open."""
    fd, feed = process.stdout.fileno(), process.stdin.fileno()
    os.set_blocking(fd, False)
    os.set_blocking(feed, False)
    pending = memoryview(stdin)
    tail, dropped = bytearray(), 0

    def take(chunk: bytes) -> None:
        nonlocal dropped
        tail.extend(chunk)
        if len(tail) > tail_bytes:
            dropped += len(tail) - tail_bytes
            del tail[:len(tail) - tail_bytes]

    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        feeding = bool(pending)
        if feeding:
            selector.register(feed, selectors.EVENT_WRITE)
        else:
            process.stdin.close()

        def stop_feeding() -> None:
            nonlocal feeding
            if feeding:
                feeding = False
                selector.unregister(feed)
                process.stdin.close()

        after_exit = 0  # bytes read since the process ended: a leftover child may go on writing
        while True:
            left = deadline - time.monotonic()
            ended = process.poll() is not None
            if left <= 0:
                return bytes(tail), dropped, not ended
            if ended:
                stop_feeding()
            ready = {key.fd for key, _ in selector.select(0 if ended else min(left, 0.1))}
            if feeding and feed in ready:
                try:
                    pending = pending[os.write(feed, pending[:1 << 16]):]
                except BlockingIOError:
                    pass
                except OSError:  # it closed its stdin: the rest is not wanted
                    pending = pending[:0]
                if not pending:
                    stop_feeding()
            if fd in ready:
                chunk = _read(fd)
                if chunk:
                    take(chunk)
                    after_exit += len(chunk) if ended else 0
                    if after_exit < (1 << 20):
                        continue
                elif chunk == b"":  # EOF: wait for the exit within the time
                    stop_feeding()
                    try:
                        process.wait(max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        return bytes(tail), dropped, True
                    return bytes(tail), dropped, False
            if ended:  # exited, and nothing more buffered right now (or enough read since)
                return bytes(tail), dropped, False


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


def _end(process: subprocess.Popen, plan: _Plan, uid: int | None) -> None:
    """Kills what is left: bwrap's group (its namespace dies with it), the program's session, and under
    rlimits as root every process of the call's own user id (a setsid double fork left the session)."""
    _kill_group(process.pid)
    if plan.kind == "rlimits" and uid is not None and plan.own_uids:
        _kill_user(uid, plan.python)
    process.wait()
    process.stdout.close()
    if not process.stdin.closed:
        process.stdin.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_user(uid: int, python: str) -> None:
    """kill(-1) as that user: every process it owns, at once (no fork can slip between)."""
    try:
        subprocess.run([python, "-I", "-S", "-c", "import os\ntry: os.kill(-1, 9)\nexcept OSError: pass"],
                       cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=30, **_as_user(uid))
    except (OSError, subprocess.SubprocessError):
        pass


def _sweep(uid: int) -> None:
    """Removes what the call's user id left in the shared temporary directories (only it owns them)."""
    for place in SWEPT:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


_uids = threading.Condition()
_uids_in_use: set[int] = set()


def _take_uid(plan: _Plan) -> int | None:
    """None: not root (the program runs as this user). Else a user id of the call's own (a call beyond
    UID_SLOTS at once in this process waits for one), or nobody."""
    if os.geteuid() != 0:
        return None
    if not plan.own_uids:
        return NOBODY
    block = UID_BASE + os.getpid() * UID_SLOTS
    with _uids:
        while True:
            for uid in range(block, block + UID_SLOTS):
                if uid not in _uids_in_use:
                    _uids_in_use.add(uid)
                    return uid
            _uids.wait()


def _release_uid(uid: int | None) -> None:
    with _uids:
        _uids_in_use.discard(uid)
        _uids.notify()


# ---- seccomp ------------------------------------------------------------------------------------------

# (audit arch, x32 bit or 0, syscall numbers) for the machines whose numbers are written here.
_ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, dict(socket=41, clone=56, unshare=272, clone3=435, ptrace=101, bpf=321,
               userfaultfd=323, perf_event_open=298, keyctl=250, add_key=248, request_key=249,
               io_uring_setup=425, io_uring_enter=426, io_uring_register=427, process_vm_readv=310,
               process_vm_writev=311, pidfd_getfd=438, setns=308)),
    "aarch64": (0xC00000B7, 0, dict(socket=198, clone=220, unshare=97, clone3=435, ptrace=117, bpf=280,
                userfaultfd=282, perf_event_open=241, keyctl=219, add_key=217, request_key=218,
                io_uring_setup=425, io_uring_enter=426, io_uring_register=427, process_vm_readv=270,
                process_vm_writev=271, pidfd_getfd=438, setns=268)),
}
_ARCHES["amd64"], _ARCHES["arm64"] = _ARCHES["x86_64"], _ARCHES["aarch64"]
# process_vm_*, pidfd_getfd: another process's memory or fds (the test harness's; it is non-dumpable too)
_DENIED = ("unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "bpf",
           "userfaultfd", "perf_event_open", "keyctl", "add_key", "request_key", "io_uring_setup",
           "io_uring_enter", "io_uring_register")
_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_AF_UNIX, _EPERM, _ENOSYS = 1, 1, 38
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JGE, JSET, RET|K


@functools.cache
def _seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program for this machine, or None where its syscall numbers are not known."""
    arch = _ARCHES.get(platform.machine().lower())
    if arch is None:
        return None
    audit_arch, x32, nr = arch
    code = [(_LD, 0, 0, 4), (_JEQ, 1, 0, audit_arch), (_RET, 0, 0, _KILL),  # another ABI (int 0x80): killed
            (_LD, 0, 0, 0)]
    if x32:
        code += [(_JGE, 0, 1, x32), (_RET, 0, 0, _ERRNO | _EPERM)]
    for name in _DENIED:
        code += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, _ERRNO | _EPERM)]
    # clone3's flags sit behind a pointer, out of the filter's reach: ENOSYS, and libc falls back to clone
    code += [(_JEQ, 0, 1, nr["clone3"]), (_RET, 0, 0, _ERRNO | _ENOSYS)]
    code += [(_JEQ, 0, 4, nr["socket"]), (_LD, 0, 0, 16), (_JEQ, 0, 1, _AF_UNIX), (_RET, 0, 0, _ALLOW),
             (_RET, 0, 0, _ERRNO | _EPERM)]
    code += [(_JEQ, 0, 4, nr["clone"]), (_LD, 0, 0, 16), (_JSET, 0, 1, _NEW_NAMESPACES),
             (_RET, 0, 0, _ERRNO | _EPERM), (_RET, 0, 0, _ALLOW)]
    code += [(_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in code)
