"""Every metric's name is decided here. The trainer's rows (metrics.jsonl, the console, W&B) are built from
the typed records of a step by `step_row` and `eval_row`; the console line, `rlft compare`'s panels and
the sweep table read the names below.

Namespaces: train/ (the update), reward/ (each reward function), rollout/ (what was generated), eval/
(held-out), moe/ (mixture-of-experts routing), sync/ (weights to the engine), perf/ (time, memory, and each
phase's work against its floor at the machine's measured peaks: rlft.tooling.flops, rlft.tooling.peaks).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from rlft.tooling.flops import PHASES, PhaseWork, Roof
from rlft.types import EpisodeStats, LossSettings, Problem, ScoredGroups, Scores, SyncStats, UpdateStats

EVAL_ACCURACY = "eval/accuracy"
TRAIN_REWARD = "train/reward_mean"
TRAIN_TOKENS = "train/tokens"
STEP_SECONDS = "perf/step_seconds"
APPROX_KL = "train/approx_kl"  # old -> new policy, the update's mean (the early warning reads it too)
PHASE_SECONDS = {"generate": "perf/generate_seconds", "reference": "perf/ref_seconds",
                 "forward": "perf/forward_seconds", "backward": "perf/backward_seconds"}  # the work phases' clocks

CONSOLE_COLUMNS = [  # (metric, label, format) of the console's line per step
    (TRAIN_REWARD, "reward", "{:.3f}"),
    ("train/accuracy", "acc", "{:.3f}"),
    ("train/loss", "loss", "{:+.4f}"),
    ("train/kl_ref", "kl", "{:.4f}"),
    ("train/clip_frac", "clip", "{:.3f}"),
    ("rollout/response_len_mean", "len", "{:.2f}"),
    (STEP_SECONDS, "sec", "{:.2f}"),
]

PANELS = [  # (metric, title, from eval rows?) of `rlft compare`'s figure
    (TRAIN_REWARD, "train reward", False),
    (EVAL_ACCURACY, "held-out accuracy", True),
    ("train/kl_ref", "KL to reference", False),
    ("train/clip_frac", "clip fraction", False),
    ("rollout/response_len_mean", "response length (tokens)", False),
]


class Stopwatch:
    """Seconds per phase of a step: `with clock("ref"): ...`; `clock.total()` since it was made."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def total(self) -> float:
        return time.perf_counter() - self.started


def collected_row(step: int, groups: ScoredGroups) -> dict:
    """What every step logs about its collection, even when no group was left to learn from."""
    row = {"step": step, "rollout/sampling_rounds": groups.rounds, "rollout/dropped_groups": groups.dropped_groups,
           "rollout/groups": groups.num_groups, "rollout/staleness": groups.staleness,
           "perf/generate_seconds": groups.generate_seconds, "perf/reward_seconds": groups.reward_seconds}
    # with max_staleness k > 0: the share of sampled tokens 0..k versions old (a histogram, one key per age)
    row |= {f"staleness/tokens_{age}": share for age, share in enumerate(groups.staleness_histogram)}
    if groups.rollout is not None and groups.rollout.versions is not None:  # partial rollouts
        row |= {"rollout/stale_dropped": groups.stale_dropped, "rollout/carried_groups": groups.carried_groups,
                "rollout/passes": groups.passes}
    return row


def step_row(step: int, groups: ScoredGroups, rewards: torch.Tensor, stats: UpdateStats, sync: SyncStats,
             collect_wait_seconds: float, loss: LossSettings, lr: float, clock: Stopwatch, peak_memory_mb: float,
             work: dict[str, PhaseWork] | None = None, roofs: dict[str, Roof] | None = None) -> dict:
    """The row of a step that trained; `rewards` [N] are the ones advantages came from (KL in the reward
    included). `work`: each phase's floor work (rlft.tooling.flops), `roofs`: each phase's measured peak
    (None: never measured on this machine, so no fractions)."""
    rollout, scores = groups.rollout, groups.scores
    lengths = rollout.response_lengths.float()
    optional = {"train/kl_ref": stats.kl_ref, "train/clip_frac_low": stats.clip_frac_low,
                "train/clip_frac_high": stats.clip_frac_high, "train/ratio_mean": stats.ratio_mean,
                "train/ratio_min": stats.ratio_min, "train/ratio_max": stats.ratio_max}
    row = collected_row(step, groups) | {
        TRAIN_REWARD: rewards.mean().item(), "train/reward_std": rewards.std().item(),
        "train/accuracy": scores.correct.mean().item(),
        **{f"reward/{name}": values.mean().item() for name, values in scores.parts.items()},
        "reward/errors": scores.errors,
        "train/loss": stats.loss, "train/pg_loss": stats.pg_loss, APPROX_KL: stats.approx_kl,
        "train/entropy": stats.entropy, "train/grad_norm": stats.grad_norm, TRAIN_TOKENS: stats.tokens,
        "train/skipped_updates": stats.skipped_updates,  # not applied: a non-finite loss or gradient norm
        **{key: value for key, value in optional.items() if value is not None},
        "train/clip_frac": (stats.clip_frac_low or 0.0) + (stats.clip_frac_high or 0.0),
        "train/lr": lr, "train/eps_high": loss.eps_high,
        "rollout/response_len_mean": lengths.mean().item(), "rollout/response_len_max": lengths.max().item(),
        "rollout/truncated_frac": rollout.truncated.float().mean().item(),
        "rollout/logprob_diff_mean": stats.logprob_diff_mean, "rollout/logprob_diff_max": stats.logprob_diff_max,
        "rollout/tokens": int(rollout.response_mask.sum()),
        "sync/seconds": sync.seconds, "sync/bytes": sync.bytes,
        "perf/ref_seconds": clock.seconds.get("ref", 0.0), "perf/train_seconds": clock.seconds["train"],
        "perf/forward_seconds": stats.forward_seconds, "perf/backward_seconds": stats.backward_seconds,
        "perf/optimizer_seconds": stats.optimizer_seconds,
        "perf/collect_wait_seconds": collect_wait_seconds,  # async_steps: how long the next batch lagged
        # old log-probs come from the first epoch's forward passes: no time of their own
        "perf/generate_tokens_per_s": lengths.sum().item() / max(groups.generate_seconds, 1e-9),
        "perf/train_tokens_per_s": stats.tokens / max(clock.seconds["train"], 1e-9),
        "perf/peak_rss_mb": peak_memory_mb,  # the learner's (the largest rank's)
    }
    row |= stats.named  # offpolicy/engine_kl, offpolicy/ratio_p50, ... (rlft.algos.corrections), the objective's
    if groups.episodes is not None:
        row |= episode_metrics("episode", groups.episodes)
    if stats.routing is not None:
        r = stats.routing
        row |= {"moe/routing_drift": r.routing_drift, "moe/router_drift": r.router_drift,
                "moe/load_balance_loss": r.load_balance_loss, "moe/expert_load_cv": r.expert_load_cv,
                **{f"moe/expert_tokens/{e}": n for e, n in enumerate(r.expert_tokens)}}
    row[STEP_SECONDS] = clock.total()
    return row if work is None else row | work_row(row, work, roofs)


