"""Collapse detection (trainer.stop_on_collapse; docs/stability.md).

A collapse, as the stability study sees it (off-policy pressure without a KL term, mostly): the policy that
was learning loses what it learned and the task reward falls towards zero, often within ten steps, and
does not come back. The watch follows the task reward of every response generated in a step (before
dynamic sampling filters groups, so a DAPO run whose groups are all wrong still counts) and fires when its
moving mean over `window` steps has fallen `drop` (a fraction) below the best moving mean of the run so far.
It is lagging by design: the leading signals the study compared (old-new KL, clip fraction, entropy,
gradient norm, routing drift) also move on runs that hold, and a stop rule that fires on a run that would
have held costs more than a few steps of a run that will not. In the study it caught all 37 collapses of
108 runs, on average 6 steps before the held-out evaluation showed them.

The state is a pure function of the per-step rewards, which every step logs (collapse/task_reward), so a
resumed run rebuilds it from its metrics and fires where a straight run does.

One leading signal did stand out in the study, early and without a stop: a mean old-new KL (train/approx_kl)
above 0.2 over the first 5 updates came before a collapse in 16 of the 18 runs that had it (and in 16 of the
37 collapses). `early_kl_warning` turns it into a console warning after the 5th update; the watch keeps
those first KLs too, so one replay of the logged rows restores both.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from rlft.tooling.metrics import APPROX_KL

TASK_REWARD = "collapse/task_reward"
COLLAPSE_WINDOW = 5  # steps in the moving mean: long enough to average out a bad batch, short enough to act
MIN_BEST = 0.05  # a run whose moving mean never got above this had nothing to lose: it never fires
EARLY_UPDATES, EARLY_KL = 5, 0.2  # the early warning: mean old-new KL of the first 5 updates above 0.2


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
        self.early_kls: list[float] = []  # the old-new KL of the first EARLY_UPDATES updates, in order

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

    def observe_update(self, approx_kl: float) -> str | None:
        """The early warning after the EARLY_UPDATES-th update (see early_kl_warning); None at every other."""
        if len(self.early_kls) >= EARLY_UPDATES:
            return None
        self.early_kls.append(approx_kl)
        return early_kl_warning(self.early_kls)

    def replay(self, rows: list[dict]) -> None:
        """The state after the logged steps `rows` (metrics.jsonl rows; eval rows and older logs skipped). A
        warning the replayed updates already gave is not given again."""
        for row in rows:
            if row.get("kind") == "eval":
                continue
            if row.get(TASK_REWARD) is not None:
                self.observe(row[TASK_REWARD])
            if row.get(APPROX_KL) is not None and len(self.early_kls) < EARLY_UPDATES:
                self.early_kls.append(row[APPROX_KL])


def early_kl_warning(approx_kls: list[float]) -> str | None:
    """After the first EARLY_UPDATES updates (their old-new KL, in order): a warning when their mean is above
    EARLY_KL, else None."""
    if len(approx_kls) != EARLY_UPDATES:
        return None
    mean = sum(approx_kls) / EARLY_UPDATES
    if not mean > EARLY_KL:
        return None
    return (f"the old-new KL (train/approx_kl) of the first {EARLY_UPDATES} updates averages {mean:.3f}, above "
            f"{EARLY_KL}: in docs/stability.md's study most runs that started like this collapsed; a KL term "
            "(algo.kl_coef), fewer algo.ppo_epochs or a lower optim.lr hold the policy closer")
