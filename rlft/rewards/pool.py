"""User reward functions run in worker processes, so that a function that crashes, hangs, leaks memory or
starts processes cannot take the trainer with it.

What is guaranteed:
- Each call has its own deadline, `timeout_s` from when a worker receives it (a worker's start-up and the
  first import of the function's module are not counted: they get START_TIMEOUT_S). Two guards: inside
  the worker an interval timer interrupts Python code past `timeout_s`; and the trainer kills a worker
  still busy `GRACE_S` later (a call stuck in C code ignores the timer) and starts a fresh one. Either
  way the call's outcome is a TimeoutError, reported about `timeout_s + GRACE_S` after the call started
  whatever the batch's size, while the other workers go on.
- `stop_at_first_error`: the first failure ends the batch at once; the calls in flight are killed and the
  rest are not run (Outcome.cancelled). The pool stays usable: the next run starts workers as needed.
- A worker is replaced after `max_calls` calls (a slow leak stays bounded) and after a MemoryError; its
  memory (heap and other private writable memory: RLIMIT_DATA, which, unlike the address space, does not
  count shared libraries' mappings) is capped at `memory_mb` (by default half the machine's memory shared
  among the workers), so an allocation past it is that call's MemoryError, naming the cap.
- Each worker leads its own process group (and session). Replacing a worker, and close(), kill the whole
  group: whatever a reward function started dies with it (a process that starts a session of its own,
  a daemon, escapes this). A worker whose trainer died without closing the pool kills its group too.
- A worker's result is checked there (rlft.rewards.as_reward): a value is a float or a dict of floats.
- A worker that dies or hangs while starting is not restarted within the batch (the next would likely fail
  alike): the others serve it, and with none left the calls not yet given out get that error.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import resource
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

GRACE_S = 1.0             # past timeout_s before the trainer kills the worker: the in-worker timer goes first
START_TIMEOUT_S = 120.0   # a fresh interpreter, rlft and the user's module (torch, say) on a loaded machine
MAX_CALLS = 1000          # calls a worker serves before a fresh one replaces it (bounds a slow leak)
MIN_MEMORY_MB = 2048      # a worker's memory cap is at least this (the interpreter and torch fit well in it)


def default_memory_mb(workers: int) -> int:
    """Half of this machine's memory, shared among the workers (at least MIN_MEMORY_MB each): a runaway
    reward function fails alone instead of starving the trainer into the OOM killer."""
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20
    except (ValueError, OSError):
        return MIN_MEMORY_MB
    return max(MIN_MEMORY_MB, total_mb // (2 * max(1, workers)))


@dataclass(frozen=True)
class Outcome:
    value: Any = None          # float | dict[str, float]
    error: str | None = None   # "TypeName: message" when the call raised, timed out or its worker died
    cancelled: bool = False    # not run: an earlier failure stopped the batch (error says so too)


CANCELLED = Outcome(error="Cancelled: not run, an earlier call failed", cancelled=True)


# ---- Messages between the trainer and a worker (pickled over a pipe) --------------------------------

@dataclass(frozen=True)
class _Ready:
    """The worker has started and waits for calls."""


@dataclass(frozen=True)
class _Call:
    index: int
    fn_name: str
    arguments: dict[str, Any]
    tool: bool = False     # an environment's tool (rlft.envs.tools): its exact arguments, a text result


@dataclass(frozen=True)
class _Loaded:
    """The function's module is imported: the call's own clock starts now."""
    index: int


@dataclass(frozen=True)
class _Done:
    index: int
    outcome: Outcome
    healthy: bool = True   # False: replace the worker (after a MemoryError its heap may be near the cap)


# ---- The trainer's side ------------------------------------------------------------------------------

@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    ready: bool = False
    loaded: set[str] = field(default_factory=set)  # functions already imported there
    calls: int = 0                                 # calls given to it, for recycling
    index: int | None = None                       # the call in flight
    deadline: float = float("inf")                 # of the call in flight, or of the start-up

    def kill(self) -> None:
        """The worker's whole process group (what the reward function started), then the worker."""
        _kill_group(self.process)
        self.conn.close()
        self.process.join(timeout=5)