def work_row(row: dict, work: dict[str, PhaseWork], roofs: dict[str, Roof] | None) -> dict:
    """perf/{phase}_tflop, the work each phase did; with measured peaks, perf/{phase}_peak_fraction, its
    floor time over the time it took (1.0: as fast as the machine allows), and the step's: the floors of
    the four phases over the whole step (reward, optimizer and sync have no floor: they count as 0)."""
    out = {f"perf/{phase}_tflop": work[phase].flops / 1e12 for phase in PHASES}
    if roofs is None:
        return out
    floors = {phase: work[phase].floor_seconds(roofs[phase]) for phase in PHASES}
    out |= {f"perf/{phase}_peak_fraction": floors[phase] / row[PHASE_SECONDS[phase]] for phase in PHASES
            if floors[phase] > 0 and row[PHASE_SECONDS[phase]] > 0}
    return out | {"perf/step_floor_seconds": sum(floors.values()),
                  "perf/step_floor_fraction": sum(floors.values()) / row[STEP_SECONDS]}


def eval_row(step: int, problems: list[Problem], completions: list[str], scores: Scores,
             episodes: EpisodeStats | None = None) -> dict:
    """Greedy held-out evaluation: accuracy (reward.accuracy's full marks), the configured reward, samples
    (multi-turn: each whole episode as text)."""
    rewards = scores.total.tolist()
    row = {"step": step, "kind": "eval", EVAL_ACCURACY: scores.correct.mean().item(),
           "eval/reward_mean": scores.total.mean().item(), "eval/size": len(problems),
           "eval/samples": [{"prompt": p.prompt, "completion": c, "answer": p.answer, "reward": r}
                            for p, c, r in list(zip(problems, completions, rewards))[:4]]}
    if episodes is not None:
        row |= episode_metrics("eval/episode", episodes)
    return row


def sampled_row(k: int, scores: Scores) -> dict:
    """`rlft eval --samples k`: k sampled completions per held-out problem (adjacent in `scores`). pass@k is
    the share of problems with at least one correct (with n = k samples the unbiased estimator of Chen et
    al. 2021, arXiv 2107.03374, is exactly this)."""
    correct = scores.correct.view(-1, k)                                  # [P, k]
    return {f"eval/pass@{k}": (correct > 0).any(dim=1).float().mean().item(),
            "eval/sampled_accuracy": correct.mean().item(), "eval/sampled_reward_mean": scores.total.mean().item(),
            "eval/samples_per_problem": k}


def episode_metrics(prefix: str, e: EpisodeStats) -> dict:
    """Multi-turn episodes: turns, tool use, the tokens the environment added, why episodes ended."""
    cut = {reason: sum(c == reason for c in e.cut) / len(e.cut) for reason in ("turns", "tokens", "tool_timeout")}
    return {f"{prefix}/turns_mean": e.turns.float().mean().item(),
            f"{prefix}/tool_calls_mean": e.tool_calls.float().mean().item(),
            f"{prefix}/tool_call_rate": (e.tool_calls > 0).float().mean().item(),  # episodes with a call
            f"{prefix}/tool_errors_mean": e.tool_errors.float().mean().item(),
            f"{prefix}/answer_from_tool": e.answer_from_tool.float().mean().item(),
            f"{prefix}/observation_tokens_mean": e.observation_tokens.float().mean().item(),
            f"{prefix}/env_reward_mean": e.env_rewards.mean().item(),
            # wall clock, so under perf/ (a resumed run's rows equal a straight run's everywhere else)
            ("perf/eval_tool_seconds" if prefix.startswith("eval") else "perf/tool_seconds"): e.tool_seconds,
            **{f"{prefix}/cut_{reason}": share for reason, share in cut.items()}}
