"""The code sandbox (rlft.rewards.sandbox) and the code_tests reward on it: each escape and each cheat here
got through the old sandbox (rlimits, exit status 0 counted as a pass). Tests run under bubblewrap where
it works here and under the rlimits fallback, forced."""

import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

import rlft
from rlft.data.humaneval import humaneval_problems
from rlft.rewards import sandbox
from rlft.rewards.builtin import code_tests
from rlft.rewards.sandbox import run_python, sandbox_kind

BWRAP = sandbox._plan_for("auto").kind == "bwrap"
ROOT = os.geteuid() == 0
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap (bwrap) is not installed or cannot create "
                                                   "namespaces here (apt-get install bubblewrap)")
# Without root the fallback runs programs as the trainer's own user: nothing keeps them off its processes
needs_root = pytest.mark.skipif(not ROOT, reason="the rlimits fallback separates users only as root")


@pytest.fixture(params=[pytest.param("bwrap", marks=needs_bwrap), "rlimits"])
def kind(request, monkeypatch):
    monkeypatch.setenv("RLFT_SANDBOX", request.param)  # code_tests reads it; run_python too
    return request.param


def fallback_kind_needs_root(kind):
    if kind == "rlimits" and not ROOT:
        pytest.skip("the rlimits fallback separates users only as root")


@pytest.fixture(scope="module")
def humaneval():
    problems = humaneval_problems()
    assert len(problems) == 164
    return {p.fields["task_id"]: p for p in problems}


def score(problem, completion, timeout_s=5.0):
    return code_tests(problem.prompt, completion, problem.fields["test"], problem.fields["entry_point"],
                      sandbox_timeout_s=timeout_s, sandbox_memory_mb=512)


# ---- code_tests: right and wrong ----------------------------------------------------------------------

def test_correct_solutions_pass_and_wrong_ones_fail(kind, humaneval):
    # 32 and 38 call helpers of the prompt in their tests, 33 calls the entry point by name
    for task_id in ("HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/53"):
        problem = humaneval[task_id]
        assert score(problem, problem.answer) == 1.0, task_id
        assert score(problem, "    return None\n") == 0.0, task_id
    # the model writes on past the function: cut at the next top-level definition
    problem = humaneval["HumanEval/53"]
    assert score(problem, problem.answer + "\ndef unrelated():\n    raise SystemExit(1)\n") == 1.0


# ---- code_tests: cheats that scored 1.0 on exit status 0 ---------------------------------------------------