@dataclass
class _Batch:
    fn_names: list[str]        # per call
    calls: list[dict[str, Any]]
    outcomes: list[Outcome | None]
    pending: deque[int]
    failed: bool = False
    tool: bool = False

    def finish(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        self.failed = self.failed or outcome.error is not None


class RewardPool:
    def __init__(self, workers: int, timeout_s: float, max_calls: int = MAX_CALLS, memory_mb: int | None = None):
        self.size, self.timeout_s, self.max_calls = workers, timeout_s, max_calls
        self.memory_mb = memory_mb or default_memory_mb(workers)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()  # one batch at a time (the collect-ahead thread and the trainer's)
        # spawn: no copy of the trainer's threads and locks (fork would inherit torch's)
        self._context = multiprocessing.get_context("spawn")
        # a pool dropped without close() still kills its groups: when collected, or at exit before
        # multiprocessing joins its children (exitpriority >= 0 runs first), which would wait forever
        multiprocessing.util.Finalize(self, _kill_all, args=(self._workers,), exitpriority=100)

    def run(self, fn_name: str, calls: list[dict[str, Any]], stop_at_first_error: bool = False) -> list[Outcome]:
        """fn_name (an import path) on each call's keyword arguments; the outcomes in the calls' order."""
        with self._lock:
            return self._run(_Batch([fn_name] * len(calls), calls, [None] * len(calls), deque(range(len(calls)))),
                             stop_at_first_error)

    def run_tools(self, calls: dict[int, tuple[str, dict[str, Any]]]) -> dict[int, Outcome]:
        """Tool calls {key: (import path, arguments)}: each function called with exactly its arguments, its
        result text (rlft.rewards.as_tool_output) or error in Outcome; {key: Outcome}."""
        keys = list(calls)
        with self._lock:
            outcomes = self._run(_Batch([calls[k][0] for k in keys], [calls[k][1] for k in keys], [None] * len(keys),
                                        deque(range(len(keys))), tool=True), stop_at_first_error=False)
        return dict(zip(keys, outcomes))

    def close(self) -> None:
        with self._lock:
            _kill_all(self._workers)

    def _run(self, batch: _Batch, stop_at_first_error: bool) -> list[Outcome]:
        try:
            if batch.calls:
                self._fill()
            while (batch.pending or self._busy()) and not (stop_at_first_error and batch.failed):
                self._dispatch(batch)
                self._receive(batch, timeout=self._next_deadline() - time.monotonic())
                self._expire(batch)
        finally:
            # stopped early, or interrupted: calls still in flight must not answer into the next batch
            for worker in self._busy():
                self._replace(worker, start=False)
        return [outcome or CANCELLED for outcome in batch.outcomes]

    # -- workers

    def _fill(self) -> None:
        while len(self._workers) < self.size:
            self._workers.append(self._start())

    def _start(self) -> _Worker:
        ours, theirs = self._context.Pipe()
        # not daemonic: a reward function may use multiprocessing itself
        process = self._context.Process(target=_worker_main, name="rlft-reward-worker",
                                        args=(theirs, self.timeout_s, self.memory_mb, os.getpid()))
        process.start()
        theirs.close()  # so that the worker's death reads as EOF here
        return _Worker(process, ours, deadline=time.monotonic() + START_TIMEOUT_S)

    def _replace(self, worker: _Worker, start: bool = True) -> None:
        """Kill the worker (and its group); start a fresh one in its place, or leave the place to _fill."""
        worker.kill()
        self._workers.remove(worker)
        if start:
            self._workers.append(self._start())

    def _busy(self) -> list[_Worker]:
        return [w for w in self._workers if w.index is not None]

    def _next_deadline(self) -> float:
        waiting = [w.deadline for w in self._workers if w.index is not None or not w.ready]
        return min(waiting, default=time.monotonic() + 1.0)

    # -- the loop

    def _dispatch(self, batch: _Batch) -> None:
        for worker in [w for w in self._workers if w.ready and w.index is None]:
            if not batch.pending:
                return
            index = batch.pending.popleft()
            try:
                worker.conn.send(_Call(index, batch.fn_names[index], batch.calls[index], batch.tool))
            except (OSError, EOFError):  # died while idle: the call goes to another worker
                batch.pending.appendleft(index)
                self._replace(worker)
                continue
            worker.index, worker.calls = index, worker.calls + 1
            # the first call of a function includes importing its module: the start-up's allowance
            budget = self.timeout_s + GRACE_S if batch.fn_names[index] in worker.loaded else START_TIMEOUT_S
            worker.deadline = time.monotonic() + budget

    def _receive(self, batch: _Batch, timeout: float) -> None:
        by_handle = {}
        for worker in self._workers:
            by_handle[worker.conn] = by_handle[worker.process.sentinel] = worker
        for handle in wait(list(by_handle), timeout=max(0.0, timeout)):
            worker = by_handle[handle]
            if worker in self._workers and not self._read(worker, batch):
                self._died(worker, batch)

    def _read(self, worker: _Worker, batch: _Batch) -> bool:
        """Every message the worker has sent; False when it is dead (EOF, or exited)."""
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv(), batch)
                if worker not in self._workers:  # recycled after that call
                    return True
        except (OSError, EOFError):
            return False
        return worker.process.is_alive()

    def _handle(self, worker: _Worker, message: Any, batch: _Batch) -> None:
        if isinstance(message, _Ready):
            worker.ready, worker.deadline = True, float("inf")
        elif isinstance(message, _Loaded) and message.index == worker.index:
            worker.loaded.add(batch.fn_names[message.index])
            worker.deadline = time.monotonic() + self.timeout_s + GRACE_S
        elif isinstance(message, _Done) and message.index == worker.index:
            batch.finish(message.index, message.outcome)
            worker.index, worker.deadline = None, float("inf")
            if not message.healthy or worker.calls >= self.max_calls:
                self._replace(worker)

    def _died(self, worker: _Worker, batch: _Batch) -> None:
        worker.process.join(timeout=1)
        how = _exit_description(worker.process.exitcode, self.memory_mb)
        if worker.index is not None:
            batch.finish(worker.index, Outcome(error=f"WorkerDied: the reward worker process died during the "
                                                     f"call ({how})"))
            self._replace(worker)
        elif not worker.ready:
            self._failed_to_start(worker, batch, f"WorkerDied: a reward worker died while starting ({how})")
        else:
            self._replace(worker)

    def _failed_to_start(self, worker: _Worker, batch: _Batch, error: str) -> None:
        """Not a call's fault, and a fresh worker would likely fail alike: the others serve the batch (the
        next run starts a full set again); with none left, the calls not yet given out get the error."""
        self._replace(worker, start=False)
        while not self._workers and batch.pending:
            batch.finish(batch.pending.popleft(), Outcome(error=error))

    def _expire(self, batch: _Batch) -> None:
        now = time.monotonic()
        for worker in [w for w in self._workers if w.deadline <= now]:
            if worker.conn.poll():
                continue  # answered just in time, or died: the next _receive reads it
            if worker.index is None:  # still starting
                self._failed_to_start(worker, batch, f"TimeoutError: a reward worker did not start within "
                                                     f"{START_TIMEOUT_S:g} s")
                continue
            importing = batch.fn_names[worker.index] not in worker.loaded
            batch.finish(worker.index, Outcome(
                error=f"TimeoutError: importing the function's module took more than {START_TIMEOUT_S:g} s"
                if importing else f"TimeoutError: no result within {self.timeout_s:g} s (worker killed)"))
            self._replace(worker)


