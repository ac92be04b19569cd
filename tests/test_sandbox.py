"""The code sandbox (rlft.rewards.sandbox) and the code_tests reward on it: each escape and each cheat here
got through the old sandbox (rlimits, exit status 0 counted as a pass). Tests run under bubblewrap where
it works here and under the rlimits fallback, forced."""

import concurrent.futures
import hashlib
import logging
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
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


def body(code):
    """A function body from code written flush left."""
    return textwrap.indent(textwrap.dedent(code).lstrip("\n"), "    ")


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


@pytest.mark.slow
def test_every_humaneval_solution_passes(kind, humaneval):
    # the solution answers the tests from a process of its own, with values copied across: none of the 164
    # passes it something else or looks at what it did to its arguments
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        scores = dict(zip(humaneval, pool.map(lambda p: score(p, p.answer, timeout_s=20.0), humaneval.values())))
    assert [task for task, value in scores.items() if value != 1.0] == []


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
    # the rest scored 1.0 while the solution shared the harness's interpreter (the harness's frames held the token)
    "the token from the harness's frame": body("""
        import os, sys
        frame = sys._getframe()
        while frame is not None and 'token' not in frame.f_locals:
            frame = frame.f_back
        os.write(1, b'\\n' + frame.f_locals['token'] + b'\\n')
        os._exit(0)
        """),
    "the token from a signal handler's frame": body("""
        import os, signal, time
        def steal(number, frame):
            while frame is not None and 'token' not in frame.f_locals:
                frame = frame.f_back
            if frame is not None:
                os.write(1, b'\\n' + frame.f_locals['token'] + b'\\n')
                os._exit(0)
        signal.signal(signal.SIGALRM, steal)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        time.sleep(0.5)
        return 0
        """),
    "a thread takes the token from sys._current_frames": body("""
        import os, sys, threading, time
        def spy():
            for frame in sys._current_frames().values():
                while frame is not None:
                    if 'token' in frame.f_locals:
                        os.write(1, b'\\n' + frame.f_locals['token'] + b'\\n')
                        os._exit(0)
                    frame = frame.f_back
        threading.Thread(target=spy).start()
        time.sleep(0.5)
        return 0
        """),
}
PATCHES = {  # (task, completion): rebinding what the tests use
    "builtins.tuple patched (HumanEval/33)":
        ("HumanEval/33", "    return l\nimport builtins\nbuiltins.tuple = lambda *args: ()\n"),
    "the prompt's helper redefined (HumanEval/32)": ("HumanEval/32", "    return 0\npoly = lambda xs, x: 0\n"),
    # these two scored 1.0: the tests import math from the solution's interpreter
    "math.fabs patched (HumanEval/32)": ("HumanEval/32", "    return 0\nimport math\nmath.fabs = lambda value: 0\n"),
    "sys.modules['math'] replaced (HumanEval/32)":
        ("HumanEval/32", "    return 0\nimport math, sys, types\nfake = types.ModuleType('math')\n"
                         "vars(fake).update(vars(math), fabs=lambda value: 0)\nsys.modules['math'] = fake\n"),
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_a_cheat_scores_zero(kind, humaneval, cheat):
    assert score(humaneval["HumanEval/53"], CHEATS[cheat]) == 0.0


@pytest.mark.parametrize("patch", PATCHES)
def test_patching_what_the_tests_use_scores_zero(kind, humaneval, patch):
    task, completion = PATCHES[patch]
    assert score(humaneval[task], completion) == 0.0


def test_a_tracer_cannot_skip_the_tests(humaneval):
    problem = humaneval["HumanEval/53"]
    skip = body("""
        import sys
        def skip(frame, event, arg):
            if frame.f_code.co_name == 'check' and event == 'line':
                frame.f_lineno = frame.f_code.co_firstlineno + 14
            return skip
        sys.settrace(skip)
        frame = sys._getframe()
        while frame.f_back is not None:
            frame = frame.f_back
            frame.f_trace = skip
        return 0
        """)
    assert score(problem, skip) == 0.0
    # the tests run in another process: a tracer the solution leaves running is no reason to fail it
    assert score(problem, "    import sys\n    sys.settrace(lambda *a: None)\n    return x + y\n") == 1.0


# ---- run_tests: the solution in a process of its own ------------------------------------------------------

def verdict(solution, test):
    return sandbox.run_tests("def f(x):\n", solution, textwrap.dedent(test), "f", timeout_s=5.0)


def test_the_tests_and_the_token_are_out_of_the_solutions_reach(kind):
    # the harness's memory, fds and environment; the program file and the solution's own memory (the tests,
    # their expected answers included, were in both)
    seen = body("""
        import os
        seen = []
        for part in ('mem', 'fd/0', 'environ'):
            try:
                open('/proc/%d/%s' % (os.getppid(), part), 'rb').read(1)
                seen.append(part)
            except OSError:
                pass
        marker, control = ''.join(['SECR', 'ETMARK']).encode(), ''.join(['CONT', 'ROLMRK']).encode()
        if marker in open(__import__('__main__').__file__, 'rb').read():
            seen.append('file')
        memory, found, controls = os.open('/proc/self/mem', os.O_RDONLY), 0, 0
        for line in open('/proc/self/maps'):
            start, end = [int(a, 16) for a in line.split()[0].split('-')]
            if 'r' in line.split()[1] and end - start < 1 << 28:
                try:
                    data = os.pread(memory, end - start, start)
                except OSError:
                    continue
                found, controls = found + data.count(marker), controls + data.count(control)
        if found > controls:  # (the marker this code builds is in memory too, as is the control)
            seen.append('memory')
        return seen
        """)
    result = verdict(seen, """
        def check(candidate):
            # SECRETMARK
            seen = candidate(1)
            print('seen', seen)
            assert seen == []
        """)
    assert result.passed and "seen []" in result.output, result.output


def test_ending_or_interrupting_the_solution_fails_even_where_the_tests_catch_everything(kind):
    catch_all = "def check(candidate):\n    try:\n        candidate(1)\n    except BaseException:\n        pass\n"
    for solution in ("    import os\n    os._exit(0)\n", "    raise KeyboardInterrupt\n", "    raise SystemExit(0)\n"):
        result = verdict(solution, catch_all)
        assert not result.passed and "harness:" in result.output, (solution, result.output)
    # a SIGINT sent to the harness does not raise in the tests (where their `except` would run)
    interrupt = body("""
        import os, signal, time
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(0.3)
        return 2
        """)
    result = verdict(interrupt, """
        def check(candidate):
            try:
                value = candidate(1)
            except BaseException:
                value = 0
            assert value == 2
        """)
    assert result.passed, result.output


def test_values_cross_exactly_and_exceptions_keep_their_builtin_class(kind):
    value = ("[x, -0.0, float('inf'), 10**5000, -2**70, 1+2j, b'\\x00\\xff', 'h\\u00e9\\ud800', (1, (2,)), "
             "{(1, 2): {'a': None}}, {1, 2}, frozenset({3}), True, 1.1]")
    solution = body(f"""
        class Negative(ValueError):
            pass
        if x < 0:
            raise Negative('negative')
        return {value}
        """)
    result = verdict(solution, f"""
        def check(candidate):
            import math
            value = candidate(5)
            assert value == {value.replace('x', '5', 1)}
            assert type(value[8]) is tuple and type(value[12]) is bool and math.copysign(1, value[1]) == -1
            try:
                candidate(x=-1)
            except ValueError as error:
                assert str(error) == 'negative'
            else:
                assert False
        """)
    assert result.passed, result.output


def test_only_builtin_values_cross_and_the_failure_says_so(kind):
    result = verdict("    return x\n", "def check(candidate):\n    assert candidate(lambda: 1) is not None\n")
    assert not result.passed and "only builtin values" in result.output, result.output
    result = verdict("    return iter([x])\n", "def check(candidate):\n    assert candidate(1)\n")
    assert not result.passed and "only builtin values" in result.output, result.output


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


def test_other_processes_memory_and_fds_are_refused(kind):
    # process_vm_readv and pidfd_getfd (the harness's memory and fds; were allowed), asked of the parent
    numbers = {"x86_64": (310, 438), "aarch64": (270, 438)}.get(platform.machine())
    if numbers is None or not sandbox._plan_for(kind).seccomp:
        pytest.skip("no seccomp filter on this machine")
    program = (f"import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfor number in {numbers}:\n"
               "    print(number, libc.syscall(number, os.getppid(), 0, 0, 0, 0, 0), ctypes.get_errno())\n")
    result = run_python(program)
    assert result.passed and result.output.split() == [str(numbers[0]), "-1", "1", "438", "-1", "1"], result.output


def test_a_program_that_is_not_valid_unicode_is_its_own_failure(kind):
    result = run_python("print('\\ud800 is fine, a lone surrogate is not: \ud800')\n")  # raised UnicodeEncodeError
    assert result.status == "failed" and "SyntaxError" in result.output, result.output


@pytest.mark.parametrize("bad", [{"timeout_s": float("nan")}, {"timeout_s": float("inf")}, {"timeout_s": 0},
                                 {"memory_mb": 0}, {"max_processes": 1.5}])
def test_bad_limits_are_refused_naming_them(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        run_python("pass", **bad)


def test_stdin_beyond_a_pipes_capacity_is_fed_as_the_program_reads(kind):
    data = os.urandom(1 << 20).hex().encode()  # 2 MiB: more than a pipe holds (was refused above 4 KiB)
    result = run_python("import hashlib, sys\nprint(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())\n", stdin=data)
    assert result.passed and hashlib.sha256(data).hexdigest() in result.output, result.output
    result = run_python("print('done')\n", stdin=data)  # one that never reads it ends as usual
    assert result.passed and "done" in result.output, result.output


def test_the_fallbacks_program_dies_with_the_trainer():
    # bwrap has --die-with-parent; the fallback's program ran on (sleeping: no CPU limit) when the trainer died
    shared = tempfile.mkdtemp(prefix="rlft-test-")
    os.chmod(shared, 0o777)  # the fallback's user writes its pid and directory here
    report = os.path.join(shared, "program")
    program = (f"import os, time\nopen({report!r}, 'w').write(f'{{os.getpid()}} {{os.getcwd()}}')\n"
               "while True:\n    time.sleep(0.1)\n")
    trainer = subprocess.Popen([sys.executable, "-c", "import sys\nfrom rlft.rewards.sandbox import run_python\n"
                                "run_python(sys.argv[1], timeout_s=60, kind='rlimits')\n", program],
                               cwd=os.path.dirname(os.path.dirname(rlft.__file__)))
    try:
        deadline = time.monotonic() + 20
        while not (os.path.exists(report) and open(report).read()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid, workdir = open(report).read().split(" ", 1)
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 2
        while _is_sandbox_program(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _is_sandbox_program(pid)
    finally:
        trainer.kill()
        trainer.wait()
        if os.path.exists(report):
            pid, workdir = open(report).read().split(" ", 1)
            if _is_sandbox_program(pid):  # the test failed: end it here
                os.kill(int(pid), signal.SIGKILL)
            shutil.rmtree(workdir, ignore_errors=True)  # its trainer could not
        shutil.rmtree(shared, ignore_errors=True)


@needs_root
def test_each_process_takes_user_ids_from_a_block_of_its_own(monkeypatch):
    # reward workers are processes: random ids drawn in each could meet (one call then killed the other's)
    plan = sandbox._plan_for("rlimits")
    if not plan.own_uids:
        pytest.skip("this system refuses user ids of the sandbox's own")
    blocks = {}
    for pid in (1000, 1001, 4194303):  # 4194303: the kernel's highest pid
        monkeypatch.setattr(os, "getpid", lambda: pid)
        blocks[pid] = [sandbox._take_uid(plan) for _ in range(sandbox.UID_SLOTS)]
        monkeypatch.undo()
        for uid in blocks[pid]:
            sandbox._release_uid(uid)
    every = [uid for uids in blocks.values() for uid in uids]
    assert len(set(every)) == len(every) and all(sandbox.UID_BASE <= uid < 2 ** 31 - 1 for uid in every)
    assert all(set(uids) == set(range(min(uids), min(uids) + sandbox.UID_SLOTS)) for uids in blocks.values())
    # a call beyond the block waits for one to be released
    taken = [sandbox._take_uid(plan) for _ in range(sandbox.UID_SLOTS)]
    late = []
    waiter = threading.Thread(target=lambda: late.append(sandbox._take_uid(plan)))
    waiter.start()
    time.sleep(0.2)
    assert not late
    sandbox._release_uid(taken[3])
    waiter.join(5)
    assert late == [taken[3]]
    for uid in taken[:3] + taken[4:] + late:
        sandbox._release_uid(uid)


def test_calls_at_once_from_threads_neither_share_nor_mix_up(kind, humaneval):
    program = ("import os, time\nopen(os.path.join(os.environ['TMPDIR'], 'mine'), 'x').write('x')\ntime.sleep(0.3)\n"
               "print(os.getuid(), os.getcwd(), os.listdir(os.environ['TMPDIR']))\n")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: run_python(program), range(8)))
    assert all(r.passed for r in results), [r.output for r in results]
    if ROOT and sandbox._plan_for(kind).own_uids:
        assert len({r.output.split()[0] for r in results}) == 8
    problem = humaneval["HumanEval/53"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(lambda i: score(problem, problem.answer if i % 2 else "    return x - y\n"), range(8)))
    assert scores == [0.0, 1.0] * 4


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