CHEATS = {  # completions of HumanEval/53, add(x, y), unless named
    "sys.exit before the tests": "    return 0\nimport sys\nsys.exit(0)\n",
    "sys.exit in the function": "    import sys\n    sys.exit(0)\n",
    "os._exit": "    import os\n    os._exit(0)\n",
    "SystemExit from finally": "    try:\n        return 0\n    finally:\n        raise SystemExit(0)\n",
    "atexit turns the failure into exit 0": "    import atexit, os\n    atexit.register(os._exit, 0)\n    return 0\n",
    "writes what stdin and the environment hold, exits 0":  # (no "\nprint(": the completion is cut there)
        "    return 0\nimport os, sys\nsys.stdout.write(sys.stdin.read() + open('/proc/self/environ').read())\n"
        "sys.stdout.flush()\nos._exit(0)\n",
    "an object equal to everything":
        "    class Any:\n        def __eq__(self, other):\n            return True\n    return Any()\n",
    "an int subclass equal to everything":
        "    class Int(int):\n        def __eq__(self, other):\n            return True\n    return Int(0)\n",
    "a metaclass that says its type is int":
        "    class Meta(type):\n        def __eq__(cls, other):\n            return True\n        __hash__ = type.__hash__\n"
        "    class Any(metaclass=Meta):\n        def __eq__(self, other):\n            return True\n    return Any()\n",
    "forked attempts, exit 0 when one passed":
        "    import os\n    global guess\n    if 'guess' not in globals():\n        guess = 0\n"
        "        for attempt in (1, 2):\n            pid = os.fork()\n            if pid == 0:\n"
        "                guess = attempt\n                break\n            os.waitpid(pid, 0)\n"
        "        else:\n            os._exit(0)\n    return x + y if guess == 2 else x - y\n",
}
PATCHES = {  # (task, completion): rebinding what the tests use
    "builtins.tuple patched (HumanEval/33)":
        ("HumanEval/33", "    return l\nimport builtins\nbuiltins.tuple = lambda *args: ()\n"),
    "the prompt's helper redefined (HumanEval/32)": ("HumanEval/32", "    return 0\npoly = lambda xs, x: 0\n"),
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_a_cheat_scores_zero(kind, humaneval, cheat):
    assert score(humaneval["HumanEval/53"], CHEATS[cheat]) == 0.0


@pytest.mark.parametrize("patch", PATCHES)
def test_patching_what_the_tests_use_scores_zero(kind, humaneval, patch):
    task, completion = PATCHES[patch]
    assert score(humaneval[task], completion) == 0.0


def test_a_tracer_left_running_scores_zero(humaneval):
    problem = humaneval["HumanEval/53"]
    assert score(problem, "    import sys\n    sys.settrace(lambda *a: None)\n    return x + y\n") == 0.0


# ---- run_python: escapes -----------------------------------------------------------------------------

def test_a_double_forked_child_does_not_outlive_the_call(kind):
    fallback_kind_needs_root(kind)
    marker = f"rlft-test-{uuid.uuid4().hex}"
    shared = tempfile.mkdtemp(prefix="rlft-test-")
    os.chmod(shared, 0o777)  # the fallback's user could write here, were it alive
    late = os.path.join(shared, "late")
    # the grandchild lets go of the output pipe (so the call can end) and writes 2 s later
    program = (f"import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               f"        null = os.open(os.devnull, os.O_WRONLY)\n        os.dup2(null, 1)\n        os.dup2(null, 2)\n"
               f"        os.execv(sys.executable, [sys.executable, '-c', 'import sys, time; time.sleep(2); "
               f"open(sys.argv[1], \"w\").write(\"x\")', {late!r}, {marker!r}])\n    os._exit(0)\n"
               f"os.wait()\nprint('forked')\n")
    try:
        result = run_python(program, timeout_s=3.0)
        assert result.passed and "forked" in result.output, result.output
        deadline = time.monotonic() + 1  # SIGKILL is delivered asynchronously
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _processes_with(marker)
        time.sleep(2)  # past the moment it would have written
        assert not os.path.exists(late)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_temporary_files_do_not_outlive_the_call(kind):
    fallback_kind_needs_root(kind)
    name = f"rlft-test-{uuid.uuid4().hex}"
    places = [os.path.join(d, name) for d in ("/tmp", "/var/tmp", "/dev/shm")]
    write = run_python(f"for path in {places!r}:\n    open(path, 'w').write('x')\nprint('written')\n")
    assert write.passed and "written" in write.output, write.output
    look = run_python(f"import os\nprint('seen', [p for p in {places!r} if os.path.exists(p)])\n")
    assert look.passed and "seen []" in look.output, look.output
    assert not [p for p in places if os.path.exists(p)]


def test_open_files_are_capped(kind):
    program = ("files = []\ntry:\n    for _ in range(5000):\n        files.append(open('/dev/null'))\n"
               "except OSError:\n    pass\nprint('opened', len(files))\n")
    result = run_python(program, max_open_files=32)
    assert result.passed, result.output
    assert int(result.output.split("opened")[-1]) < 32


def test_the_network_is_out_of_reach(kind):
    if not sandbox._plan_for(kind).seccomp and kind == "rlimits":
        pytest.skip("no seccomp filter on this machine: the fallback does not block sockets")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        program = ("import socket\nfor what in ('connect', 'listen'):\n    try:\n        s = socket.socket()\n"
                   f"        s.connect(('127.0.0.1', {port})) if what == 'connect' else (s.bind(('127.0.0.1', 0)), "
                   "s.listen())\n        print(what, 'worked')\n    except OSError as e:\n"
                   "        print(what, 'refused', e)\n")
        result = run_python(program)
        assert result.passed, result.output
        assert "connect refused" in result.output and "listen refused" in result.output, result.output
        with pytest.raises(BlockingIOError):
            server.accept()


@needs_bwrap
def test_the_project_and_home_directories_are_out_of_sight():
    package = os.path.dirname(rlft.__file__)
    secret = os.path.join(package, "__init__.py")
    program = (f"import os\nfor path in ({secret!r}, {package!r}, '/work', '/root', '/home', '/etc/passwd', "
               f"{sys.executable!r}):\n    try:\n        open(path).read() if os.path.isfile(path) "
               "else os.listdir(path)\n        print('visible', path)\n    except OSError:\n"
               "        print('hidden', path)\n")
    result = run_python(program, kind="bwrap")
    assert result.passed and "visible" not in result.output and result.output.count("hidden") == 7, result.output


def test_the_trainers_processes_are_out_of_reach(kind):
    fallback_kind_needs_root(kind)
    # stands in for the trainer: same user, a secret in its environment and on its command line
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "s3cret-arg"],
                              env={"PATH": "/usr/bin:/bin", "RLFT_TEST_SECRET": "s3cret-value"})
    try:
        program = (f"import os, signal\nfor part in ('environ', 'cmdline'):\n    try:\n"
                   f"        print(part, open('/proc/{victim.pid}/' + part).read())\n"
                   "    except OSError as e:\n        print(part, type(e).__name__)\n"
                   f"try:\n    os.kill({victim.pid}, signal.SIGKILL)\n    print('killed')\n"
                   "except OSError as e:\n    print('kill', type(e).__name__)\n")
        result = run_python(program)
        assert result.passed, result.output
        assert "s3cret-value" not in result.output and "killed" not in result.output, result.output
        if kind == "bwrap":  # its own PID namespace: the trainer is not there at all
            assert "s3cret-arg" not in result.output, result.output
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_a_flood_of_output_is_cut_at_the_timeout_and_bounded(kind):
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    start = time.monotonic()
    result = run_python("while True:\n    print('x' * 1000)\n", timeout_s=2.0, tail_kib=16)
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and not result.passed
    assert 0 < len(result.output) <= 16 * 1024 and result.dropped_bytes > 0
    assert elapsed < 2.0 + 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 64 * 1024