def _kill_all(workers: list[_Worker]) -> None:
    while workers:
        workers.pop().kill()


def _kill_group(process: BaseProcess) -> None:
    """The worker leads its group (os.setsid); before it gets there, it has started nothing."""
    if process.pid is None:
        return
    for kill in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _exit_description(exitcode: int | None, memory_mb: int) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return (f"killed by {name}: past its memory cap ({memory_mb} MiB) or the system's OOM killer?"
                if exitcode == -signal.SIGKILL else f"killed by {name}")
    return f"exit code {exitcode}"


# ---- The worker's side --------------------------------------------------------------------------------

class _CallTimeout(BaseException):
    """A BaseException: a reward function's `except Exception` does not swallow its timeout."""


def _on_alarm(signum, frame):
    raise _CallTimeout()


def _worker_main(conn: Connection, timeout_s: float, memory_mb: int, trainer_pid: int) -> None:
    os.setsid()  # a group of its own: the trainer kills it and everything it started in one go
    _cap_memory(memory_mb)
    _die_with(trainer_pid)
    signal.signal(signal.SIGALRM, _on_alarm)
    from rlft.registry import import_function
    from rlft.rewards import resolve_reward
    resolved: dict[str, Any] = {}
    conn.send(_Ready())
    while True:
        try:
            call: _Call = conn.recv()
        except (EOFError, OSError):  # the trainer closed the pool or is gone
            return
        fn = resolved.get(call.fn_name)
        if fn is None:
            try:
                fn = resolved[call.fn_name] = (import_function(call.fn_name, "tool") if call.tool
                                               else resolve_reward(call.fn_name))
            except (Exception, SystemExit) as err:  # a MemoryError or an exit at import is the call's too
                conn.send(_failed(call.index, err, memory_mb))
                continue
            conn.send(_Loaded(call.index))
        conn.send(_timed_call(call, fn, timeout_s, memory_mb))


