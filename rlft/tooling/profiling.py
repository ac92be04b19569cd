"""`trainer.profile_steps` (or `rlft train --profile`): a torch.profiler trace of whole training steps.

Each profiled step writes run_dir/profile/step_NNNNNN.json (a Chrome trace: open it in Perfetto or
chrome://tracing) and step_NNNNNN.txt (the operators taking the most time, by self time). It covers this
process: with a Ray hardware option the learner and rollout actors run elsewhere, and their time shows as waiting.
"""

from __future__ import annotations

from pathlib import Path

import torch


class StepProfiler:
    def __init__(self, run_dir: Path, steps: list[int]):
        self.folder = run_dir / "profile"
        self.steps = set(steps)
        self._running: tuple[int, object] | None = None

    def start(self, step: int) -> None:
        """Called at the top of every step: ends the previous step's trace, starts this one's if asked."""
        self.stop()
        if step not in self.steps:
            return
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        prof = profile(activities=activities)
        prof.__enter__()
        self._running = (step, prof)

    def stop(self) -> None:
        if self._running is None:
            return
        step, prof = self._running
        self._running = None
        prof.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.folder / f"step_{step:06d}.json"))
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=25)
        (self.folder / f"step_{step:06d}.txt").write_text(table + "\n")
