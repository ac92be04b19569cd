"""User reward functions run in worker processes, each call with a timeout, so that a function that
crashes, hangs or leaks cannot take the trainer with it.

Two guards: inside the worker an interval timer interrupts a call past `timeout_s` (Python code); and the
trainer waits at most the whole batch's time budget, after which it kills the workers (a call stuck in
C code ignores the timer) and starts fresh ones for the next batch.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

GRACE_S = 5.0  # start-up of fresh workers, and the trainer's own scheduling


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    error: str | None = None   # "TypeName: message" when the call raised or timed out


class RewardPool:
    def __init__(self, workers: int, timeout_s: float):
        self.workers, self.timeout_s = workers, timeout_s
        self._executor: ProcessPoolExecutor | None = None

    def run(self, fn_name: str, calls: list[dict[str, Any]]) -> list[Outcome]:
        """fn_name (an import path) on each call's keyword arguments, in order."""
        if self._executor is None:
            # spawn: no copy of the trainer's threads and locks (fork would inherit torch's)
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        futures = [self._executor.submit(call_in_worker, fn_name, arguments, self.timeout_s) for arguments in calls]
        deadline = time.monotonic() + self.timeout_s * math.ceil(len(calls) / self.workers) + GRACE_S
        outcomes, stuck = [], False
        for future in futures:
            try:
                outcomes.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                stuck = True
                outcomes.append(Outcome(error=f"TimeoutError: no result within {self.timeout_s:g} s"))
            except BrokenProcessPool:  # a worker died (os._exit, a segfault, the OOM killer)
                stuck = True
                outcomes.append(Outcome(error="WorkerDied: the reward worker process died during the call"))
        if stuck:
            self.close()
        return outcomes

    def close(self) -> None:
        if self._executor is not None:
            for process in list(getattr(self._executor, "_processes", {}).values()):
                process.kill()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class _CallTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _CallTimeout()


_resolved: dict[str, Any] = {}


def call_in_worker(fn_name: str, arguments: dict[str, Any], timeout_s: float) -> Outcome:
    from rlft.rewards import call_reward, resolve_reward
    try:
        fn = _resolved.get(fn_name) or _resolved.setdefault(fn_name, resolve_reward(fn_name))
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return Outcome(value=call_reward(fn, arguments))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _CallTimeout:
        return Outcome(error=f"TimeoutError: no result within {timeout_s:g} s")
    except Exception as err:  # the user's error, reported by the trainer with the sample
        return Outcome(error=f"{type(err).__name__}: {err}")