def test_the_tail_of_a_long_output_is_kept(kind):
    result = run_python("for i in range(100000):\n    print(i)\n", tail_kib=4)
    assert result.passed and result.output.splitlines()[-1] == "99999"
    assert len(result.output) <= 4096 and result.dropped_bytes > 0


def test_the_sandbox_stops_or_contains_hostile_code(kind, humaneval, tmp_path):
    problem = humaneval["HumanEval/53"]  # add(x, y)
    forever = "    while True:\n        pass\n"
    memory = "    blob = bytearray(8 * 2**30)\n    return x + y\n"
    forks = "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n"
    outside = tmp_path / "owned_by_the_trainer"
    write = f"    open({str(outside)!r}, 'w').write('x')\n    return x + y\n"
    for completion in (forever, memory, forks, write):
        assert score(problem, completion, timeout_s=2.0) == 0.0
    assert not outside.exists()
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_sandbox_program(pid)]
    assert not left  # no process of theirs is left behind


def test_the_sandbox_has_no_secrets_and_its_own_directory(kind, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    result = run_python("import os\nprint(sorted(os.environ), os.getcwd() == os.environ['HOME'])\n"
                        "assert 'WANDB_API_KEY' not in os.environ\n")
    assert result.passed and "True" in result.output and "secret" not in result.output


# ---- which sandbox, and the fallback ---------------------------------------------------------------------

@pytest.fixture
def fresh_detection(monkeypatch):
    """The probe runs again in the test, and again for the tests after it."""
    monkeypatch.delenv("RLFT_SANDBOX", raising=False)
    sandbox._detect.cache_clear()
    yield
    sandbox._detect.cache_clear()


def _sandbox_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == sandbox.__name__ and r.levelno == logging.WARNING]


def test_a_missing_bwrap_falls_back_with_one_warning(fresh_detection, monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_find_bwrap", lambda: None)
    with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
        assert sandbox_kind() == "rlimits"
        assert run_python("print('hi')").passed
        assert sandbox_kind() == "rlimits"
    warnings = _sandbox_warnings(caplog)
    assert len(warnings) == 1 and "not installed" in warnings[0] and "apt-get install bubblewrap" in warnings[0]
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        run_python("pass", kind="bwrap")


def test_a_bwrap_that_cannot_create_namespaces_falls_back_with_one_warning(fresh_detection, monkeypatch, caplog):
    folder = tempfile.mkdtemp(prefix="rlft-test-")
    os.chmod(folder, 0o755)  # the sandbox's user may run it
    fake = os.path.join(folder, "bwrap")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    os.chmod(fake, 0o755)
    monkeypatch.setattr(sandbox, "_find_bwrap", lambda: fake)
    try:
        with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
            assert sandbox_kind() == "rlimits"
            assert run_python("print('hi')").passed
        warnings = _sandbox_warnings(caplog)
        assert len(warnings) == 1 and "No permissions" in warnings[0] and "apt-get install" in warnings[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_kind_is_reported():
    assert sandbox_kind() in ("bwrap", "rlimits")
    if shutil.which("bwrap") and os.environ.get("RLFT_REQUIRE_BWRAP"):
        assert sandbox_kind() == "bwrap"  # CI installs it: a silent fallback there is a failure


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _is_sandbox_program(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"rlft-sandbox-" in f.read()
    except OSError:
        return False
