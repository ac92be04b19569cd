"""Collapse detection (trainer.stop_on_collapse; docs/stability.md).

A collapse, as the stability study sees it (off-policy pressure without a KL term, mostly): the policy that
was learning loses what it learned and the task reward falls towards zero, often within ten steps, and
does not come back. The watch follows the task reward of every response generated in a step (before
dynamic sampling filters groups, so a DAPO run whose groups are all wrong still counts) and fires when its
moving mean over `window` steps has fallen `drop` (a fraction) below the best moving mean of the run so far.
It is lagging by design: the leading signals the study compared (old-new KL, clip fraction, entropy,
gradient norm, routing drift) also move on runs that recover, and a stop rule that fires on a run that would
have recovered costs more than a few steps of a run that will not.

The state is a pure function of the per-step rewards, which every step logs (collapse/task_reward), so a
resumed run rebuilds it from its metrics and fires where a straight run does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

TASK_REWARD = "collapse/task_reward"
COLLAPSE_WINDOW = 5  # steps in the moving mean: long enough to average out a bad batch, short enough to act
MIN_BEST = 0.05  # a run whose moving mean never got above this had nothing to lose: it never fires


@dataclass(frozen=True)
class CollapseReading:
    task_reward: float      # this step's mean task reward over every generated response
    window_mean: float      # its mean over the last `window` steps (nan until `window` steps are in)
    best_window: float      # the highest window mean so far (nan until then)
    drop: float             # 1 - window_mean / best_window, in [0, 1] when rewards are >= 0 (0 until then)
    fired: bool             # drop >= the rule's drop, with best_window >= MIN_BEST
    onset: bool = False     # fired here and not at the step before

    def row(self) -> dict:
        """The step's collapse/ metrics (the window's only once it is full: no NaN in the logs)."""
        row = {"collapse/reward_drop": self.drop, "collapse/fired": int(self.fired)}
        if math.isfinite(self.task_reward):
            row[TASK_REWARD] = self.task_reward
        if not math.isnan(self.window_mean):
            row |= {"collapse/reward_window": self.window_mean, "collapse/reward_best_window": self.best_window}
        return row


class CollapseWatch:
    def __init__(self, window: int, drop: float):
        self.window, self.drop = window, drop
        self.recent: deque[float] = deque(maxlen=window)
        self.best = -math.inf
        self.fired = False

    def observe(self, task_reward: float) -> CollapseReading:
        """The reading after this step's mean task reward (a step without a finite one leaves the state as it
        is)."""
        if not math.isfinite(task_reward):
            return CollapseReading(task_reward, math.nan, math.nan, 0.0, False)
        self.recent.append(task_reward)
        if len(self.recent) < self.window:
            return CollapseReading(task_reward, math.nan, math.nan, 0.0, False)
        mean = sum(self.recent) / self.window
        self.best = max(self.best, mean)
        drop = 1.0 - mean / self.best if self.best > 0 else 0.0
        fired = self.best >= MIN_BEST and drop >= self.drop
        onset, self.fired = fired and not self.fired, fired
        return CollapseReading(task_reward, mean, self.best, drop, fired, onset)

    def replay(self, rows: list[dict]) -> None:
        """The state after the logged steps `rows` (metrics.jsonl rows; eval rows and older logs skipped)."""
        for row in rows:
            if row.get("kind") != "eval" and row.get(TASK_REWARD) is not None:
                self.observe(row[TASK_REWARD])