def _timed_call(call: _Call, fn, timeout_s: float, memory_mb: int) -> _Done:
    from rlft.rewards import as_reward, call_reward
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            value = fn(**call.arguments) if call.tool else call_reward(fn, call.arguments)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if call.tool:
            from rlft.rewards import as_tool_output
            return _Done(call.index, Outcome(value=as_tool_output(value)))
        return _Done(call.index, Outcome(value=as_reward(value)))
    except _CallTimeout:
        return _Done(call.index, Outcome(error=f"TimeoutError: no result within {timeout_s:g} s"))
    except (Exception, SystemExit) as err:  # the user's error, reported by the trainer with the sample
        return _failed(call.index, err, memory_mb)


def _failed(index: int, err: BaseException, memory_mb: int) -> _Done:
    """The call's error; after a MemoryError the worker is replaced (its heap may stay near the cap)."""
    if isinstance(err, MemoryError):
        detail = f": {err}" if str(err) else ""
        return _Done(index, Outcome(error=f"MemoryError: past the reward worker's memory cap "
                                          f"({memory_mb} MiB: half this machine's memory, shared among the workers)"
                                          f"{detail}"), healthy=False)
    return _Done(index, Outcome(error=f"{type(err).__name__}: {err}"))


def _cap_memory(memory_mb: int) -> None:
    """RLIMIT_DATA, not RLIMIT_AS: the address space counts libraries' mappings and reservations (torch
    with CUDA maps gigabytes before allocating anything); the data limit counts what the code allocates."""
    limit = memory_mb * 2 ** 20
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _die_with(trainer_pid: int) -> None:
    """A trainer killed outright (kill -9) closes nothing: a watcher thread then kills this worker's group."""
    def watch() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # the call's timer is for the main thread
        while os.getppid() == trainer_pid:
            time.sleep(1.0)
        os.killpg(0, signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="rlft-die-with-trainer").start()
